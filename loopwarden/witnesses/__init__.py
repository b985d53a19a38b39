"""Witnesses: independent parties that cosign loopwarden's checkpoints (C2SP tlog-witness), the
policy that says which of them an auditor trusts (tlog-policy), and the bundled witness."""

"""The transparency log: sealed receipts (DSSE, Ed25519), the RFC 6962 Merkle tree, signed checkpoints, and the keys and secrets that sign and MAC them."""

"""Approvals: an agent asks for an approval-gated tool, an operator decides, a report uses it once; their receipt kinds."""

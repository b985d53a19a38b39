"""Turns: claimed under a lease and a fence, reported by `update`, checked by `quota`; leases renewed and expired; their receipt kinds."""

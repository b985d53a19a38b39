"""The starter policy `loopwarden policy init` writes (package data)."""

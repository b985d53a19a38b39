"""Clients: the `loopwarden` admin CLI, the end-to-end demo, and a typed agent client."""

"""The `loopwarden` command: its entry point (`entry.py`), which sends a host's hook event to its
lean handler without loading this CLI, and the admin tool (`root.py`), one module per command
group, each named for the feature it drives (`loop_commands.py`, `pool_commands.py`, …)."""

"""The hooks edge: one host hook event's bytes read by its host (`loopwarden/hosts`), the `hook`
operation run, the host's answer written (`handle.py`); and the settings `hook install` merges
into a host's file (`install.py`). docs/hooks.md."""

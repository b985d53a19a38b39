"""Clients of loopwarden: the end-to-end demo, a typed agent client, the operator's direct access
to a home, and the processes a host starts for each hook event (`hook_command.py`, and the
standard-library forwarder `hook_forward.py`)."""

"""`python -m loopwarden` is the `loopwarden` command."""

from loopwarden.clients.cli import main

main()

"""`python -m loopwarden` is the `loopwarden` command."""

from loopwarden.clients.entry import main

main()

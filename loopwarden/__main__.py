"""`python -m loopwarden` is the `loopwarden` command."""

from loopwarden.cli.entry import main

main()

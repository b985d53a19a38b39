"""`python -m hosts` (with `.ci` on the path): the real-host check on its own."""

import sys

from .check import main

sys.exit(main())

"""``python3 -m pipelines.stack names | check NAME | pythons NAME``: the stack table for the
Makefile and the set-up scripts, which run it before any venv exists (standard library only)."""
import sys

from pipelines.stack import main

sys.exit(main(sys.argv[1:]))

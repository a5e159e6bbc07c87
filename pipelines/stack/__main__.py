"""``python3 -m pipelines.stack names | check NAME | pythons NAME`` (standard library only)."""
import sys

from pipelines.stack import main

sys.exit(main(sys.argv[1:]))

"""frozen_imports: the collector paused in the block, restored after it, and the process's objects frozen once."""
import subprocess
import sys

import pytest

from tests.support.env import REPO

# Run in a child: a freeze in the test worker would keep its objects out of collection for good.
CHILD = """
import gc
from pipelines.runtime.imports import frozen_imports
{before}
start = gc.get_freeze_count()
try:
    with frozen_imports():
        during = gc.isenabled()
        made = [[i] for i in range(1000)]
        {inside}
except RuntimeError:
    pass
first = gc.get_freeze_count() - start
with frozen_imports():
    more = [[i] for i in range(1000)]
print(during, gc.isenabled(), first >= 1000, gc.get_freeze_count() - start - first)
"""


@pytest.mark.parametrize("before, inside, expected", [
    ("", "", "False True True 0"),  # paused in the block, on after it, frozen once
    ("gc.disable()", "", "False False True 0"),  # a collector off before stays off
    ("", "raise RuntimeError('an import failed')", "False True True 0"),  # restored and frozen after an error
])
def test_the_collector_is_paused_in_the_block_restored_after_it_and_objects_frozen_once(before, inside, expected):
    code = CHILD.format(before=before, inside=inside)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == expected.split()

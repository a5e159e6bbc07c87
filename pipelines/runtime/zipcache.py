"""Make PySpark's per-task ``importlib.invalidate_caches()`` cheap again on Python 3.10 and 3.11.

PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task
(``pyspark.worker_util.setup_spark_files``). On Python 3.10 and 3.11 that makes every
``zipimport.zipimporter`` in ``sys.path_importer_cache`` re-read its whole archive's directory
(CPython gh-103200, fixed in 3.12 by making the re-read lazy), and a worker imports PySpark from
``pyspark.zip`` (3 MB, one importer per package folder): a fraction of a CPU-second per task
(the timings: docs/benchmarks.md, Figures behind the code's constants; ``benchmarks/etl_bench.py``'s
"empty job" column shows the per-job remainder).

:func:`install`, called at the start of a task of ours, keeps the fix for the rest of that
worker's life (PySpark reuses workers): an archive's directory is re-read only when its size or
modification time changed since it was last read, which is what invalidation is for (a zip
replaced by ``addPyFile``). Python 3.12 and later are left as they are.
"""
from __future__ import annotations

import os
import zipimport
from typing import Dict, Optional, Tuple

from pipelines import stack

_MARK = "_pipelines_lazy"
#: whether this Python needs the patch (:func:`pipelines.stack.needs_zipcache`: CPython gh-103200 is
#: fixed in 3.12; the mission stack's Python is older, the current stack's are not)
NEEDED = stack.needs_zipcache()


def _stamp(archive: str) -> Optional[Tuple[int, int]]:
    try:
        info = os.stat(archive)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def install() -> bool:
    """Re-read a zip archive on ``importlib.invalidate_caches()`` only when it changed.

    Returns:
        True when the patch is in place (installed now or before), False on Python 3.12+
        (:data:`NEEDED`: nothing is touched there). Idempotent; safe in any process.
    """
    if not NEEDED:
        return False
    original = zipimport.zipimporter.invalidate_caches
    if getattr(original, _MARK, False):
        return True
    seen: Dict[str, Optional[Tuple[int, int]]] = {}

    def invalidate_caches(self) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and seen.get(self.archive) == stamp and self.archive in zipimport._zip_directory_cache:  # type: ignore[attr-defined]
            self._files = zipimport._zip_directory_cache[self.archive]  # type: ignore[attr-defined]
            return
        original(self)
        seen[self.archive] = stamp

    invalidate_caches.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(invalidate_caches, _MARK, True)
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    return True

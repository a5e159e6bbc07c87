"""Make PySpark's per-task ``importlib.invalidate_caches()`` cheap again on Python 3.10 and 3.11.

There it makes every zip importer re-read its archive's directory at every task start."""
from __future__ import annotations

import os
import zipimport
from typing import Dict, Optional, Tuple

from pipelines import stack

_MARK = "_pipelines_lazy"
#: whether this Python needs the patch (older than 3.12: the mission stack's)
NEEDED = stack.needs_zipcache()


def _stamp(archive: str) -> Optional[Tuple[int, int]]:
    try:
        info = os.stat(archive)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def install() -> bool:
    """Re-read a zip archive on ``importlib.invalidate_caches()`` only when it changed. Idempotent.

    Returns:
        True when the patch is in place, False on Python 3.12+ (``NEEDED``: nothing touched)."""
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

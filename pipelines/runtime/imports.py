"""Heavy imports (TensorFlow, Horovod) with the cyclic garbage collector paused, then frozen."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

_frozen = False  # True once this process froze its imports


@contextlib.contextmanager
def frozen_imports() -> Iterator[None]:
    """Import in the block with the cyclic collector paused, then move every live object to its permanent generation.

    Why: importing TensorFlow makes hundreds of thousands of objects that live as long as the
    process, and each full collection walks them all again; a tiny training rank spent 15-30 % less
    CPU (docs/benchmarks.md). Once per process: a later block only imports, since objects alive then
    (a model, say) may die in reference cycles that the permanent generation would keep forever."""
    global _frozen
    if _frozen:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()
        _frozen = True

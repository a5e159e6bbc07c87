"""pipelines.runtime.zipcache: importlib.invalidate_caches() re-reads a zip on sys.path only when it changed."""
import importlib
import os
import sys
import zipfile
import zipimport

import pytest

from pipelines.runtime import zipcache

needed = pytest.mark.skipif(not zipcache.NEEDED, reason="Python 3.12 re-reads zips lazily itself")


@pytest.mark.skipif(zipcache.NEEDED, reason="Python < 3.12 needs the patch")
def test_python_3_12_and_later_are_left_as_they_are():
    """The current stack (3.12): zipimport is not patched, CPython's own fix applies."""
    original = zipimport.zipimporter.invalidate_caches
    assert zipcache.install() is False
    assert zipimport.zipimporter.invalidate_caches is original and not hasattr(original, "_pipelines_lazy")


def _zip(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        for name, value in modules.items():
            z.writestr(f"{name}.py", f"VALUE = {value!r}\n")


@needed
def test_an_unchanged_zip_is_not_read_again_and_a_changed_one_is(tmp_path, monkeypatch):
    archive = str(tmp_path / "lib.zip")
    _zip(archive, {"zc_first": 1})
    monkeypatch.syspath_prepend(archive)
    assert importlib.import_module("zc_first").VALUE == 1
    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda a: reads.append(a) or real(a))
    current = zipimport.zipimporter.invalidate_caches  # restored after the test
    monkeypatch.setattr(zipimport.zipimporter, "invalidate_caches", getattr(current, "__wrapped__", current))
    importlib.invalidate_caches()
    assert reads == [archive]  # Python 3.10/3.11 as they are: every call re-reads the archive
    assert zipcache.install() and zipcache.install()  # idempotent
    importlib.invalidate_caches()  # the first call under the patch reads once more
    reads.clear()
    for _ in range(3):
        importlib.invalidate_caches()
    assert reads == []
    _zip(archive, {"zc_first": 1, "zc_second": 2})  # replaced, as addPyFile does: read again
    os.utime(archive, ns=(1, 1))
    importlib.invalidate_caches()
    assert reads == [archive]
    assert importlib.import_module("zc_second").VALUE == 2
    for name in ("zc_first", "zc_second"):
        sys.modules.pop(name, None)

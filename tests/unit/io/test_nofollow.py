"""Files written into an output, and folders below it, never through a planted link: the target
of every planted link keeps its bytes and its mode (pipelines/io/nofollow.py, pipelines/io/atomic.py)."""
import os
import stat

import pytest

from pipelines.io import atomic, nofollow
from pipelines.io.nofollow import LinkRefused
from pipelines.io.storage import resolve

TARGET_BYTES = b"someone else's file\n"


def victim(tmp_path, mode=0o644):
    """A file outside the output that a planted link names: ``(path, its stat)``."""
    path = tmp_path / "victim.txt"
    path.write_bytes(TARGET_BYTES)
    path.chmod(mode)
    return str(path), path.stat()


def assert_untouched(path, before):
    after = os.stat(path)
    assert open(path, "rb").read() == TARGET_BYTES
    assert (stat.S_IMODE(after.st_mode), after.st_mtime_ns) == (stat.S_IMODE(before.st_mode), before.st_mtime_ns)


def plant(kind, at, target):
    """Plant ``kind`` at ``at``: a symbolic link to ``target``, a dangling link, a hard link to
    it, a FIFO, a folder."""
    if kind == "symlink":
        os.symlink(target, at)
    elif kind == "dangling":
        os.symlink(target + ".missing", at)
    elif kind == "hardlink":
        os.link(target, at)
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        os.mkdir(at)


KINDS = ["symlink", "dangling", "hardlink", "fifo", "folder"]


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_open_write_refuses_whatever_is_planted_and_changes_nothing(tmp_path, kind, append):
    target, before = victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    at = str(out / "history.csv")
    plant(kind, at, target)
    with pytest.raises(LinkRefused, match="history.csv"):
        nofollow.open_write(at, 0o600, append=append)
    assert_untouched(target, before)
    assert not os.path.exists(target + ".missing")


def test_open_write_sets_the_mode_on_its_own_file_and_appends(tmp_path):
    path = str(tmp_path / "rank-0.log")
    with open(path, "wb") as f:
        f.write(b"old\n")
    os.chmod(path, 0o666)
    with nofollow.open_write(path, 0o600, append=True) as f:
        f.write(b"new\n")
    assert open(path, "rb").read() == b"old\nnew\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with nofollow.open_write(path, 0o644) as f:
        f.write(b"anew\n")
    assert open(path, "rb").read() == b"anew\n" and stat.S_IMODE(os.stat(path).st_mode) == 0o644


@pytest.mark.parametrize("relative", ["a", "a/b", "a/b/part.parquet"])
def test_open_regular_refuses_a_link_anywhere_below_the_root(tmp_path, relative):
    (tmp_path / "real" / "b").mkdir(parents=True)
    (tmp_path / "real" / "b" / "part.parquet").write_bytes(b"PAR1")
    root = tmp_path / "root"
    root.mkdir()
    real = {"a": tmp_path / "real", "a/b": tmp_path / "real" / "b", "a/b/part.parquet": None}[relative]
    if real is None:  # the file itself is the link
        (root / "a" / "b").mkdir(parents=True)
        os.symlink(tmp_path / "real" / "b" / "part.parquet", root / "a" / "b" / "part.parquet")
    elif relative == "a":
        os.symlink(real, root / "a")
    else:
        (root / "a").mkdir()
        os.symlink(real, root / "a" / "b")
    with pytest.raises(LinkRefused, match=f"{root}/{relative} is a symbolic link"):
        nofollow.open_regular(str(root), "a/b/part.parquet")


def test_remove_below_removes_a_link_itself_and_refuses_a_linked_folder(tmp_path):
    target, before = victim(tmp_path)
    keep = tmp_path / "keep"
    (keep / "inner").mkdir(parents=True)
    (keep / "inner" / "x").write_bytes(b"x")
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    os.symlink(target, root / "file-link")
    os.symlink(keep, root / "sub" / "folder-link")
    os.symlink(keep, root / "linked")
    assert nofollow.remove_below(str(root), "file-link") and nofollow.remove_below(str(root), "sub/folder-link")
    with pytest.raises(LinkRefused):
        nofollow.remove_below(str(root), "linked/inner")
    assert not nofollow.remove_below(str(root), "missing")
    assert_untouched(target, before)
    assert (keep / "inner" / "x").read_bytes() == b"x" and sorted(os.listdir(root)) == ["linked", "sub"]


def test_make_folder_refuses_a_link(tmp_path):
    os.symlink(tmp_path, tmp_path / "logs")
    with pytest.raises(LinkRefused, match="logs is a symbolic link"):
        nofollow.make_folder(str(tmp_path / "logs"))
    assert nofollow.make_folder(str(tmp_path / "new" / "logs")) == str(tmp_path / "new" / "logs")


def write_by_name(path):
    with atomic.replacing(path, mode=atomic.PUBLIC) as tmp, open(tmp, "w") as f:
        f.write("{}")


@pytest.mark.parametrize("write", [
    lambda path: atomic.write_json(path, {"a": 1}),
    lambda path: resolve(path).write_bytes(b"{}"),
    write_by_name,
])
def test_an_atomic_write_replaces_a_planted_link_and_never_writes_or_chmods_its_target(tmp_path, write):
    target, before = victim(tmp_path, mode=0o640)
    path = str(tmp_path / "metrics.json")
    os.symlink(target, path)
    write(path)
    assert_untouched(target, before)
    assert not os.path.islink(path) and open(path).read().startswith("{")


def test_a_temporary_file_swapped_for_a_link_while_written_is_refused(tmp_path):
    """A writer that opens the temporary file by name (Keras, matplotlib): its name swapped for a
    link before the rename is refused; the link's target is neither chmodded nor moved in."""
    target, before = victim(tmp_path)
    path = str(tmp_path / "model.keras")
    with pytest.raises(LinkRefused, match="replaced while it was written"):
        with atomic.replacing(path, mode=atomic.PUBLIC) as tmp:
            os.remove(tmp)
            os.symlink(target, tmp)
    assert_untouched(target, before)
    assert not os.path.lexists(path) and os.listdir(tmp_path) == ["victim.txt"]

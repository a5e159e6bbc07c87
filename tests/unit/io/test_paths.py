"""Local paths become file:// URLs in one place: absolute, and refused when a URL cannot carry them."""
import os
import string

import pytest

from pipelines.io.paths import UnsafePathError, check_disjoint, check_url_safe, local_url, url_breakers
from pipelines.training.data import load_dataset, open_reader
from tests.support.datagen import write_dataset
from tests.support.readers import READERS

BREAKERS = ["#", "?", "\t", "\n", "\r"]
# Every other printable ASCII character, and non-ASCII letters, marks and spaces.
SAFE = [c for c in string.printable if c not in BREAKERS + ["/", "\x0b", "\x0c"]] + ["é", "ß", "日", "\u0301",
                                                                                      "\u00a0", "\u3000", "😀"]


@pytest.mark.parametrize("ch", BREAKERS)
def test_url_breakers_are_refused_with_the_character_named(ch, tmp_path):
    assert url_breakers(f"/a/b{ch}c") == [ch]
    with pytest.raises(UnsafePathError, match=repr(ch).replace("\\", "\\\\").replace("?", r"\?")):
        check_url_safe(str(tmp_path / f"etl{ch}v2"), "--data")


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_url("data72/train") == "file://" + str(tmp_path / "data72" / "train")
    assert check_url_safe("~/x", "--data") == os.path.expanduser("~/x")


@pytest.fixture(scope="module")
def weird_root(tmp_path_factory):
    """One folder whose name holds every safe character at once."""
    name = "".join(SAFE).replace("\x00", "")
    root = tmp_path_factory.mktemp("paths") / ("etl " + name.strip())
    write_dataset(str(root), train_groups=[2], test_groups=[2])
    return str(root)


@pytest.mark.parametrize("reader", READERS)
def test_every_safe_character_reaches_the_reader(weird_root, tmp_path, capsys, reader):
    assert url_breakers(weird_root) == []
    for root in (weird_root, os.path.relpath(weird_root)):
        data = load_dataset(root, world_size=1)
        assert os.path.isabs(data.root)
        with open_reader(data, "train", 0, 1, cache_root=str(tmp_path / "cache"), reader=reader) as opened:
            batch = next(opened)
            print("inside the reader")
            assert os.listdir(tmp_path / "cache" / "rank0-train")  # the local-disk cache is in use
        assert set(batch.label.tolist()) <= {0, 1} and len(batch.label) >= 1
        # the reader's own exit deleted its cache folder, silently; our output was not silenced
        assert not os.path.exists(tmp_path / "cache" / "rank0-train")
        out = capsys.readouterr().out
        assert "inside the reader" in out and "Cache cleanup" not in out


def test_petastorm_would_misread_an_unsafe_path(tmp_path):
    """Why the refusal exists: without it, 'etl#v2' reads the sibling 'etl'."""
    from urllib.parse import urlparse
    assert urlparse("file://" + str(tmp_path / "etl#v2") + "/train").path == str(tmp_path / "etl")


@pytest.mark.parametrize("ch", ["#", "?"])
def test_the_stages_refuse_unsafe_paths_before_starting(ch, tmp_path, capsys):
    """`jobs/etl.py --output 'runs/etl#v2'` would succeed and training could not open it: both
    stages refuse such a path on the command line (exit 2), naming the character."""
    from pipelines.runtime.config import parse_config
    from pipelines.etl.config import ETLConfig
    from pipelines.training.config import TrainConfig

    for cls, argv in ((ETLConfig, ["--input", str(tmp_path), "--output", f"runs/etl{ch}v2"]),
                      (TrainConfig, ["--data", f"runs/etl{ch}v2", "--output", str(tmp_path / "out")])):
        with pytest.raises(SystemExit) as exit_info:
            parse_config(cls, argv)
        assert exit_info.value.code == 2
        assert f"contains {ch!r}" in capsys.readouterr().err


@pytest.mark.parametrize("a, b, overlap", [
    ("s3://b/in", "s3://b/in/out", True), ("s3://b/in/", "s3://b/in", True), ("s3://b/in/x", "s3://b/in", True),
    ("s3://b", "s3://b/out", True), ("s3://b/in", "s3://b/in2", False), ("s3://b/in", "s3://c/in", False),
    ("s3://b/in", "gs://b/in", False), ("s3://b/in", "/b/in", False), ("/tmp/x", "s3://tmp/x/y", False),
])
def test_uris_of_one_store_overlap_by_prefix(a, b, overlap):
    if overlap:
        with pytest.raises(ValueError):
            check_disjoint(a, b)
    else:
        check_disjoint(a, b)

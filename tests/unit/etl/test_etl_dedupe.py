"""Input trees the ETL must not be fooled by, without Spark: byte-identical files (the dedupe rule and
the plan it gives), Unicode look-alike class folders, links, FIFOs and folder links in the listing,
'..' in object keys, and formats whose Pillow plugins must never see the file."""
import hashlib
import itertools
import os
import socket
import unicodedata

import pytest
from PIL import Image

from pipelines.runtime.errors import Refused
from pipelines.etl import images
from pipelines.etl.config import ETLConfig
from pipelines.etl.dedupe import duplicates
from pipelines.etl.plan import drop_duplicates, plan
from pipelines.etl.labels import CALTECH, FOLDERS, decide_layout
from pipelines.etl.listing import (FOLDER_LINK, LINK_OUT, NOT_REGULAR, REJECTED, SKIPPED, Excluded, classify,
                                   list_files, name_exclusion)
from pipelines.etl.transform import read_object
from pipelines.io.storage import resolve
from tests.support.imagegen import EPS, PDF, encode, make_tree, write

GROUPS = [
    ("cat/b.jpg", 0, "cat", "h1"), ("cat/a.jpg", 0, "cat", "h1"), ("cat/deep/a.jpg", 0, "cat", "h1"),
    ("dog/a.jpg", 1, "dog", "h2"), ("cat/z.jpg", 0, "cat", "h2"),
    ("dog/only.jpg", 1, "dog", "h3"),
]


def test_each_hash_group_keeps_its_smallest_path_and_names_it_in_every_other_copys_reason():
    assert duplicates(GROUPS) == {
        "cat/b.jpg": "duplicate: same bytes as cat/a.jpg",
        "cat/deep/a.jpg": "duplicate: same bytes as cat/a.jpg",
        "dog/a.jpg": "label conflict: same bytes as cat/z.jpg in class cat",  # the kept file's class wins
    }


def test_the_dedupe_rule_does_not_depend_on_the_input_order():
    first = duplicates(GROUPS)
    for order in itertools.permutations(GROUPS):
        assert duplicates(order) == first
    assert duplicates([g for g in GROUPS if g[3] == "h3"]) == {}
    # code-point order, so upper case (0x41..) sorts before lower case and digits before both
    assert duplicates([("c/b.jpg", 0, "c", "h"), ("c/B.jpg", 0, "c", "h"), ("c/1.jpg", 0, "c", "h")]) == {
        "c/b.jpg": "duplicate: same bytes as c/1.jpg", "c/B.jpg": "duplicate: same bytes as c/1.jpg"}


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_the_plan_keeps_one_file_per_content_and_each_content_in_one_split(tmp_path):
    """Real files, hashed as the Spark pass does (sha256 of the bytes): 3 copies of each of 6
    photos in one class and 2 copies across classes; the kept ones are split again."""
    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=6, bad=False)
    for i in range(6):
        original = os.path.join(root, "001.class0", f"{i:04d}.{'JPEG' if i == 0 else 'jpg'}")
        for copy in ("copy-a", "copy-b"):
            with open(original, "rb") as f:
                write(os.path.join(root, "001.class0", copy, f"{i}.jpg"), f.read())
    with open(os.path.join(root, "001.class0", "0003.jpg"), "rb") as f:
        write(os.path.join(root, "002.class1", "moved.jpg"), f.read())
    config = ETLConfig(input=root, output=str(tmp_path / "out"), image_size=8, min_row_groups=1,
                       test_fraction=0.2, validation_fraction=0.2)
    before = plan(config)
    hashes = {c.path: sha256_of(c.path) for c in before.candidates}
    after = drop_duplicates(config, before, hashes.items())
    kept = {c.path: c for c in after.candidates}
    assert len(before.candidates) == 25 and len(kept) == 12
    assert len({hashes[p] for p in kept}) == 12  # one file per content, every content kept
    rel = {f.path: f.relative_path for f in after.files}
    rejected = {rel[p]: o.reason for p, o in after.outcomes.items() if isinstance(o, Excluded) and o.status == REJECTED}
    assert rejected["001.class0/copy-a/3.jpg"] == "duplicate: same bytes as 001.class0/0003.jpg"
    assert rejected["002.class1/moved.jpg"] == "label conflict: same bytes as 001.class0/0003.jpg in class class0"
    assert len(rejected) == 13 and len(after.files) == len(kept) + len(rejected)
    assert all(rel[p].startswith("001.class0/0") or rel[p].startswith("002.class1/0") for p in kept)
    assert after.expected_rows == {"train": 8, "validation": 2, "test": 2}  # 6 per class: 4, 1, 1
    assert drop_duplicates(config, plan(config), hashes.items()).candidates == after.candidates  # deterministic
    assert drop_duplicates(config, before, []) is before  # nothing hashed: nothing changes


NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


@pytest.mark.parametrize("folders", [[NFC, NFD], [NFD, NFC], [f"001.{NFC}", f"002.{NFD}"],
                                     [f"002.{NFD}", f"001.{NFC}"], ["dog", f"{NFD}", f"{NFC}"]])
def test_class_folders_with_one_name_in_two_unicode_spellings_are_refused(folders):
    assert NFC != NFD
    with pytest.raises(Refused) as info:
        decide_layout(folders)
    message = str(info.value)
    assert "same name in Unicode" in message and "caf\\xe9" in message and "cafe\\u0301" in message


def test_one_spelling_alone_is_one_class_named_as_on_disk():
    assert decide_layout([NFD, "dog"]).folders[NFD].name == NFD
    layout = decide_layout([f"001.{NFD}", "002.dog"])
    assert layout.kind == CALTECH and layout.classes == {0: NFD, 1: "dog"}
    assert decide_layout([NFC, "cafe"]).kind == FOLDERS  # no accent is another name


def test_look_alike_folders_on_disk_stop_the_plan_before_spark(tmp_path):
    root = tmp_path / "tree"
    for name in (f"001.{NFC}", f"002.{NFD}"):
        write(str(root / name / "x.jpg"), encode(Image.new("RGB", (8, 8))))
    with pytest.raises(Refused, match="same name in Unicode"):
        plan(ETLConfig(input=str(root), output=str(tmp_path / "out"), image_size=8))


def test_links_fifos_and_folder_links_are_listed_unread(tmp_path, monkeypatch):
    """The listing never opens them (a FIFO would block); what they become is classify's rule."""
    root = tmp_path / "tree"
    write(str(root / "cat" / "a.jpg"), b"a")
    write(str(root / "_pool" / "p.jpg"), b"p")
    write(str(tmp_path / "outside.jpg"), b"o")
    os.symlink(tmp_path / "outside.jpg", root / "cat" / "out.jpg")
    os.symlink("../../outside.jpg", root / "cat" / "relative-out.jpg")
    os.symlink(root / "cat" / "a.jpg", root / "cat" / "in.jpg")
    os.symlink("../_pool/p.jpg", root / "cat" / "pooled.jpg")
    os.symlink(root / "cat", root / "cat" / "loop")
    os.symlink(tmp_path, root / "linked-class")
    os.mkfifo(root / "cat" / "pipe.jpg")
    os.mkfifo(root / "cat" / "pipe.txt")
    os.symlink("/dev/null", root / "cat" / "null.jpg")  # a device, through a link
    server = socket.socket(socket.AF_UNIX)
    monkeypatch.chdir(root / "cat")
    server.bind("socket.jpg")  # relative: a socket's path is limited to 107 bytes
    try:
        listed = {f.relative_path: f for f in list_files(str(root))}
    finally:
        server.close()
    assert {rel: f.unread for rel, f in listed.items()} == {
        "cat/null.jpg": NOT_REGULAR, "cat/socket.jpg": NOT_REGULAR,
        "_pool/p.jpg": None, "cat/a.jpg": None, "cat/in.jpg": None, "cat/pooled.jpg": None,
        "cat/out.jpg": LINK_OUT, "cat/relative-out.jpg": LINK_OUT, "cat/loop": FOLDER_LINK,
        "linked-class": FOLDER_LINK, "cat/pipe.jpg": NOT_REGULAR, "cat/pipe.txt": NOT_REGULAR}
    assert (listed["cat/in.jpg"].size_bytes, listed["cat/out.jpg"].size_bytes) == (1, 1)
    layout = decide_layout(["cat"])
    fate = {rel: classify(rel, f.size_bytes, 100, layout, unread=f.unread) for rel, f in listed.items()}
    assert fate["cat/in.jpg"] == fate["cat/pooled.jpg"] == layout.folders["cat"]  # links into the tree: followed
    for rel, reason in (("cat/out.jpg", LINK_OUT), ("cat/pipe.jpg", NOT_REGULAR), ("cat/loop", FOLDER_LINK),
                        ("linked-class", FOLDER_LINK)):
        assert fate[rel] == Excluded(REJECTED, reason), rel
    assert fate["cat/pipe.txt"].status == SKIPPED  # not an image name: no input, whatever it is


@pytest.mark.parametrize("key", ["cat/../x.jpg", "cat/../../secret/x.jpg", "cat/sub/../../x.jpg", "cat/x/../y.jpg"])
def test_object_keys_with_dot_dot_segments_are_rejected_unread(key, tmp_path):
    excluded = name_exclusion(key)
    assert excluded.status == REJECTED and "'..' path segment" in excluded.reason
    assert name_exclusion(key[:-len(".jpg")] + ".txt").status == REJECTED  # whatever its extension
    assert classify(key, 10, 100, decide_layout(["cat"])).status == REJECTED  # not hidden, for its '..'
    source = resolve(str(tmp_path / "in"))
    write(str(tmp_path / "x.jpg"), b"outside the input")
    with pytest.raises(images.ImageRejected, match="'..' path segment"):
        read_object(source, f"{source.uri}/{key}", 100)


def test_names_that_only_contain_dots_are_not_dot_dot_segments():
    assert name_exclusion("cat/x..jpg") is None and name_exclusion("cat/a..b/x.jpg") is None
    assert name_exclusion("cat/..x.jpg").reason.startswith("hidden name")  # a dot name, hidden as Spark's


PSD = b"8BPS\x00\x01" + bytes(6) + b"\x00\x03\x00\x00\x00\x08\x00\x00\x00\x08\x00\x08\x00\x03" + bytes(64)


@pytest.mark.parametrize("data, seen", [
    (PSD, "a Photoshop document (PSD)"), (EPS, "EPS"), (PDF, "a PDF document"),
    (b"%!PS-Adobe-3.0\nshowpage\n", "PostScript"),
    (encode(Image.new("RGB", (8, 8)), "PPM"), "a Netpbm image (PBM/PGM/PPM)"),
    (encode(Image.new("RGB", (8, 8)), "PCX"), "a PCX image"),
    (encode(Image.new("RGB", (8, 8)), "ICO"), "an icon (ICO)"),
    (encode(Image.new("RGB", (8, 8)), "SGI"), "an SGI image"),
    (encode(Image.new("RGB", (8, 8)), "TGA"), "Pillow cannot identify it"),  # TGA has no magic number
])
def test_formats_the_etl_does_not_accept_are_rejected_without_their_plugin_parsing_them(data, seen, monkeypatch):
    """Every Pillow opener outside ACCEPTED_FORMATS is replaced by one that records its call: none
    is called, for the decode nor for the reason."""
    Image.init()
    called = []

    def opener(name):
        def accept(prefix):
            called.append(name)
            return True

        def factory(fp, filename=None):
            called.append(name)
            raise SyntaxError("must not be parsed")
        return factory, accept

    for name in [f for f in Image.OPEN if f not in images.ACCEPTED_FORMATS]:
        monkeypatch.setitem(Image.OPEN, name, opener(name))
    with pytest.raises(images.ImageRejected) as info:
        images.decode_and_fit(data, 8)
    assert info.value.reason.startswith(f"not a supported raster image ({seen}; accepted: JPEG, PNG")
    assert called == []
    assert len(Image.OPEN) - len(images.ACCEPTED_FORMATS) > 20  # what the restriction keeps out


def test_the_hash_pass_gives_each_readable_candidates_sha256_and_none_for_the_others(tmp_path, monkeypatch):
    """hash_chunks as a Spark task runs it, on chunk numbers; a file replaced by a FIFO since the
    listing gets no hash (and does not block): the main pass records why. The hashes travel in
    the task's file below the run's prefix, the task returns one row naming it."""
    import pyarrow as pa

    from pipelines.etl import transform
    from pipelines.etl.outcomes import read_hashes, read_rows
    from pipelines.etl.transform import Candidate, hash_chunks
    from pipelines.io.storage import resolve
    monkeypatch.setattr(transform.zipcache, "install", lambda: True)  # leave this process's importer alone
    paths = [write(str(tmp_path / f"{i}.jpg"), bytes([i]) * (100 + i)) for i in range(3)]
    paths.append(str(tmp_path / "pipe.jpg"))
    os.mkfifo(paths[-1])
    chunks = [[tuple(Candidate(p, 0, "c", "train")) for p in paths[:2]], [tuple(Candidate(p, 0, "c", "train"))
                                                                        for p in paths[2:]]]
    run = resolve(str(tmp_path / "run"))
    (batch,) = hash_chunks(iter([pa.RecordBatch.from_pydict({"id": [1, 0]})]), chunks, run, max_file_bytes=1000)
    (task,) = batch.to_pylist()
    assert task == {"rows_file": "_tasks/hashes-00000-0.arrow", "chunks": [1, 0], "files": [], "rows": 4}
    assert {r["path"]: r["sha256"] for r in read_rows(run, task)} == {**{p: sha256_of(p) for p in paths[:3]},
                                                                      paths[3]: None}
    assert dict(read_hashes(run, [task])) == {p: sha256_of(p) for p in paths[:3]}
    assert not run.join("_tasks").exists()  # read once, then deleted
    (small,) = hash_chunks(iter([pa.RecordBatch.from_pydict({"id": [0]})]), chunks, run, max_file_bytes=100)
    rows = list(read_rows(run, small.to_pylist()[0]))
    assert [r["sha256"] for r in rows] == [sha256_of(paths[0]), None]  # 101 bytes > --max-file-mb


def test_the_duplicate_check_is_on_by_default_and_can_be_turned_off(tmp_path):
    from pipelines.runtime.config import parse_config
    base = ["--input", str(tmp_path), "--output", str(tmp_path.parent / "out")]
    assert parse_config(ETLConfig, base).dedupe is True
    assert parse_config(ETLConfig, base + ["--no-dedupe"]).dedupe is False

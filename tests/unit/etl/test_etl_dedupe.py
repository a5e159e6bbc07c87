"""Input trees the ETL must not be fooled by, without Spark: byte-identical files (the dedupe rule and
the plan it gives), Unicode look-alike class folders, links, FIFOs and folder links in the listing,
'..' in object keys, and formats whose Pillow plugins must never see the file."""
import hashlib
import io
import itertools
import os
import socket
import unicodedata

import numpy as np
import pytest
from PIL import Image

from pipelines.runtime.errors import Refused
from pipelines.etl import images
from pipelines.etl.config import ETLConfig
from pipelines.etl.dedupe import LOOK_ALIKE_DISTANCE, Hashed, duplicates, look_alikes
from pipelines.etl.plan import drop_duplicates, plan
from pipelines.etl.labels import CALTECH, FOLDERS, decide_layout
from pipelines.etl.listing import (FOLDER_LINK, LINK_OUT, NOT_REGULAR, REJECTED, SKIPPED, Excluded, classify,
                                   list_files, name_exclusion)
from pipelines.etl.transform import read_object
from pipelines.io.storage import resolve
from tests.support.imagegen import EPS, PDF, encode, make_tree, scene, write

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
    unchanged = drop_duplicates(config, before, [])  # nothing hashed: nothing changes, no look-alike
    assert unchanged.candidates is before.candidates and unchanged.outcomes is before.outcomes
    assert unchanged.look_alikes == ([], 0)


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
    # bytes that are no image: no pixels, no difference hash (the main pass rejects them)
    assert {p: tuple(rest) for p, *rest in read_hashes(run, [task])} == {p: (sha256_of(p), None, None)
                                                                         for p in paths[:3]}
    assert not run.join("_tasks").exists()  # read once, then deleted
    (small,) = hash_chunks(iter([pa.RecordBatch.from_pydict({"id": [0]})]), chunks, run, max_file_bytes=100)
    rows = list(read_rows(run, small.to_pylist()[0]))
    assert [r["sha256"] for r in rows] == [sha256_of(paths[0]), None]  # 101 bytes > --max-file-mb


def test_the_duplicate_check_is_on_by_default_and_can_be_turned_off(tmp_path):
    from pipelines.runtime.config import parse_config
    base = ["--input", str(tmp_path), "--output", str(tmp_path.parent / "out")]
    assert parse_config(ETLConfig, base).dedupe is True
    assert parse_config(ETLConfig, base + ["--no-dedupe"]).dedupe is False


def copies_of_one_photo(seed: int = 1) -> dict:
    """One photo (JPEG, quality 90) and its copies with other bytes: the kind of fault the
    duplicate check must see through (the same pixels) and the look-alikes it must report."""
    from tests.support.imagegen import jpeg_with_segment, scene

    img = scene(seed)
    jpeg = encode(img, "JPEG", quality=90)
    decoded = Image.open(io.BytesIO(jpeg))
    camera = Image.Exif()
    camera[0x010F] = "Another camera"  # Make; the orientation stays the same
    return {
        "original": jpeg,
        "comment": jpeg_with_segment(jpeg, 0xFE, b"scraped from a forum, 2019"),
        "exif": jpeg_with_segment(jpeg, 0xE1, camera.tobytes()),
        "png": encode(decoded, "PNG"),  # lossless: the decoded pixels themselves
        "bmp": encode(decoded.convert("RGB"), "BMP"),
        "requality": encode(img, "JPEG", quality=60),  # look-alikes: other pixels
        "resized": encode(img.resize((160, 120), Image.Resampling.LANCZOS), "JPEG", quality=90),
    }


def hamming(a: str, b: str) -> int:
    return bin(int(a, 16) ^ int(b, 16)).count("1")


def test_copies_with_other_bytes_have_the_pixels_fingerprint_and_look_alikes_a_close_hash():
    copies = copies_of_one_photo()
    prints = {name: images.fingerprint(data) for name, data in copies.items()}
    assert len({hashlib.sha256(data).hexdigest() for data in copies.values()}) == len(copies)  # all other bytes
    same = {prints[name].pixels for name in ("original", "comment", "exif", "png", "bmp")}
    assert len(same) == 1
    assert prints["requality"].pixels not in same and prints["resized"].pixels not in same
    for name in ("requality", "resized"):
        assert hamming(prints[name].dhash, prints["original"].dhash) <= LOOK_ALIKE_DISTANCE, name
    others = [images.fingerprint(encode(scene(seed), "JPEG", quality=90)) for seed in range(2, 12)]
    distances = [hamming(p.dhash, q.dhash) for p, q in itertools.combinations([prints["original"], *others], 2)]
    assert min(distances) > LOOK_ALIKE_DISTANCE, sorted(distances)[:5]


def test_a_fingerprint_is_of_the_oriented_image_and_of_its_size():
    from tests.support.imagegen import jpeg_with_orientation

    upright, turned = (images.fingerprint(jpeg_with_orientation(40, 20, o)) for o in (1, 6))
    assert upright.pixels != turned.pixels  # rotated by EXIF: other pixels as the ETL reads them
    flat = [images.fingerprint(encode(Image.new("RGB", size, (9, 9, 9)), "PNG")) for size in ((4, 6), (6, 4))]
    assert flat[0].pixels != flat[1].pixels  # the same 24 pixel values, another shape
    with pytest.raises(images.ImageRejected):
        images.fingerprint(b"not an image")


def test_the_plan_keeps_one_file_per_image_whatever_its_bytes_and_reports_look_alikes(tmp_path):
    """Real files, hashed as the Spark pass does (transform.hash_chunks' sha256 and fingerprint): the
    copies of one photo with a comment, an EXIF segment, as PNG and BMP, are rejected (one in
    another class: a label conflict), the re-encoded and resized ones kept and reported; ten
    distinct photos are neither."""
    root = tmp_path / "tree"
    copies = copies_of_one_photo()
    names = {"original": "001.cat/a.jpg", "comment": "001.cat/b.jpg", "exif": "001.cat/c.jpg",
             "png": "001.cat/d.png", "bmp": "002.dog/e.bmp", "requality": "001.cat/f.jpg",
             "resized": "002.dog/g.jpg"}
    for name, relative in names.items():
        write(str(root / relative), copies[name])
    for seed in range(2, 12):
        write(str(root / ("001.cat" if seed % 2 else "002.dog") / f"other-{seed}.jpg"),
              encode(scene(seed), "JPEG", quality=90))
    config = ETLConfig(input=str(root), output=str(tmp_path / "out"), image_size=8, min_row_groups=1)
    before = plan(config)

    def hashed(path):
        with open(path, "rb") as f:
            data = f.read()
        found = images.fingerprint(data)
        return path, hashlib.sha256(data).hexdigest(), found.pixels, found.dhash

    after = drop_duplicates(config, before, [hashed(c.path) for c in before.candidates])
    rel = {f.path: f.relative_path for f in after.files}
    rejected = {rel[p]: o.reason for p, o in after.outcomes.items() if isinstance(o, Excluded)}
    assert rejected == {"001.cat/b.jpg": "duplicate: same pixels as 001.cat/a.jpg",
                        "001.cat/c.jpg": "duplicate: same pixels as 001.cat/a.jpg",
                        "001.cat/d.png": "duplicate: same pixels as 001.cat/a.jpg",
                        "002.dog/e.bmp": "label conflict: same pixels as 001.cat/a.jpg in class cat"}
    assert len(after.candidates) == len(before.candidates) - 4
    pairs, count = after.look_alikes
    assert count == 3 and sorted((a, b) for a, b, _ in pairs) == [
        ("001.cat/a.jpg", "001.cat/f.jpg"), ("001.cat/a.jpg", "002.dog/g.jpg"), ("001.cat/f.jpg", "002.dog/g.jpg")]
    assert all(bits <= LOOK_ALIKE_DISTANCE for _, _, bits in pairs)
    # same bytes stay "same bytes"; an undecodable file is grouped by its bytes
    assert duplicates([Hashed("c/a.jpg", 0, "c", "h", "p", "0" * 16), Hashed("c/b.jpg", 0, "c", "h", "p", "0" * 16),
                       ("c/x.jpg", 0, "c", "u"), ("c/y.jpg", 0, "c", "u")]) == {
        "c/b.jpg": "duplicate: same bytes as c/a.jpg", "c/y.jpg": "duplicate: same bytes as c/x.jpg"}


def test_look_alikes_are_every_pair_within_the_distance_each_once_and_listed_closest_first():
    rng = np.random.default_rng(0)
    hashes = [int(v) for v in rng.integers(0, 2 ** 63, 400, dtype=np.int64)]
    base = hashes[0]
    near = {"near-1": base ^ 0b1, "near-3": base ^ (0b111 << 40), "near-5": base ^ (0b11111 << 20),
            "far-6": base ^ 0b111111}
    files = [(f"f{i:03d}", f"{h:016x}") for i, h in enumerate(hashes)] + [(k, f"{v:016x}") for k, v in near.items()]
    brute = sorted((hamming(x, y), a, b) for (a, x), (b, y) in itertools.combinations(sorted(files), 2)
                   if hamming(x, y) <= LOOK_ALIKE_DISTANCE)
    pairs, count = look_alikes(files)
    assert count == len(brute) == 5 and [(bits, a, b) for a, b, bits in pairs] == brute
    assert ("f000", "far-6") not in {(a, b) for a, b, _ in pairs}
    assert look_alikes(files, listed=2) == ([(a, b, bits) for bits, a, b in brute[:2]], count)
    blank = [(f"blank-{i}", "0" * 16) for i in range(30)]  # identical hashes: every pair, once
    assert look_alikes(blank, listed=1) == ([("blank-0", "blank-1", 0)], 435)
    assert look_alikes(blank[:1]) == ([], 0) and look_alikes([]) == ([], 0)


def test_the_summary_warns_of_look_alikes_with_the_pairs():
    from pipelines.etl.summary import format_summary

    manifest = {"image": {"height": 8}, "num_classes": 2, "files": {"found": 3, "written": 3, "rejected": 0,
                                                                    "skipped": 0, "reasons": {}, "list": "x"},
                "splits": {}, "max_world_size": 1, "min_row_groups": 1, "images_per_second": 1.0, "seconds": 3,
                "look_alikes": {"max_distance": 5, "count": 1, "pairs": [["001.cat/a.jpg", "002.dog/g.jpg", 2]]}}
    assert "  WARNING: 1 pair of look-alike files kept, each split on its own (difference hashes within 5 bits): " \
           "001.cat/a.jpg ~ 002.dog/g.jpg (2 bits)" in format_summary(manifest).splitlines()
    assert "look-alike" not in format_summary({**manifest, "look_alikes": {"max_distance": 5, "count": 0,
                                                                            "pairs": []}})

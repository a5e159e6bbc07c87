"""Pure parts of the ETL: labels, split assignment, classification, row-group arithmetic, config."""
import pytest

from pipelines.config import parse_config
from pipelines.etl.config import ETLConfig
from pipelines.etl.labels import ClassFolder, has_image_extension, is_test, label_for, parse_class_folder
from pipelines.etl.layout import rows_per_row_group
from pipelines.etl.listing import REJECTED, SKIPPED, Excluded, classify, spark_ignores


@pytest.mark.parametrize("folder, expected", [
    ("001.ak47", ClassFolder(0, "ak47")),
    ("257.clutter", ClassFolder(256, "clutter")),
    ("056.dog", ClassFolder(55, "dog")),
    ("010.t-shirt.top", ClassFolder(9, "t-shirt.top")),
    ("000.zero", None), ("1.short", None), ("abc.def", None), ("056dog", None), ("056.", None),
])
def test_parse_class_folder(folder, expected):
    assert parse_class_folder(folder) == expected


def test_nested_file_belongs_to_its_top_level_class():
    assert label_for("056.dog/greg/x.jpg") == ClassFolder(55, "dog")


@pytest.mark.parametrize("path, reason", [
    ("x.jpg", "not inside a class folder"),
    ("misc/x.jpg", "not a class folder: 'misc' is not of the form NNN.name"),
])
def test_files_outside_class_folders_are_reported(path, reason):
    assert label_for(path).startswith(reason)


@pytest.mark.parametrize("name, ok", [("a.jpg", True), ("a.JPG", True), ("a.Jpeg", True),
                                      ("a.png", True), ("a.PNG", True), ("a.gif", False), ("jpg", False)])
def test_image_extensions_in_any_case(name, ok):
    assert has_image_extension(name) is ok


def test_split_is_deterministic_disjoint_and_near_the_fraction():
    paths = [f"{c:03d}.c/{i}.jpg" for c in range(1, 11) for i in range(1000)]
    first = [is_test(p, 42, 0.1) for p in paths]
    assert first == [is_test(p, 42, 0.1) for p in paths]
    assert 0.09 < sum(first) / len(paths) < 0.11
    other_seed = [is_test(p, 7, 0.1) for p in paths]
    assert first != other_seed
    # a larger fraction only adds files to the test split
    assert all(is_test(p, 42, 0.3) for p, t in zip(paths, first) if t)


@pytest.mark.parametrize("path, hidden", [
    ("001.a/_x.jpg", True), ("001.a/.x.jpg", True), ("_tmp/001.a/x.jpg", True), ("001.a/.git/x.jpg", True),
    ("001.a/_k=v.jpg", False), ("001.a/x.jpg._COPYING_", True), ("001.a/x_y.jpg", False),
])
def test_spark_hidden_rule(path, hidden):
    assert spark_ignores(path) is hidden


def test_classify_every_case():
    big = 10
    assert classify("001.a/x.jpg", 5, big) == ClassFolder(0, "a")
    assert classify("001.a/_x.jpg", 5, big).status == SKIPPED
    assert classify("001.a/x.txt", 5, big).status == SKIPPED
    assert classify("x.jpg", 5, big).status == SKIPPED
    assert classify("001.a/x.jpg", 0, big) == Excluded(REJECTED, "empty file (0 bytes)")
    assert classify("001.a/x.jpg", 11, big).status == REJECTED
    assert classify("001.a/x.jpg", -1, big).status == REJECTED
    # executors see names Spark let through: no hidden check there
    assert classify("001.a/_k=v.jpg", 5, big, check_spark_hidden=False) == ClassFolder(0, "a")


def test_rows_per_row_group():
    row = 299 * 299 * 3
    assert rows_per_row_group(row, 2**20, {"train": 10000, "test": 1000}, 8) == 4
    assert rows_per_row_group(row, 32 * 2**20, {"train": 10000, "test": 1000}, 8) == 125
    # the small split caps it so that it still gets 8 row groups
    assert rows_per_row_group(row, 32 * 2**20, {"train": 10000, "test": 80}, 8) == 10
    assert rows_per_row_group(row, 2**20, {"train": 100, "test": 3}, 8) == 1
    assert rows_per_row_group(row, 2**20, {"train": 100, "test": 0}, 8) == 4
    assert rows_per_row_group(row, 1, {"train": 100}, 8) == 1


def test_config_from_command_line():
    config = parse_config(ETLConfig, ["--input", "in", "--output", "/tmp/out", "--image-size", "128",
                                      "--test-fraction", "0.25", "--row-group-mb", "2"])
    assert config.image_size == 128 and config.test_fraction == 0.25 and config.row_group_mb == 2.0
    assert config.input.endswith("/in") and config.input.startswith("/")
    assert config.row_bytes == 128 * 128 * 3


@pytest.mark.parametrize("args", [["--test-fraction", "0"], ["--test-fraction", "1.5"],
                                  ["--image-size", "0"], ["--min-row-groups", "0"], ["--row-group-mb", "-1"]])
def test_config_refuses_bad_values(args, capsys):
    with pytest.raises(SystemExit) as info:
        parse_config(ETLConfig, ["--input", "in", "--output", "out"] + args)
    assert info.value.code == 2
    assert "must be" in capsys.readouterr().err

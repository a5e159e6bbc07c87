"""The search's configuration and its feature set: bad input refused in one line naming the flag,
exit 2, before Spark starts; the complete feature set found, or refused naming the command that makes it."""
import math

import numpy as np
import pytest

from pipelines.runtime.errors import MissingInput, Refused
from pipelines.training.data import features as feat
from pipelines.training.data.dataset import load_dataset
from pipelines.training.model.build import input_tag
from pipelines.tune import cli, search
from pipelines.tune.cache import find_feature_set, read_splits
from pipelines.tune.config import TuneConfig
from tests.support.datagen import write_dataset

BASE = {"data": "/tmp/tune-unit-data", "output": "/tmp/tune-unit-out", "backbone": "tiny", "weights": "none"}


@pytest.mark.parametrize("options, flag", [
    ({"trials": 0}, "--trials"),
    ({"trials": -3}, "--trials"),
    ({"epochs": 0}, "--epochs"),
    ({"batch_size": 0}, "--batch-size"),
    ({"ranks": 0}, "--ranks"),
    ({"parallel": -1}, "--parallel"),
    ({"threads": -1}, "--threads"),
    ({"base_lr_range": "0.01,0.0001"}, "--base-lr-range"),
    ({"base_lr_range": "0.001,0.001"}, "--base-lr-range"),
    ({"base_lr_range": "nan,0.01"}, "--base-lr-range"),
    ({"base_lr_range": "0,0.01"}, "--base-lr-range"),
    ({"dropout_range": "0.2,inf"}, "--dropout-range"),
    ({"dropout_range": "0.2,1.5"}, "--dropout-range"),
    ({"weight_decay_range": "0.1,0.1"}, "--weight-decay-range"),
    ({"weight_decay_range": "-inf,0.1"}, "--weight-decay-range"),
    ({"patience_steps_range": "400,25"}, "--patience-steps-range"),
    ({"patience_steps_range": "10.5,20"}, "--patience-steps-range"),
    ({"stopping": "patient"}, "--stopping"),
    ({"runner": "dask"}, "--runner"),
    ({"backbone": "resnet"}, "backbone"),
    ({"weights": "imagenet"}, "backbone tiny has no pretrained weights"),
])
def test_a_value_no_search_can_use_is_refused_naming_its_flag(options, flag):
    with pytest.raises(Refused) as caught:
        TuneConfig(**{**BASE, **options})
    assert flag in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("argv, flag", [
    (["--trials", "0"], "--trials"),
    (["--dropout-range", "0.5,0.5"], "--dropout-range"),
    (["--base-lr-range", "0.001,nan"], "--base-lr-range"),
    (["--weight-decay-range", "inf,1"], "--weight-decay-range"),
])
def test_the_command_line_refuses_with_exit_2_and_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["--data", BASE["data"], "--output", BASE["output"], "--backbone", "tiny", "--weights", "none", *argv])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "error:" in err[0]


@pytest.fixture
def etl_output(tmp_path):
    root = str(tmp_path / "etl")
    write_dataset(root, train_groups=[6], test_groups=[3])
    return root


def _complete_set(root, seed=42, dim=5):
    """A complete feature set of ``root`` for ``--backbone tiny --weights none --seed seed``, as
    training writes it: features ``dim`` wide whose first column is the row's label."""
    data = load_dataset(root, 1)
    model = feat.model_key("none", data.stored_size, seed, "tiny", "float32", input_tag("uint8", data.stored_size))
    identity = data.identity()
    key = feat.feature_key(model, identity)
    directory = feat.feature_dir(root, key)
    counts = {}
    for split in ("train", "validation", "test"):
        labels = np.arange(data.rows(split), dtype=np.int32)
        features = np.zeros((len(labels), dim), np.float32)
        features[:, 0] = labels
        feat.write_shard(directory, split, 0, features, labels)
        counts[split] = len(labels)
    feat.mark_complete(directory, counts, key, model, identity)
    return directory.uri


def test_the_complete_feature_set_is_found_and_read_whole(etl_output):
    uri = _complete_set(etl_output)
    found = find_feature_set(etl_output, "tiny", "none", 0, 42)
    assert found.uri == uri and found.counts == {"train": 6, "validation": 3, "test": 3}
    assert found.num_classes == 12 and found.feature_dim == 32
    splits = read_splits(found.uri, ("train", "validation"))
    assert sorted(splits) == ["train", "validation"]
    assert splits["train"][1].tolist() == list(range(6)) and splits["train"][0][:, 0].tolist() == list(range(6))


@pytest.mark.parametrize("change", ["seed", "image_size", "incomplete"])
def test_no_complete_set_of_these_weights_is_refused_naming_the_command_that_makes_it(etl_output, change):
    uri = _complete_set(etl_output)
    seed, size = 42, 0
    if change == "seed":
        seed = 7  # random weights of another seed: other features
    elif change == "image_size":
        size = 16
    else:
        import os
        os.remove(os.path.join(uri, feat.COMPLETE))
    with pytest.raises(MissingInput) as caught:
        find_feature_set(etl_output, "tiny", "none", size, seed)
    text = str(caught.value)
    assert "no complete feature cache" in text and "jobs/train.py" in text and "--feature-cache" in text
    assert f"--seed {seed}" in text and (f"--image-size {size}" in text) == bool(size)


def test_a_missing_feature_cache_exits_2_before_spark_starts(etl_output, tmp_path, monkeypatch, capsys):
    def no_spark(*args, **kwargs):
        raise AssertionError("Spark started")

    monkeypatch.setattr(search, "spark_session", no_spark)
    code = cli.main(["--data", etl_output, "--output", str(tmp_path / "out"), "--backbone", "tiny",
                     "--weights", "none", "--trials", "2"])
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "jobs/train.py --data" in err[0] and "--feature-cache" in err[0]


def test_nan_given_to_a_count_is_refused_naming_it():
    with pytest.raises(Refused, match="epochs must be an int, got nan"):
        TuneConfig(**BASE, epochs=math.nan)

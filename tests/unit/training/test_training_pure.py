"""Pure parts of training: steps, learning rates, checkpoint choice, devices, exact totals, manifest checks."""
import json
import os

import numpy as np
import pytest

from pipelines.runtime.config import parse_config
from pipelines.training.config import FitOptions, ModelOptions, TrainConfig
from pipelines.training.data import DataError, load_dataset
from pipelines.training.data.readers import cache_size_bytes
from pipelines.training.devices import choose_device, rank_cores
from benchmarks.eval_bench import previous_add, previous_batch_totals
from pipelines.training.evaluate import Totals, add, batch_totals, gathers_pairs, sum_totals
from pipelines.training.checkpoints.choose import newest_complete_checkpoint
from pipelines.training.checkpoints.names import checkpoint_path, marker_path
from pipelines.training.schedule import plan_steps, scaled_lr, warmup_lr
from tests.support.outputs import checkpoint_bytes


def test_steps_come_from_global_counts_and_are_the_same_for_every_rank():
    steps = plan_steps(train_rows=1000, validation_rows=130, batch_size=16, world_size=4)
    assert (steps.global_batch, steps.steps_per_epoch, steps.validation_steps) == (64, 15, 2)
    assert plan_steps(1000, 130, 16, 1).steps_per_epoch == 62


@pytest.mark.parametrize("train, val, batch, size", [(10, 100, 16, 1), (31, 100, 16, 2), (100, 100, 0, 1)])
def test_a_batch_larger_than_the_train_split_is_refused(train, val, batch, size):
    with pytest.raises(ValueError, match="batch"):
        plan_steps(train, val, batch, size)


@pytest.mark.parametrize("val", [1, 30, 31])
def test_a_test_split_smaller_than_the_global_batch_is_accepted(val):
    """Validation is the exact evaluation of the whole test split: its size refuses nothing."""
    assert plan_steps(100, val, 16, 2).steps_per_epoch == 3


def test_learning_rate_scales_with_world_size():
    assert scaled_lr(0.001, 8) == pytest.approx(0.008)
    assert scaled_lr(0.001, 1) == 0.001


def test_warmup_goes_linearly_from_base_to_scaled_lr():
    assert warmup_lr(0.0, 0.001, 4, 5) == pytest.approx(0.001)
    assert warmup_lr(2.5, 0.001, 4, 5) == pytest.approx(0.0025)
    assert warmup_lr(5.0, 0.001, 4, 5) == pytest.approx(0.004)
    assert warmup_lr(9.0, 0.001, 4, 5) == pytest.approx(0.004)
    assert warmup_lr(1.0, 0.001, 4, 0) == pytest.approx(0.004)


def write_checkpoint(directory, epoch, size=100, marker=True, marker_size=None):
    data = checkpoint_bytes(size)
    with open(checkpoint_path(directory, epoch), "wb") as f:
        f.write(data)
    if marker:
        with open(marker_path(directory, epoch), "w") as f:
            json.dump({"epoch": epoch, "weights": os.path.basename(checkpoint_path(directory, epoch)),
                       "weights_bytes": len(data) if marker_size is None else len(checkpoint_bytes(marker_size)),
                       "early_stopping": {"best_epoch": epoch}}, f)


def test_newest_complete_checkpoint_skips_interrupted_ones(tmp_path):
    d = str(tmp_path)
    assert newest_complete_checkpoint(d) is None
    assert newest_complete_checkpoint(str(tmp_path / "missing")) is None
    write_checkpoint(d, 1)
    write_checkpoint(d, 2)
    write_checkpoint(d, 3, marker=False)                # killed before its marker
    write_checkpoint(d, 4, size=50, marker_size=100)    # weights file truncated after the marker
    with open(marker_path(d, 5), "w") as f:             # marker cut short
        f.write('{"epoch": 5, "weig')
    with open(marker_path(d, 10) + ".tmp", "w") as f:   # marker never renamed
        f.write("{}")
    assert newest_complete_checkpoint(d)["epoch"] == 2


def test_newest_checkpoint_orders_numerically(tmp_path):
    for epoch in (2, 9, 10):
        write_checkpoint(str(tmp_path), epoch)
    assert newest_complete_checkpoint(str(tmp_path))["epoch"] == 10


def test_device_choice():
    gpus = [f"/physical_device:GPU:{i}" for i in range(8)]
    assert choose_device([], 3, 4).kind == "cpu"
    assert choose_device(gpus, 3, 8).index == 3
    assert choose_device(gpus[:1], 0, 8, assigned=["5"]).index == 0  # a Spark task sees its GPU alone (test_gpus.py)
    with pytest.raises(ValueError, match="3 ranks on this host but 2 GPUs"):
        choose_device(gpus[:2], 2, 3)


def test_each_local_rank_gets_cores_of_its_own():
    assert rank_cores(0, 2, 1, [0, 1]) == [0] and rank_cores(1, 2, 1, [1, 0]) == [1]
    assert rank_cores(1, 2, 3, [2, 3, 4, 5, 6, 7, 8]) == [5, 6, 7]  # of the cores this process may use
    with pytest.raises(ValueError, match="2 ranks x 2 threads: need 4 cores to bind; this process may use 2 cores"):
        rank_cores(0, 2, 2, [0, 1])
    for rank, size, threads in ((0, 1, 0), (2, 2, 1), (-1, 2, 1)):
        with pytest.raises(ValueError, match="cannot bind"):
            rank_cores(rank, size, threads, [0, 1, 2, 3])


def test_batch_totals_match_keras_crossentropy():
    from pipelines.stack.kerasapi import keras

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, 4))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = rng.integers(0, 4, 7)
    totals = batch_totals(probs.astype(np.float32), labels)
    keras_loss = keras.losses.sparse_categorical_crossentropy(labels, probs.astype(np.float32)).numpy()
    assert totals.loss == pytest.approx(float(keras_loss.mean()), rel=1e-5)
    assert totals.correct == int((probs.argmax(1) == labels).sum()) and totals.count == 7


def test_totals_add_up_exactly_across_uneven_parts():
    a, b = Totals(3.0, 2, 5), Totals(1.0, 1, 1)
    both = add(a, b)
    assert both.accuracy == 3 / 6 and both.loss == 4.0 / 6
    assert both.accuracy != (a.accuracy + b.accuracy) / 2  # not an average of per-rank means


def test_batch_totals_count_loss_correct_and_confusion_by_hand():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    t = batch_totals(probs, np.array([0, 1, 1, 0]))
    assert (t.count, t.correct, t.num_classes) == (4, 2, 3)
    assert t.loss_sum == pytest.approx(-np.log(0.7) - np.log(0.8) - np.log(0.3) - np.log(0.2), rel=1e-12)
    # class 2 is never a label, class 1 is a label predicted as 0 once
    assert t.confusion_matrix().tolist() == [[1, 0, 1], [1, 1, 0], [0, 0, 0]]
    assert t.confusion_matrix().dtype == np.int64
    both = add(t, batch_totals(probs[:1], np.array([2])))
    assert both.confusion_matrix().tolist() == [[1, 0, 1], [1, 1, 0], [1, 0, 0]]
    assert (both.count, both.correct) == (5, 2) and both.accuracy == pytest.approx(2 / 5)


def test_totals_at_a_thousand_classes_and_a_few_rows_hold_only_the_rows():
    k = 1000
    probs = np.full((3, k), 0.1 / (k - 1))
    probs[0, 999], probs[1, 5], probs[2, 500] = 0.9, 0.9, 0.9  # predicted 999, 5, 500
    t = batch_totals(probs, np.array([999, 0, 500]))
    assert t.true.tolist() == [999, 0, 500] and t.predicted.tolist() == [999, 5, 500]  # 3 pairs, not k*k cells
    m = t.confusion_matrix()
    assert m.shape == (k, k) and m.sum() == 3 and (t.correct, t.count) == (2, 3)
    assert list(zip(*np.nonzero(m))) == [(0, 5), (500, 500), (999, 999)]
    assert m[0, 5] == m[500, 500] == m[999, 999] == 1


def test_an_empty_batch_adds_nothing():
    empty = batch_totals(np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    assert (empty.count, empty.correct, empty.loss_sum, empty.num_classes) == (0, 0, 0.0, 4)
    assert str(empty.loss_sum) == "0.0"  # not -0.0
    assert np.isnan(empty.loss) and np.isnan(empty.accuracy)
    assert empty.confusion_matrix().tolist() == [[0] * 4] * 4
    one = batch_totals(np.array([[0.1, 0.6, 0.2, 0.1]]), np.array([3]))
    for both in (add(empty, one), add(one, empty), sum_totals([empty, one, empty])):
        assert both.confusion_matrix().tolist() == one.confusion_matrix().tolist()
        assert (both.count, both.correct, both.loss_sum) == (1, 0, one.loss_sum)


def test_totals_not_counting_the_confusion_add_to_those_that_do():
    uncounted = Totals(2.0, 1, 2)
    assert uncounted.confusion_matrix(3).tolist() == [[0] * 3] * 3 and uncounted.confusion_matrix().shape == (0, 0)
    counted = batch_totals(np.array([[0.9, 0.05, 0.05]]), np.array([0]))
    both = add(uncounted, counted)
    assert (both.count, both.correct, both.num_classes) == (3, 2, 3)
    assert both.confusion_matrix().tolist() == [[1, 0, 0], [0, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match=r"cannot add confusions counted over different numbers of classes: \[1, 3\]"):
        add(counted, batch_totals(np.array([[1.0]]), np.array([0])))


def test_labels_outside_the_models_classes_are_refused():
    probs = np.full((2, 3), 1 / 3)
    for labels in ([0, 3], [-1, 0]):
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
            batch_totals(probs, np.array(labels))


def test_totals_of_a_confusion_matrix_give_it_back():
    m = np.array([[3, 0, 1], [2, 5, 0], [0, 0, 0]])
    t = Totals.of_confusion(4.5, m)
    assert (t.loss_sum, t.correct, t.count, t.num_classes) == (4.5, 8, 11, 3)
    assert t.confusion_matrix().tolist() == m.tolist()
    assert Totals.of_confusion(0.0, np.zeros((5, 5), int)).confusion_matrix().tolist() == [[0] * 5] * 5


@pytest.mark.parametrize("k, batches", [(2, 5), (7, 9), (60, 4)])
def test_totals_equal_those_of_before_on_random_batches(k, batches):
    """The pairs give what the k x k tuples built every batch gave (benchmarks/eval_bench.py keeps them)."""
    rng = np.random.default_rng(k)
    parts, before = [], (0.0, 0, 0, tuple((0,) * k for _ in range(k)))
    for size in rng.integers(0, 40, batches):
        logits = rng.normal(size=(size, k))
        probs = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype(np.float32)
        labels = rng.integers(0, k, size)
        parts.append(batch_totals(probs, labels))
        before = previous_add(before, previous_batch_totals(probs, labels))
    now = sum_totals(parts)
    assert (now.correct, now.count) == before[1:3]
    assert now.loss_sum == pytest.approx(before[0], rel=1e-12)  # summed in another order
    assert now.confusion_matrix().tolist() == [list(row) for row in before[3]]


def test_allreduce_gathers_pairs_only_when_they_are_smaller_than_the_matrix():
    assert gathers_pairs(rows=10, num_classes=1000)  # 20 int64 against a million cells
    assert gathers_pairs(rows=10_000, num_classes=100_000)
    assert not gathers_pairs(rows=1_000_000, num_classes=10)
    assert not gathers_pairs(rows=50, num_classes=10) and gathers_pairs(rows=49, num_classes=10)  # 2 * rows < k * k


def manifest(tmp_path, train_groups=8, test_groups=8, train_rows=100, test_rows=20, validation=True):
    m = {"image": {"height": 32}, "num_classes": 3, "class_names": ["a", "b", "c"], "rows_per_row_group": 2,
         "splits": {"train": {"rows": train_rows, "row_groups": train_groups},
                    "test": {"rows": test_rows, "row_groups": test_groups}}}
    if validation:
        m["splits"]["validation"] = {"rows": test_rows, "row_groups": test_groups}
    else:
        m["format_version"] = 2
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    return str(tmp_path)


def test_dataset_refusals(tmp_path):
    with pytest.raises(DataError, match="no manifest.json"):
        load_dataset(str(tmp_path), 1)
    root = manifest(tmp_path, train_groups=3)
    assert load_dataset(root, 3).row_groups("train") == 3
    with pytest.raises(DataError, match="the train split has 3 row groups but 4 ranks .* --min-row-groups 4"):
        load_dataset(root, 4)
    assert load_dataset(manifest(tmp_path, train_groups=16, test_groups=3), 16).row_groups("test") == 3  # by rows
    with pytest.raises(DataError, match="empty"):
        load_dataset(manifest(tmp_path, test_rows=0), 1)


def test_a_two_split_manifest_never_trains_it_is_refused_naming_the_rerun(tmp_path):
    from pipelines.manifest import Manifest
    from pipelines.runtime.errors import Refused

    root = manifest(tmp_path, validation=False)
    assert set(Manifest.read(root).splits) == {"train", "test"}  # still read (batch inference takes its splits)
    with pytest.raises(Refused, match=r"older ETL \(manifest format 2: train and test splits only\).* never on "
                                      r"the test split.* rerun jobs/etl.py .*manifest format 3"):
        load_dataset(root, 1)
    with pytest.raises(DataError, match="the validation split of .* is empty"):
        load_dataset(manifest(tmp_path, test_rows=0), 1)


def test_cache_is_sized_from_row_groups(tmp_path):
    data = load_dataset(manifest(tmp_path, train_groups=80), 2)
    group = 2 * 32 * 32 * 3
    assert cache_size_bytes(data, "train", 2) >= 1.5 * 40 * group
    assert cache_size_bytes(data, "test", 2) >= 31 * group  # Petastorm's LocalDiskCache minimum


def test_train_config_from_command_line(capsys):
    config = parse_config(TrainConfig, ["--data", "d", "--output", "o", "--batch-size", "4", "--resume",
                                        "--weights", "none", "--warmup-epochs", "2"])
    assert config.fit.batch_size == 4 and config.outputs.resume and config.model.weights == "none"
    assert config.fit.warmup_epochs == 2.0 and os.path.isabs(config.loader.data)
    for bad in (["--dropout", "1.0"], ["--threads", "-3"]):
        with pytest.raises(SystemExit) as info:
            parse_config(TrainConfig, ["--data", "d", "--output", "o", *bad])
        assert info.value.code == 2, bad
        assert bad[0] in capsys.readouterr().err, bad


def test_feature_key_follows_weights_size_seed_and_backbone(tmp_path):
    from pipelines.training.data.features import model_key as feature_key
    w1, w2 = tmp_path / "a.h5", tmp_path / "b.h5"
    w1.write_bytes(b"weights one")
    w2.write_bytes(b"weights two")
    def key(weights, size, seed, backbone="xception"):
        return feature_key(weights, size, seed, backbone, "float32", "uint8-299")

    keys = {key(str(w1), 299, 0), key(str(w2), 299, 0), key(str(w1), 160, 0), key("none", 299, 0),
            key("none", 299, 1), key("imagenet", 299, 0), key("none", 299, 0, "tiny")}
    assert len(keys) == 7
    assert key(str(w1), 299, 5) == key(str(w1), 299, 0)  # the seed matters only for random weights


def test_feature_shards_round_trip_and_reshard(tmp_path):
    from pipelines.training.data.features import read_shard, write_shard
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 2048)).astype(np.float32), rng.normal(size=(4, 2048)).astype(np.float32)
    write_shard(str(tmp_path), "train", 0, a, np.arange(5))
    write_shard(str(tmp_path), "train", 1, b, np.arange(5, 9))
    everything, labels = read_shard(str(tmp_path), "train", 0, 1)
    np.testing.assert_array_equal(everything, np.concatenate([a, b]))
    parts = [read_shard(str(tmp_path), "train", r, 3)[1].tolist() for r in range(3)]
    assert sorted(sum(parts, [])) == list(range(9)) and labels.dtype == np.int32


@pytest.mark.parametrize("fields, message", [
    ({"backbone": "tiny"}, "backbone tiny has no pretrained weights: use --weights none (got imagenet)"),
    ({"backbone": "resnet50"}, "unknown backbone 'resnet50': one of xception, densenet121, tiny"),
    ({"image_size": 64}, "backbone xception takes images of at least 71 px, got 64"),
    ({"backbone": "tiny", "weights": "none", "image_size": 7}, "backbone tiny takes images of at least 8 px, got 7"),
])
def test_a_backbone_refuses_weights_and_sizes_it_cannot_take(fields, message):
    with pytest.raises(ValueError) as info:
        TrainConfig(data="d", output="o", **fields)
    assert str(info.value).startswith(message)


def test_the_tiny_backbone_is_a_small_frozen_feature_extractor():
    from pipelines.training.model.build import backbone_of, build_model
    model = build_model(5, 8, weights="none", backbone="tiny")
    backbone = backbone_of(model)
    assert backbone.name == "tiny" and backbone.output_shape == (None, 32) and not backbone.trainable
    # two 3x3 convolutions (3->16, 16->32 channels) and their batch norms (4 weights per channel)
    assert model.output_shape == (None, 5) and model.count_params() == 5088 + 4 * (16 + 32) + 32 * 5 + 5
    assert model.predict(np.zeros((2, 8, 8, 3), np.uint8), verbose=0).shape == (2, 5)


# --- fine-tuning: which layers, which learning rate, which refusals ------------------------------

def test_fine_tune_blocks_of_xception_are_its_top_blocks_with_their_unnamed_layers():
    from pipelines.stack.kerasapi import keras
    from pipelines.training.model.finetune import block_layers, trainable_parameters, unfreeze
    from pipelines.backbones import BACKBONES
    from pipelines.training.model.build import backbone_of, build_model
    keras.backend.clear_session()  # Keras numbers unnamed layers per process: a model built before adds "_1"
    names = [layer.name for layer in keras.applications.Xception(
        include_top=False, pooling="avg", input_shape=(71, 71, 3), weights=None).layers]
    spec = BACKBONES["xception"]
    assert block_layers(names, spec, 0) == []
    assert block_layers(names, spec, 1) == ["block14_sepconv1", "block14_sepconv1_bn", "block14_sepconv1_act",
                                            "block14_sepconv2", "block14_sepconv2_bn", "block14_sepconv2_act",
                                            "global_average_pooling2d"]
    two = block_layers(names, spec, 2)
    assert two[0] == "block13_sepconv1_act" and {"conv2d_3", "batch_normalization_3", "add_11"} <= set(two)
    assert not {"conv2d_2", "add_10"} & set(two)  # block 12's end and earlier residuals stay frozen
    assert block_layers(names, spec, 14) == names[1:]  # every layer but the input
    model = build_model(3, 71, weights="none", backbone="xception")
    unfreeze(model, "xception", 1)
    # depthwise 3x3 + pointwise 1x1 of each separable conv, gamma and beta of each batch norm, the head
    block14 = (9 * 1024 + 1024 * 1536) + 2 * 1536 + (9 * 1536 + 1536 * 2048) + 2 * 2048
    assert trainable_parameters(model) == block14 + 2048 * 3 + 3 == 4748800 + 6147
    moving = [w.name for w in backbone_of(model).non_trainable_weights if w.name.startswith("block14")]
    assert sorted(moving) == sorted(f"block14_sepconv{i}_bn/moving_{s}:0" for i in (1, 2) for s in ("mean", "variance"))


def test_fine_tune_blocks_of_tiny_are_its_conv_and_batch_norm_pairs():
    from pipelines.training.model.finetune import unfreeze
    from pipelines.training.model.build import build_model
    model = build_model(3, 16, weights="none", backbone="tiny")
    assert unfreeze(model, "tiny", 1) == ["tiny_block2_conv", "tiny_block2_bn"]
    assert [w.name for w in model.trainable_weights] == [
        "tiny_block2_conv/kernel:0", "tiny_block2_conv/bias:0", "tiny_block2_bn/gamma:0", "tiny_block2_bn/beta:0",
        "head/kernel:0", "head/bias:0"]
    assert unfreeze(model, "tiny", 2) == ["tiny_block1_conv", "tiny_block1_bn", "tiny_block2_conv", "tiny_block2_bn"]
    assert unfreeze(model, "tiny", 0) == [] and [w.name for w in model.trainable_weights] == ["head/kernel:0",
                                                                                              "head/bias:0"]


def test_phase_2_learning_rate_and_allreduced_bytes():
    from pipelines.training.model.finetune import KERAS_GUIDE_LR_FACTOR, allreduce_bytes, phase2_lr
    assert TrainConfig(data="d", output="o").model.fine_tune_lr == KERAS_GUIDE_LR_FACTOR == 1e-5 / 1e-3
    assert phase2_lr(0.002, 0.01) == pytest.approx(2e-5)
    assert allreduce_bytes(1000, fp16=False) == 4000 and allreduce_bytes(1000, fp16=True) == 2000
    config = TrainConfig(data="d", output="o", epochs=7)
    assert config.fine_tune_max_epochs == 7 and TrainConfig(data="d", output="o", fine_tune_epochs=3).fine_tune_max_epochs == 3


FINE_TUNE_REFUSALS = [
    (["--fine-tune-blocks", "-1"], "--fine-tune-blocks must be in 0..14 for backbone xception (it has 14 blocks), got -1"),
    (["--fine-tune-blocks", "15"], "--fine-tune-blocks must be in 0..14 for backbone xception (it has 14 blocks), got 15"),
    (["--backbone", "tiny", "--weights", "none", "--fine-tune-blocks", "3"],
     "--fine-tune-blocks must be in 0..2 for backbone tiny (it has 2 blocks), got 3"),
    (["--fine-tune-blocks", "1", "--fine-tune-lr", "0"], "--fine-tune-lr is the factor that lowers phase 1's"),
    (["--fine-tune-blocks", "1", "--fine-tune-lr", "-0.1"], "--fine-tune-lr is the factor that lowers phase 1's"),
    (["--fine-tune-blocks", "1", "--fine-tune-lr", "2"], "must be in (0, 1], got 2.0"),
    (["--fine-tune-epochs", "-1"], "--fine-tune-epochs must be >= 0, got -1"),
]


@pytest.mark.parametrize("args, message", FINE_TUNE_REFUSALS)
def test_fine_tune_values_are_refused_with_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, ["--data", "d", "--output", "o", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_mixed_precision_only_on_a_gpu():
    from pipelines.training.devices import precision_policy
    assert precision_policy(False, "gpu") == ("float32", None) == precision_policy(False, "cpu")
    assert precision_policy(True, "gpu") == ("mixed_float16", None)
    policy, why = precision_policy(True, "cpu")
    assert policy == "float32" and why.startswith("--mixed-precision: not used on the CPU")


REFUSE = ("import sys; from pipelines.training.cli import main; rc = main(sys.argv[1:]); "
          "print('tensorflow loaded:', 'tensorflow' in sys.modules); sys.exit(rc)")


@pytest.mark.parametrize("size, layout, batch, reason", [
    ("2", None, "4", "no manifest.json"),
    ("2", dict(train_rows=20), "16", "global batch"),  # 16 x 2 ranks > 20 train rows; one rank fits
    ("4", dict(train_groups=3), "2", "the train split has 3 row groups but 4 ranks"),
])
def test_rank_0_refuses_before_tensorflow_loads(tmp_path, size, layout, batch, reason):
    """Under horovodrun (HOROVOD_RANK/HOROVOD_SIZE set), a refused rank 0 exits 2 without importing
    TensorFlow, saying why, with the world size horovodrun gave it."""
    import subprocess
    import sys

    data = manifest(tmp_path, **layout) if layout is not None else str(tmp_path)
    env = dict(os.environ, HOROVOD_RANK="0", HOROVOD_SIZE=size)
    proc = subprocess.run([sys.executable, "-c", REFUSE, "--data", data, "--output", str(tmp_path / "out"),
                           "--batch-size", batch], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == "tensorflow loaded: False"
    assert reason in proc.stderr, proc.stderr


# --- bad input: non-finite numbers, option groups and values of the wrong type -------------------

NON_FINITE = [
    (["--base-lr", "nan"], "--base-lr must be positive and finite, got nan"),
    (["--base-lr", "inf"], "--base-lr must be positive and finite, got inf"),
    (["--base-lr", "0"], "--base-lr must be positive and finite, got 0.0"),
    (["--warmup-epochs", "nan"], "--warmup-epochs must be a finite number >= 0, got nan"),
    (["--warmup-epochs", "inf"], "--warmup-epochs must be a finite number >= 0, got inf"),
    (["--min-delta", "nan"], "--min-delta must be a finite number >= 0, got nan"),
    (["--min-delta", "-1"], "--min-delta must be a finite number >= 0, got -1.0"),
    (["--min-delta", "inf"], "--min-delta must be a finite number >= 0, got inf"),
    (["--checkpoint-every-minutes", "inf"], "--checkpoint-every-minutes must be positive and finite, got inf: an "
                                            "interval of steps or minutes between checkpoints"),
    (["--checkpoint-every-minutes", "nan"], "--checkpoint-every-minutes must be positive and finite, got nan"),
    (["--dropout", "nan"], "--dropout must be a number in [0, 1), got nan"),
    (["--dropout=-inf"], "--dropout must be a number in [0, 1), got -inf"),
    (["--fine-tune-blocks", "1", "--fine-tune-lr", "nan"], "--fine-tune-lr is the factor that lowers phase 1's"),
]


@pytest.mark.parametrize("args, message", NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_flag_with_exit_2(args, message, capsys):
    """argparse's float() takes "nan" and "inf"; the config refuses them in one line, exit 2."""
    with pytest.raises(SystemExit) as info:
        parse_config(TrainConfig, ["--data", "d", "--output", "o", "--no-tracking", *args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and len(err.splitlines()) == 1, err


def test_the_bounds_of_the_float_options_still_take_their_valid_values():
    config = TrainConfig(data="d", output="o", tracking=False, min_delta=0, warmup_epochs=2, base_lr=1,
                         checkpoint_every_minutes=None, dropout=0.0)
    assert (config.fit.min_delta, config.fit.warmup_epochs, config.fit.base_lr) == (0, 2, 1)
    assert config.fit.checkpoint_every_minutes is None  # off: by --checkpoint-every-steps only
    assert TrainConfig(data="d", output="o", tracking=False, min_delta=2.0).fit.min_delta == 2.0  # above any gain


@pytest.mark.parametrize("options, message", [
    (dict(fit=5), "fit= must be a FitOptions, got int"),
    (dict(fit={"batch_size": 4}), "fit= must be a FitOptions, got dict"),
    (dict(fit=5, batch_size=4), "fit= must be a FitOptions, got int"),
    (dict(fit=None), "fit= must be a FitOptions, got NoneType"),
    (dict(model="xception"), "model= must be a ModelOptions, got str"),
    (dict(fit=ModelOptions()), "fit= must be a FitOptions, got ModelOptions"),
])
def test_an_option_group_given_whole_must_be_of_its_class(options, message):
    """Else ``fit=5`` failed later with an AttributeError, ``fit=5, batch_size=4`` in replace()."""
    with pytest.raises(TypeError) as info:
        TrainConfig(data="d", output="o", tracking=False, **options)
    assert str(info.value) == message
    assert TrainConfig(data="d", output="o", tracking=False, fit=FitOptions(batch_size=3), epochs=2).fit == \
        FitOptions(batch_size=3, epochs=2)


@pytest.mark.parametrize("options, message", [
    (dict(batch_size="8"), "batch_size must be an int, got '8' (str)"),
    (dict(batch_size=None), "batch_size must be an int, got None (NoneType)"),
    (dict(batch_size=2.5), "batch_size must be an int, got 2.5 (float)"),
    (dict(batch_size=True), "batch_size must be an int, got True (bool)"),
    (dict(epochs=float("nan")), "epochs must be an int, got nan (float)"),
    (dict(checkpoint_every_steps=2.5), "checkpoint_every_steps must be an int or None, got 2.5 (float)"),
    (dict(resume="no"), "resume must be a bool (True or False), got 'no' (str)"),
    (dict(base_lr="0.1"), "base_lr must be a number (int or float), got '0.1' (str)"),
    (dict(verbose=1), "verbose must be a bool (True or False) or None, got 1 (int)"),
    (dict(xla=True), "xla must be a str, got True (bool)"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_option(options, message):
    from pipelines.runtime.errors import Refused

    with pytest.raises(Refused) as info:
        TrainConfig(data="d", output="o", tracking=False, **options)
    assert str(info.value) == message


def test_a_group_made_directly_and_a_replaced_config_check_their_types_too():
    import dataclasses

    from pipelines.runtime.errors import Refused

    with pytest.raises(Refused, match=r"^batch_size must be an int, got '8' \(str\)$"):
        FitOptions(batch_size="8")
    config = TrainConfig(data="d", output="o", tracking=False)
    assert dataclasses.replace(config, batch_size=8).fit.batch_size == 8
    with pytest.raises(Refused, match=r"^data must be a str, got None \(NoneType\)$"):
        TrainConfig(data=None, output="o", tracking=False)
    with pytest.raises(Refused, match=r"^resume must be a bool"):
        dataclasses.replace(config, resume="yes")

"""Which training run an output belongs to (pipelines/training/records/ownership.py), names read from markers and
records, and files that appear whole (pipelines/io/atomic.py): pure logic on real folders, no
TensorFlow, no Horovod (the end-to-end runs: tests/e2e/test_training_runs.py)."""
import json
import os
import re
import stat

import pytest

from pipelines.io.atomic import PUBLIC, replacing, write_json
from pipelines.contract import CHECKPOINT_NAME, TRAIN_RUN, plain_name
from pipelines.runtime.errors import Refused
from pipelines.io.storage import resolve
from pipelines.training.records import ownership as runs
from pipelines.training.config import TrainConfig
from pipelines.training.records.mirror import Outputs
from pipelines.training.checkpoints.choose import newest_complete_checkpoint
from pipelines.training.checkpoints.names import marker_weights
from tests.support.outputs import checkpoint_bytes


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "etl"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"run_id": "etl-1"}')
    return str(folder)


def config(data, output, **kwargs):
    return TrainConfig(data=data, output=output, backbone="tiny", weights="none", tracking=False, **kwargs)


def write_checkpoint(folder, epoch, run, best=1, weights=None, size=4):
    """A complete checkpoint of ``run`` (a RunIdentity, or None: an unrecorded one) in ``folder``,
    its array of ``size`` values."""
    data = checkpoint_bytes(size)
    with open(os.path.join(folder, f"checkpoint-{epoch}.npz"), "wb") as f:
        f.write(data)
    marker = {"epoch": epoch, "weights": weights or f"checkpoint-{epoch}.npz", "weights_bytes": len(data),
              "early_stopping": {"best_epoch": best}, "history": [], **({"run": run.record()} if run else {})}
    with open(os.path.join(folder, f"checkpoint-{epoch}.json"), "w") as f:
        json.dump(marker, f)


def run_a(data, output, size=1, **kwargs):
    """Run A's identity on ``size`` ranks, its record and checkpoints 1 and 2 written in ``output``
    as its rank 0 would."""
    os.makedirs(output, exist_ok=True)
    a = runs.identify(config(data, output, **kwargs), size)
    write_json(os.path.join(output, TRAIN_RUN), runs.record(a, data))
    write_checkpoint(output, 1, a)
    write_checkpoint(output, 2, a)
    return a


def claim(data, output, resume=False, relaunch=False, overwrite=False, run_id=None, size=1, **kwargs):
    run = runs.identify(config(data, output, **kwargs), size, run_id)
    return runs.claim(resolve(output), run, resume, relaunch, overwrite)


def test_a_new_output_is_a_new_run(data, tmp_path):
    result = claim(data, str(tmp_path / "out"))
    assert result.new and result.marker is None and not result.delete
    assert runs.identify(config(data, str(tmp_path / "o")), 1).run_id != result.run.run_id  # ids are unique


def test_a_new_run_into_another_runs_output_is_refused(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    with pytest.raises(runs.RunRefused, match=f"^--output {out} holds the checkpoints or results of training run "
                                              f"{a.run_id}: --resume continues it, --overwrite replaces it"):
        claim(data, out, base_lr=0.02)
    with pytest.raises(runs.RunRefused, match=f"training run {a.run_id}:"):
        claim(data, out)  # the same settings too: only --resume continues a run


def test_checkpoints_without_a_record_or_run_are_another_runs(data, tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    write_checkpoint(out, 3, None, best=3)  # written before runs were recorded
    with pytest.raises(runs.RunRefused, match=r"training run \(unrecorded\)"):
        claim(data, out)
    with pytest.raises(runs.RunRefused, match="checkpoint checkpoint-3.json in .* is of no recorded training run"):
        claim(data, out, resume=True)


def test_overwrite_deletes_only_what_the_earlier_run_recorded(data, tmp_path):
    out = str(tmp_path / "out")
    run_a(data, out)
    for name in ("metrics.json", "notes.txt", "checkpoint-7.npz"):  # a result of A's; a user's; no marker names it
        (tmp_path / "out" / name).write_text("x")
    os.makedirs(os.path.join(out, "tensorboard", "train"))
    result = claim(data, out, overwrite=True, base_lr=0.02)
    assert result.new and result.marker is None
    assert set(result.delete) == {*runs.RUN_FILES, "checkpoint-2.json", "checkpoint-2.npz", "checkpoint-1.npz",
                                  "checkpoint-1.json", TRAIN_RUN}  # what A's record and markers name
    outputs = Outputs(resolve(out))
    outputs.adopt(result, data)
    assert sorted(os.listdir(out)) == ["checkpoint-7.npz", "notes.txt", TRAIN_RUN]
    record = json.loads((tmp_path / "out" / TRAIN_RUN).read_text())
    assert record["run"] == result.run.record() and record["run"]["config"]["base_lr"] == 0.02
    assert stat.S_IMODE(os.stat(os.path.join(out, TRAIN_RUN)).st_mode) == 0o600  # run state: owner-only


def test_resume_continues_its_own_run_and_refuses_other_settings_or_data(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    result = claim(data, out, resume=True, epochs=9, patience=5)  # epochs and patience may change
    assert result.run.run_id == a.run_id and result.marker["epoch"] == 2 and not result.new and not result.delete
    with pytest.raises(runs.RunRefused, match=rf"^--resume: checkpoint checkpoint-2.json in {out} is of training run "
                                              rf"{a.run_id} with other settings or data: seed 42 there, 7 here; "
                                              rf"base_lr 0.001 there, 0.02 here\. Give the same values"):
        claim(data, out, resume=True, base_lr=0.02, seed=7)
    with open(os.path.join(data, "manifest.json"), "w") as f:
        f.write('{"run_id": "etl-2"}')  # the ETL ran again: other data
    with pytest.raises(runs.RunRefused, match=r"other settings or data: data: ETL run etl-1 \(manifest sha256 "
                                              r"[0-9a-f]{12}\) there, ETL run etl-2 \(manifest sha256 [0-9a-f]{12}\) "
                                              r"here\. Give the same values"):
        claim(data, out, resume=True)


#: What the code before TrainConfig's option groups (a7f0ae1) recorded for these settings: the
#: fingerprint's values and their sha256 (printed by that code's runs.identify), so that --resume
#: of an output it wrote still finds the same run.
RECORDED_BEFORE_GROUPS = [
    # the defaults of that code: its early stopping is --stopping article's (min_delta 0.001)
    ({"stopping": "article"}, {"backbone": "tiny", "weights": "none", "image_size": 0, "dropout": 0.5, "seed": 42, "batch_size": 16,
          "base_lr": 0.001, "warmup_epochs": 0.0, "min_delta": 0.001, "shuffle_buffer": 256, "augment": False,
          "feature_cache": False, "fine_tune_blocks": 0, "fine_tune_lr": 0.01, "fp16_allreduce": False,
          "mixed_precision": False}, "b40ccc32a5d3981d0c32cedf1d42edbba80d665c432e8e2c0d45922e7f6189ad"),
    ({"image_size": 32, "dropout": 0.25, "seed": 7, "batch_size": 4, "base_lr": 0.01, "warmup_epochs": 1.5,
      "min_delta": 0.01, "shuffle_buffer": 64, "augment": "flip", "feature_cache": True, "fine_tune_blocks": 1,
      "fine_tune_lr": 0.1, "fp16_allreduce": True, "mixed_precision": True, "epochs": 5},  # augment: was True
     {"backbone": "tiny", "weights": "none", "image_size": 32, "dropout": 0.25, "seed": 7, "batch_size": 4,
      "base_lr": 0.01, "warmup_epochs": 1.5, "min_delta": 0.01, "shuffle_buffer": 64, "augment": True,
      "feature_cache": True, "fine_tune_blocks": 1, "fine_tune_lr": 0.1, "fp16_allreduce": True,
      "mixed_precision": True}, "161b716dd1cc2e27f24829ce8d8d27936fe28f29937a7424066ef3c956e578ab"),
]
#: Every option the flat config had (its to_dict's keys, MLflow's params, metrics.json's config)
FLAT_OPTIONS = {"data", "output", "epochs", "batch_size", "base_lr", "warmup_epochs", "dropout", "image_size",
                "weights", "backbone", "patience", "min_delta", "cache_dir", "resume", "checkpoint_every_steps",
                "checkpoint_every_minutes", "overwrite", "shuffle_buffer", "seed", "threads", "reader_workers",
                "reader", "bind_cores", "tensorboard", "profile_steps", "verbose", "feature_cache", "augment",
                "fine_tune_blocks", "fine_tune_lr", "fine_tune_epochs", "fp16_allreduce", "mixed_precision", "xla",
                "tracking", "tracking_uri", "experiment", "run_name", "storage_options", "register_model"}
#: The options added since: early stopping's rule, the linear probe, the head's weight decay and start, pictures
ADDED_OPTIONS = {"stopping", "monitor", "patience_steps", "probe", "weight_decay", "deterministic_ops", "head_init",
                 "pictures"}


@pytest.mark.parametrize("options, fingerprint, sha256", RECORDED_BEFORE_GROUPS)
def test_a_run_recorded_before_the_option_groups_is_resumed(options, fingerprint, sha256, data, tmp_path):
    """The option groups change no name a record keeps: the fingerprint is the same values under
    the same names, and --resume continues an output whose record and checkpoint that code wrote."""
    from pipelines.runtime.config import to_dict

    out = str(tmp_path / "out")
    here = config(data, out, **options)
    assert set(to_dict(here)) == FLAT_OPTIONS | ADDED_OPTIONS and TrainConfig(**to_dict(here)) == here
    assert runs.identify(here, 1).config == fingerprint and runs.identify(here, 1).config_sha256 == sha256
    os.makedirs(out)
    before = runs.RunIdentity("20261204T231200Z-0123abcd", fingerprint, runs.identify(here, 1).data_sha256,
                              runs.world_of(here.fit.batch_size, here.fit.base_lr, 1), "etl-1")
    assert before.record()["config_sha256"] == sha256
    write_json(os.path.join(out, TRAIN_RUN), runs.record(before, data))
    write_checkpoint(out, 1, before)
    resumed = claim(data, out, resume=True, **options)
    assert resumed.run.run_id == before.run_id and resumed.marker["_name"] == "checkpoint-1.json"


def test_a_relaunch_continues_only_its_own_run_id(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    result = claim(data, out, relaunch=True, run_id=a.run_id)
    assert result.run.run_id == a.run_id and result.marker["epoch"] == 2
    with pytest.raises(runs.RunRefused, match=f"^a relaunch of training run B-1 found checkpoint checkpoint-2.json of "
                                              f"run {a.run_id} in {out}: another run writes into this --output"):
        claim(data, out, relaunch=True, run_id="B-1")
    with pytest.raises(runs.RunRefused, match="other settings or data: base_lr"):
        claim(data, out, relaunch=True, run_id=a.run_id, base_lr=0.5)


def test_the_record_keeps_the_world_and_the_data_identity(data, tmp_path):
    a = run_a(data, str(tmp_path / "out"), size=4, batch_size=32, base_lr=0.001)
    recorded = json.loads((tmp_path / "out" / TRAIN_RUN).read_text())["run"]
    assert recorded["world"] == {"world_size": 4, "batch_size": 32, "global_batch_size": 128, "learning_rate": 0.004}
    assert recorded["data_run_id"] == "etl-1" and len(recorded["data_sha256"]) == 64
    marker = json.loads((tmp_path / "out" / "checkpoint-2.json").read_text())["run"]
    assert marker == recorded == a.record()


WORLD_4 = "world size 4, batch 32 per rank (global batch 128, lr 0.004)"


@pytest.mark.parametrize("size", [1, 2, 3, 8, 128])
def test_resume_on_another_world_size_continues_the_data_world(size, data, tmp_path):
    """The same --batch-size on 1 to 128 ranks (the global batch's rows): continued, the run's world
    staying the one it started on (its global batch and rate: pipelines/training/dataworld.py)."""
    out = str(tmp_path / "out")
    a = run_a(data, out, size=4, batch_size=32)
    for how in ({"resume": True}, {"relaunch": True, "run_id": a.run_id}):
        kept = claim(data, out, size=size, batch_size=32, **how)
        assert kept.run.run_id == a.run_id and kept.marker["epoch"] == 2 and kept.warnings == []
        assert kept.run.world == a.world and kept.run.record()["world"]["world_size"] == 4


@pytest.mark.parametrize("size, batch, here", [
    (4, 16, "world size 4, batch 16 per rank (global batch 64, lr 0.004)"),  # another --batch-size
    (8, 16, "world size 8, batch 16 per rank (global batch 128, lr 0.008)"),  # the same global batch, another split
    (2, 64, "world size 2, batch 64 per rank (global batch 128, lr 0.002)"),  # the same global batch, another split
])
def test_resume_with_another_per_rank_batch_is_refused_naming_both(size, batch, here, data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out, size=4, batch_size=32)
    expected = (f"--resume: checkpoint checkpoint-2.json in {out} is of training run {a.run_id}, trained with "
                f"{WORLD_4}; this launch has {here}: it continues with --batch-size 32 on 1 to 128 ranks (its global "
                f"batch and learning rate kept), or start afresh with --overwrite or another --output")
    with pytest.raises(runs.RunRefused) as info:
        claim(data, out, resume=True, size=size, batch_size=batch)
    assert str(info.value) == expected
    assert isinstance(info.value, Refused)  # exit 2 at every command line
    with pytest.raises(runs.RunRefused, match=f"^a relaunch: checkpoint checkpoint-2.json in {out} is of training "
                                              f"run {a.run_id}, trained with {re.escape(WORLD_4)}; this launch"):
        claim(data, out, relaunch=True, run_id=a.run_id, size=size, batch_size=batch)
    kept = claim(data, out, resume=True, size=4, batch_size=32)  # the recorded world: continued, nothing to warn
    assert kept.run.run_id == a.run_id and kept.marker["epoch"] == 2 and kept.warnings == []
    assert kept.run.world == a.world


def test_more_ranks_than_the_global_batch_has_rows_are_refused(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out, size=4, batch_size=32)
    with pytest.raises(runs.RunRefused) as info:
        claim(data, out, resume=True, size=129, batch_size=32)
    assert str(info.value) == (
        f"--resume: checkpoint checkpoint-2.json in {out} is of training run {a.run_id}, trained with {WORLD_4}; "
        f"this launch has world size 129, more ranks than its global batch has rows: it continues with --batch-size "
        f"32 on 1 to 128 ranks (its global batch and learning rate kept), or start afresh with --overwrite or "
        f"another --output")


def test_a_world_refusal_names_the_other_differences_too(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out, size=4, batch_size=32)
    with open(os.path.join(data, "manifest.json"), "w") as f:
        f.write('{"run_id": "etl-2"}')
    with pytest.raises(runs.RunRefused, match=rf"^--resume: .* of training run {a.run_id}, trained with .*"
                                              rf"or another --output; it differs in these too: seed 42 there, 7 here; "
                                              rf"data: ETL run etl-1 \(manifest sha256 [0-9a-f]{{12}}\) there, "
                                              rf"ETL run etl-2 \(manifest sha256 [0-9a-f]{{12}}\) here$"):
        claim(data, out, resume=True, size=2, batch_size=16, seed=7)


def test_a_relaunch_on_other_data_is_refused_naming_both_etl_runs(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out, size=2)
    with open(os.path.join(data, "manifest.json"), "w") as f:
        f.write('{"run_id": "etl-2", "more": 1}')
    with pytest.raises(runs.RunRefused, match=rf"^a relaunch: checkpoint checkpoint-2.json in {out} is of training "
                                              rf"run {a.run_id} with other settings or data: data: ETL run etl-1 "
                                              rf"\(manifest sha256 {a.data_sha256[:12]}\) there, ETL run etl-2 "):
        claim(data, out, relaunch=True, run_id=a.run_id, size=2)


def old_checkpoints(data, output, size=1, **kwargs):
    """Run A's record and checkpoints as written before worlds and ETL run ids were recorded."""
    a = run_a(data, output, size, **kwargs)
    old = {key: a.record()[key] for key in ("id", "config", "config_sha256", "data_sha256")}
    for name in (TRAIN_RUN, "checkpoint-1.json", "checkpoint-2.json"):
        path = os.path.join(output, name)
        with open(path) as f:
            content = json.load(f)
        content["run"] = old
        write_json(path, content)
    return a


def test_an_old_record_without_a_world_is_continued_with_a_warning_naming_this_world(data, tmp_path):
    """The rule for records written before worlds were: continue, and say that the world is unchecked
    (nothing tells which world it had; refusing would leave no way to continue it)."""
    out = str(tmp_path / "out")
    a = old_checkpoints(data, out, size=4, batch_size=32)
    result = claim(data, out, resume=True, size=2, batch_size=32)
    assert result.run.run_id == a.run_id and result.marker["epoch"] == 2 and not result.new
    assert result.warnings == [
        f"--resume: checkpoint checkpoint-2.json in {out} of training run {a.run_id} records no world size (written "
        f"before worlds were recorded): continuing it with world size 2, batch 32 per rank (global batch 64, "
        f"lr 0.002), unchecked against the world it was trained with"]
    # from now on its markers record this world and the data's ETL run
    assert result.run.record()["world"]["world_size"] == 2 and result.run.record()["data_run_id"] == "etl-1"
    assert claim(data, out, relaunch=True, run_id=a.run_id, size=2, batch_size=32).warnings[0].startswith(
        "a relaunch: checkpoint checkpoint-2.json")
    with open(os.path.join(data, "manifest.json"), "w") as f:
        f.write('{"run_id": "etl-2"}')
    with pytest.raises(runs.RunRefused, match=r"data: ETL run \(unrecorded\) \(manifest sha256 [0-9a-f]{12}\) "
                                              r"there, ETL run etl-2 "):
        claim(data, out, resume=True, size=2, batch_size=32)


REFUSE = ("import sys; from pipelines.training.cli import main; rc = main(sys.argv[1:]); "
          "print('tensorflow loaded:', 'tensorflow' in sys.modules); sys.exit(rc)")


def test_under_horovodrun_rank_0_refuses_a_resume_with_another_per_rank_batch_before_tensorflow(tmp_path):
    """horovodrun's rank 0 (HOROVOD_RANK, HOROVOD_SIZE set as horovodrun sets them) refuses a resume
    on 1 rank with --batch-size 2 of a run trained on 2 ranks of 4 with exit 2, before TensorFlow
    loads: no rank trains."""
    import subprocess
    import sys

    from pipelines.contract import SPLITS
    from pipelines.manifest import Manifest, SplitInfo

    data = str(tmp_path / "etl")
    os.makedirs(data)
    Manifest(32, 3, ["a", "b", "c"], 2, {s: SplitInfo(rows=40, row_groups=8) for s in SPLITS},
             extra={"run_id": "etl-1"}).write(data)
    out = str(tmp_path / "out")
    a = run_a(data, out, size=2, batch_size=4)
    env = dict(os.environ, HOROVOD_RANK="0", HOROVOD_SIZE="1")
    proc = subprocess.run([sys.executable, "-c", REFUSE, "--data", data, "--output", out, "--backbone", "tiny",
                           "--weights", "none", "--batch-size", "2", "--no-tracking", "--resume"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.strip() == "tensorflow loaded: False"
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "[train rank 0]" in errors[0], proc.stderr
    assert errors[0].endswith(f"--resume: checkpoint checkpoint-2.json in {out} is of training run {a.run_id}, "
                              f"trained with world size 2, batch 4 per rank (global batch 8, lr 0.002); this launch "
                              f"has world size 1, batch 2 per rank (global batch 2, lr 0.001): it continues with "
                              f"--batch-size 4 on 1 to 8 ranks (its global batch and learning rate kept), or start "
                              f"afresh with --overwrite or another --output"), errors


def test_the_driver_check_refuses_before_any_rank_and_deletes_nothing(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    before = sorted(os.listdir(out))
    with pytest.raises(runs.RunRefused):
        runs.check_output_claim(config(data, out), 1)
    assert runs.check_output_claim(config(data, out, overwrite=True), 1).run_id != a.run_id
    assert runs.check_output_claim(config(data, out, resume=True), 1).run_id == a.run_id
    assert runs.check_output_claim(config(data, out, resume=True), 3).world["world_size"] == 1  # its data world
    with pytest.raises(runs.RunRefused, match="world size 1, batch 16 per rank .*; this launch has world size 17, more"):
        runs.check_output_claim(config(data, out, resume=True), 17)
    assert sorted(os.listdir(out)) == before
    with pytest.raises(ValueError, match="--resume continues the run in --output, --overwrite replaces it"):
        config(data, out, resume=True, overwrite=True)


BAD_NAMES = ["/etc/passwd", "../checkpoint-1.npz", "..", ".", "sub/checkpoint-1.npz", "sub\\checkpoint-1.npz",
             "", "model.keras", "checkpoint-0.npz", "checkpoint-1.npz\0", None, 5]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_marker_naming_anything_but_a_checkpoint_beside_it_is_refused_and_never_picked(name, tmp_path):
    with pytest.raises(ValueError, match="checkpoint marker m: the name "):
        marker_weights({"weights": name}, "checkpoint marker m")
    out = str(tmp_path / "out")
    os.makedirs(out)
    write_checkpoint(out, 1, None)
    write_checkpoint(out, 2, None, weights="checkpoint-2.npz")
    with open(os.path.join(out, "checkpoint-2.json")) as f:
        marker = json.load(f)
    marker["weights"] = name
    with open(os.path.join(out, "checkpoint-2.json"), "w") as f:
        json.dump(marker, f)
    assert newest_complete_checkpoint(out)["epoch"] == 1  # the bad marker is ignored, the older one taken


def test_a_markers_own_name_must_be_a_marker_and_weights_must_be_weights():
    assert marker_weights({"weights": "checkpoint-12.npz"}, "m") == "checkpoint-12.npz"
    with pytest.raises(ValueError, match="is a marker's, not a checkpoint's weights"):
        marker_weights({"weights": "checkpoint-12.json"}, "m")
    assert plain_name("checkpoint-3.json", "m", CHECKPOINT_NAME) == "checkpoint-3.json"
    assert plain_name("a b+%=&#?:'~é.txt", "m") == "a b+%=&#?:'~é.txt"  # odd but plain


@pytest.mark.parametrize("name", ["../../victim", "/tmp/victim", "sub/x", "a\\b", ""])
def test_a_records_file_list_naming_a_path_is_refused(name, data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    write_json(os.path.join(out, TRAIN_RUN), {**runs.record(a, data), "files": ["metrics.json", name]})
    with pytest.raises(ValueError, match=f"{TRAIN_RUN}'s files: the name "):
        claim(data, out, overwrite=True)


def test_a_records_file_list_deletes_only_the_names_a_run_writes(data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    write_json(os.path.join(out, TRAIN_RUN), {**runs.record(a, data), "files": ["metrics.json", "notes.txt",
                                                                                  "manifest.json"]})
    assert "notes.txt" not in claim(data, out, overwrite=True).delete


# --- atomic files --------------------------------------------------------------------------------

def test_a_planted_symlink_at_the_old_temporary_name_is_not_followed(tmp_path):
    target = tmp_path / "metrics.json"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for old_name in (f".metrics.json.tmp-{os.getpid()}", f".metrics.json.tmp-{os.getpid()}.json"):
        os.symlink(victim, tmp_path / old_name)  # the name the writer used to choose
    write_json(str(target), {"a": 1})
    assert victim.read_text() == "keep" and json.loads(target.read_text()) == {"a": 1}
    assert not target.is_symlink() and stat.S_IMODE(target.stat().st_mode) == 0o600
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == sorted(["metrics.json", "victim", f".metrics.json.tmp-{os.getpid()}",
                                f".metrics.json.tmp-{os.getpid()}.json"])


def test_a_temporary_file_is_new_private_and_unpredictable_and_removed_on_error(tmp_path):
    path = str(tmp_path / "model.keras")
    with replacing(path, suffix=".keras") as first, replacing(path, suffix=".keras") as second:
        assert first != second and first.endswith(".keras") and os.path.dirname(first) == str(tmp_path)
        assert stat.S_IMODE(os.stat(first).st_mode) == 0o600 and os.path.getsize(first) == 0
        with open(first, "w") as f:
            f.write("one")
        with open(second, "w") as f:
            f.write("two")
    with replacing(path, mode=PUBLIC) as tmp, open(tmp, "w") as f:
        f.write("public")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            raise RuntimeError("killed mid-write")
    assert sorted(os.listdir(tmp_path)) == ["model.keras"] and open(path).read() == "public"


BAD_MARKERS = {  # a field of a marker in another shape: what a hand edit, another tool or damage leaves
    "early-stopping-a-string": lambda m: m.update(early_stopping="x"),
    "early-stopping-missing": lambda m: m.pop("early_stopping"),
    "best-epoch-a-string": lambda m: m.update(early_stopping={"best_epoch": "2"}),
    "epoch-a-string": lambda m: m.update(epoch="x"),
    "epoch-negative": lambda m: m.update(epoch=-1),
    "epoch-huge": lambda m: m.update(epoch=10 ** 400),
    "step-a-bool": lambda m: m.update(step=True),
    "weights-bytes-a-float": lambda m: m.update(weights_bytes=4.0),
    "run-a-string": lambda m: m.update(run="evil"),
    "run-config-a-string": lambda m: m["run"].update(config="x"),
    "world-batch-a-string": lambda m: m["run"]["world"].update(global_batch_size="4"),
    "segments-of-strings": lambda m: m.update(segments=["x"]),
    "phase-3": lambda m: m.update(phase=3),
    "a-list": lambda m: (m.clear(), m.update({"_list": True})),
}


@pytest.mark.parametrize("damage", BAD_MARKERS.values(), ids=BAD_MARKERS.keys())
def test_a_marker_of_another_shape_is_ignored_with_a_warning_and_the_older_one_resumed(damage, data, tmp_path, caplog):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    path = os.path.join(out, "checkpoint-2.json")
    with open(path) as f:
        marker = json.load(f)
    damage(marker)
    with open(path, "w") as f:
        json.dump([] if marker.get("_list") else marker, f)
    result = claim(data, out, resume=True)
    assert result.run.run_id == a.run_id and result.marker["epoch"] == 1
    assert "ignored: checkpoint marker " in caplog.text and "is not a marker's shape: " in caplog.text
    assert "Traceback" not in caplog.text


BAD_RECORDS = {
    "run-a-string": lambda r: r.update(run="evil"),
    "run-missing": lambda r: r.pop("run"),
    "files-a-number": lambda r: r.update(files=5),
    "files-of-numbers": lambda r: r.update(files=[1, 2]),
    "run-id-a-number": lambda r: r["run"].update(id=7),
    "world-size-a-string": lambda r: r["run"]["world"].update(world_size="2"),
}


@pytest.mark.parametrize("how", [{}, {"resume": True}, {"overwrite": True}], ids=["new", "resume", "overwrite"])
@pytest.mark.parametrize("damage", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_a_run_record_of_another_shape_is_refused_by_name_and_nothing_deleted(damage, how, data, tmp_path):
    out = str(tmp_path / "out")
    a = run_a(data, out)
    record = runs.record(a, data)
    damage(record)
    write_json(os.path.join(out, TRAIN_RUN), record)
    before = sorted(os.listdir(out))
    with pytest.raises(runs.RunRefused, match=rf"^{out}/{TRAIN_RUN} is not a training run record of this job \("
                                              rf"[a-z_.]+: (expected|missing).*\): remove it if it is not this job's"):
        claim(data, out, **how)
    assert sorted(os.listdir(out)) == before


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b""], ids=["truncated", "not-utf8", "empty"])
def test_a_run_record_that_is_not_json_is_refused_by_name(content, data, tmp_path):
    out = str(tmp_path / "out")
    run_a(data, out)
    with open(os.path.join(out, TRAIN_RUN), "wb") as f:
        f.write(content)
    with pytest.raises(runs.RunRefused, match=rf"^{out}/{TRAIN_RUN} cannot be read as a training run record"):
        claim(data, out, overwrite=True)

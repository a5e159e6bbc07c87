"""A training run's output belongs to it, end to end (real Horovod ranks on real Parquet): another run
is refused before any rank, ``--overwrite`` replaces only what the earlier run recorded, a relaunch
after a lost rank continues its own checkpoints, ``--resume`` continues on another world size and refuses
other settings, data or per-rank batches. The rules themselves: tests/unit/training/records/test_run_records.py."""
import json
import os
import shutil

import pytest

from pipelines.manifest import manifest_sha256
from tests.support.outputs import read_metrics as metrics
from tests.support.training import error_lines, train

pytestmark = pytest.mark.slow


def read(path):
    with open(path) as f:
        return json.load(f)


def markers(out):
    return {name: read(os.path.join(out, name)) for name in os.listdir(out)
            if name.startswith("checkpoint-") and name.endswith(".json")}


def refused(proc):
    """The one error line of a run refused by its launching driver before any rank, exit 2."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = error_lines(proc.stderr)
    assert len(errors) == 1 and "[train driver]" in errors[0], proc.stderr[-3000:]
    assert "rank 0" not in proc.stderr and "Traceback" not in proc.stderr
    return errors[0]


def test_a_run_never_adopts_another_runs_checkpoints(dataset, tmp_path):  # noqa: F811
    data, _ = dataset
    out = str(tmp_path / "out")
    a = train(data, out, "--epochs", "2", "--patience", "10", np_=0)  # run A, alone: lr 0.001
    assert a.returncode == 0, a.stderr[-3000:]
    run_a = read(os.path.join(out, "train_run.json"))["run"]["id"]
    assert {m["run"]["id"] for m in markers(out).values()} == {run_a}
    before = {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))
              if os.path.isfile(os.path.join(out, name))}

    b_args = ("--epochs", "3", "--patience", "10", "--base-lr", "0.02", "--spark-np", "-2")
    line = refused(train(data, out, *b_args, np_=0))  # run B into A's output
    assert f"holds the checkpoints or results of training run {run_a}: --resume continues it, --overwrite " \
           f"replaces it" in line, line
    assert {name: open(os.path.join(out, name), "rb").read() for name in before} == before  # A's, untouched

    with open(os.path.join(out, "notes.txt"), "w") as f:  # not A's: no record names it
        f.write("mine")
    # B with --overwrite; B's rank 1 lost after B's epoch 1; the relaunch continues B's checkpoint 1
    b = train(data, out, *b_args, "--overwrite", "--max-failures", "1", np_=0,
              env={"PIPELINES_FAULT_INJECT": "rank=1,epoch=1,mode=kill"})
    assert b.returncode == 0, b.stderr[-3000:]
    m = metrics(out)
    run_b = read(os.path.join(out, "train_run.json"))["run"]["id"]
    assert run_b != run_a and m["run_id"] == run_b and len(m["attempts"]) == 2 and m["resumed_after_epoch"] == 1
    assert [h["epoch"] for h in m["history"]] == [1, 2, 3]
    assert [h["lr"] for h in m["history"]] == pytest.approx([0.04] * 3)  # B's 0.02 x 2 ranks, never A's
    assert m["config"]["base_lr"] == 0.02 and open(os.path.join(out, "notes.txt")).read() == "mine"
    assert {mk["run"]["id"] for mk in markers(out).values()} == {run_b}

    # --resume continues B (more epochs may be asked for), on one local rank too: the run keeps the
    # world it started on, its global batch 8 and rate 0.04 (pipelines/training/dataworld.py) ...
    resumed = train(data, out, *b_args[:1], "4", *b_args[2:-1], "-1", "--resume", np_=0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    m = metrics(out)
    assert m["resumed_after_epoch"] == 3 and [h["epoch"] for h in m["history"]] == [1, 2, 3, 4]
    assert read(os.path.join(out, "train_run.json"))["run"]["id"] == run_b
    assert (m["world_size"], m["global_batch_size"], m["per_rank_batches"]) == (1, 8, [8])
    assert [h["lr"] for h in m["history"]] == pytest.approx([0.04] * 4)
    assert [(s["world_size"], s["from_epoch"], s["reason"]) for s in m["segments"]] == \
        [(2, 1, "start"), (2, 2, "relaunch"), (1, 4, "resume")]
    assert {mk["run"]["world"]["world_size"] for mk in markers(out).values()} == {2}  # its data world, still
    # ... but not with another --batch-size (another data world). Refused by the driver before any
    # rank starts, the output untouched.
    kept = {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))
            if os.path.isfile(os.path.join(out, name))}
    line = refused(train(data, out, *b_args[:1], "5", *b_args[2:], "--batch-size", "2", "--resume", np_=0,
                         timeout=120))
    assert f"--resume: checkpoint checkpoint-4.json in {out} is of training run {run_b}, trained with world size 2, " \
           f"batch 4 per rank (global batch 8, lr 0.04); this launch has world size 2, batch 2 per rank (global " \
           f"batch 4, lr 0.04): it continues with --batch-size 4 on 1 to 8 ranks" in line, line
    assert {name: open(os.path.join(out, name), "rb").read() for name in kept} == kept
    # ... nor with other settings, nor on other data (the ETL ran again: another manifest)
    line = refused(train(data, out, "--epochs", "5", "--spark-np", "-2", "--resume", np_=0))
    assert f"is of training run {run_b} with other settings or data: base_lr 0.02 there, 0.001 here" in line, line
    other = str(tmp_path / "etl-again")
    shutil.copytree(data, other)
    manifest = read(os.path.join(other, "manifest.json"))
    with open(os.path.join(other, "manifest.json"), "w") as f:
        # another manifest of the same parts (a run's id must name its parts' folder, so it stays)
        json.dump({**manifest, "created_utc": "2026-01-01T00:00:00+00:00"}, f)
    line = refused(train(other, out, *b_args[:1], "5", *b_args[2:], "--resume", np_=0))
    assert f"other settings or data: data: ETL run {manifest['run_id']} (manifest sha256 " in line, line
    assert f") there, ETL run {manifest['run_id']} (manifest sha256 {manifest_sha256(other)[:12]}) here" in line, line

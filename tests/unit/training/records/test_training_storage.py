"""Training's storage parts against the suite's real moto_server, without training (the end-to-end
runs are in test_training_hvd.py): rank 0's outputs on a URI (pipelines/training/records/mirror.py), the
remote resume rule, and the legacy-API filesystem Petastorm reads a URI through."""
import json
import os
import pickle

import pytest

from pipelines.io.storage import resolve
from pipelines.training.data import petastorm_available
from pipelines.training.records.mirror import Outputs, open_outputs
from pipelines.training.checkpoints.choose import newest_complete_checkpoint
from tests.support.outputs import checkpoint_bytes


def write(folder, name, data: bytes):
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def marker(epoch, size, best=1):
    return json.dumps({"epoch": epoch, "weights": f"checkpoint-{epoch}.npz", "weights_bytes": size,
                       "early_stopping": {"best_epoch": best}, "history": []}).encode()


def names(location):
    return {i.path[len(location.path) + 1:] for i in location.list() if i.is_file}


def test_a_local_output_is_written_in_place(tmp_path):
    outputs = open_outputs(str(tmp_path / "out"))
    assert outputs.local == str(tmp_path / "out") and outputs.remote is None and os.path.isdir(outputs.local)
    outputs.push()
    assert outputs.finish() == str(tmp_path / "out") and os.path.isdir(outputs.local)


def test_push_mirrors_changes_and_prunes_checkpoints_then_finish_removes_the_local_folder(s3_bucket):
    outputs = open_outputs(f"s3://{s3_bucket}/run")
    remote, local = outputs.remote, outputs.local
    for epoch in (1, 2):
        write(local, f"checkpoint-{epoch}.npz", checkpoint_bytes(10 + epoch))
        write(local, f"checkpoint-{epoch}.json", marker(epoch, len(checkpoint_bytes(10 + epoch))))
    write(local, "tensorboard/train/events.1", b"e1")
    outputs.push(last="checkpoint-2.json")
    assert names(remote) == {"checkpoint-1.npz", "checkpoint-1.json", "checkpoint-2.npz", "checkpoint-2.json",
                             "tensorboard/train/events.1"}
    os.remove(os.path.join(local, "checkpoint-1.npz"))  # pruned locally: pruned remotely at the next push
    os.remove(os.path.join(local, "checkpoint-1.json"))
    write(local, "tensorboard/train/events.1", b"e1e2")
    outputs.push()
    assert names(remote) == {"checkpoint-2.npz", "checkpoint-2.json", "tensorboard/train/events.1"}
    assert remote.join("tensorboard/train/events.1").read_bytes() == b"e1e2"
    write(local, "metrics.json", b"{}")
    assert outputs.finish() == f"s3://{s3_bucket}/run"
    assert "metrics.json" in names(remote) and not os.path.exists(local)


def test_resume_takes_the_newest_remote_checkpoint_whose_weights_are_whole(s3_bucket, tmp_path):
    remote = resolve(f"s3://{s3_bucket}/run")
    for epoch, size in ((1, 11), (2, 12), (3, 13)):
        remote.join(f"checkpoint-{epoch}.npz").write_bytes(checkpoint_bytes(size))
    remote.join("checkpoint-1.json").write_bytes(marker(1, len(checkpoint_bytes(11))))
    remote.join("checkpoint-2.json").write_bytes(marker(2, len(checkpoint_bytes(12)), best=1))
    remote.join("checkpoint-3.json").write_bytes(marker(3, 99))  # its weights are not the size it says
    remote.join("history.csv").write_bytes(b"epoch,loss\n0,1.0\n1,0.5\n")
    assert newest_complete_checkpoint(remote)["epoch"] == 2
    outputs = Outputs(remote)
    outputs.pull_resume_state(newest_complete_checkpoint(remote))
    assert sorted(os.listdir(outputs.local)) == ["checkpoint-1.npz", "checkpoint-2.json", "checkpoint-2.npz",
                                                 "history.csv"]
    assert newest_complete_checkpoint(outputs.local)["epoch"] == 2  # what restore() then reads, locally
    before = names(remote)
    outputs.push()  # nothing changed: nothing uploaded again; nothing deleted (no name is this run's and gone)
    assert names(remote) == before
    assert newest_complete_checkpoint(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("name", ["/checkpoint-2.npz", "/{bucket}/elsewhere/checkpoint-2.npz",
                                  "../checkpoint-2.npz", "sub/checkpoint-2.npz", "", "metrics.json"])
def test_a_remote_marker_naming_anything_but_its_own_checkpoint_is_never_resumed(s3_bucket, name, tmp_path):
    """An absolute name crashed --resume on S3, a ``../`` one wrote outside the local folder: such a
    marker is ignored, the older whole checkpoint resumed, nothing downloaded outside the folder."""
    remote = resolve(f"s3://{s3_bucket}/run")
    remote.parent.join("elsewhere", "checkpoint-2.npz").write_bytes(checkpoint_bytes(12))
    remote.parent.join("checkpoint-2.npz").write_bytes(checkpoint_bytes(12))
    for epoch in (1, 2):
        remote.join(f"checkpoint-{epoch}.npz").write_bytes(checkpoint_bytes(10 + epoch))
    remote.join("checkpoint-1.json").write_bytes(marker(1, len(checkpoint_bytes(11))))
    bad = json.loads(marker(2, len(checkpoint_bytes(12))))
    remote.join("checkpoint-2.json").write_bytes(json.dumps({**bad, "weights": name.format(bucket=s3_bucket)}).encode())
    found = newest_complete_checkpoint(remote)
    assert found["epoch"] == 1
    outputs = Outputs(remote)
    outputs.pull_resume_state(found)
    assert sorted(os.listdir(outputs.local)) == ["checkpoint-1.json", "checkpoint-1.npz"]
    assert not os.path.exists(os.path.join(os.path.dirname(outputs.local), "checkpoint-2.npz"))


def test_pruning_deletes_this_runs_checkpoints_only_never_another_runs_in_a_shared_prefix(s3_bucket):
    """Run A's checkpoints 1..3 lie in the prefix B writes into (the claim was bypassed, as a second
    writer racing B would): B's pruning deletes B's own older checkpoints (pushed by this process,
    or named by markers of B's run id), never A's, whatever their epoch numbers."""
    from pipelines.training.records.ownership import Claim, RunIdentity
    remote = resolve(f"s3://{s3_bucket}/shared")
    a = {"id": "A", "config": {}, "data_sha256": "d"}
    for epoch in (1, 2, 3):
        remote.join(f"checkpoint-{epoch}.npz").write_bytes(checkpoint_bytes(5))
        remote.join(f"checkpoint-{epoch}.json").write_bytes(json.dumps(
            {"epoch": epoch, "weights": f"checkpoint-{epoch}.npz", "weights_bytes": len(checkpoint_bytes(5)), "run": a,
             "early_stopping": {"best_epoch": 1}, "history": []}).encode())
    remote.join("checkpoint-9.npz").write_bytes(checkpoint_bytes(3))  # B's own, from an earlier process of run B
    remote.join("checkpoint-9.json").write_bytes(json.dumps(
        {"epoch": 9, "weights": "checkpoint-9.npz", "weights_bytes": len(checkpoint_bytes(3)), "run": {"id": "B"},
         "early_stopping": {"best_epoch": 9}, "history": []}).encode())
    outputs = Outputs(remote)
    outputs.adopt(Claim(RunIdentity("B", {}, "d")), "data")  # no deletion, no record: a relaunch's view
    for epoch in (4, 5):  # B's epochs: B keeps only its newest locally
        write(outputs.local, f"checkpoint-{epoch}.npz", checkpoint_bytes(4))
        write(outputs.local, f"checkpoint-{epoch}.json", marker(epoch, len(checkpoint_bytes(4))))
        outputs.push(last=f"checkpoint-{epoch}.json")
        if epoch == 4:
            os.remove(os.path.join(outputs.local, "checkpoint-4.npz"))
            os.remove(os.path.join(outputs.local, "checkpoint-4.json"))
    left = names(remote)
    assert {f"checkpoint-{e}.{x}" for e in (1, 2, 3) for x in ("npz", "json")} <= left  # A's, untouched
    assert not {"checkpoint-4.npz", "checkpoint-4.json", "checkpoint-9.npz", "checkpoint-9.json"} & left  # B's
    assert {"checkpoint-5.npz", "checkpoint-5.json"} <= left


@pytest.mark.skipif(not petastorm_available(), reason="the legacy filesystem is Petastorm's, which cannot run here")
def test_the_parts_filesystem_answers_petastorms_calls_for_its_parts_alone_and_pickles(s3_bucket, tmp_path):
    """In a bucket and on a local disk: only the parts are files, no path is a folder (Petastorm
    would read its _common_metadata), nothing is listed, a part opens as its bytes."""
    from pipelines.io.pinned import pin
    from pipelines.training.data.petastorm.legacy_fs import PinnedPartsFileSystem, petastorm_url
    local = resolve(str(tmp_path / "etl"))
    for root in (resolve(f"s3://{s3_bucket}/etl"), local):
        root.join("train", "part-0.parquet").write_bytes(b"PAR1")
        root.join("train", "sub", "part-1.parquet").write_bytes(b"PAR11")
        parts = [pin(root, "train/part-0.parquet"), pin(root, "train/sub/part-1.parquet")]
        fs = pickle.loads(pickle.dumps(PinnedPartsFileSystem(parts)))
        top = ("" if root.local else "/") + root.path + "/train"  # Petastorm's path of the URLs' folder
        assert petastorm_url(parts[0]) == f"file://{top}/part-0.parquet"
        assert not fs.isdir(top) and not fs.exists(top) and not fs.isfile(top)
        assert fs.isfile(top + "/part-0.parquet") and not fs.isdir(top + "/part-0.parquet")
        assert not fs.exists(top + "/missing")
        for listing in (fs.ls, lambda path: list(fs.walk(path))):
            with pytest.raises(OSError, match="never listed"):
                listing(top)
        with fs.open(top + "/sub/part-1.parquet") as f:
            assert f.read() == b"PAR11"
        with pytest.raises(FileNotFoundError):
            fs.open(top + "/part-2.parquet")

"""Training's storage parts against the suite's real moto_server, without training (the end-to-end
runs are in test_training_hvd.py): rank 0's outputs on a URI (pipelines/training/outputs.py), the
remote resume rule, and the legacy-API filesystem Petastorm reads a URI through."""
import json
import os
import pickle

import pytest

from pipelines.storage import resolve
from pipelines.training.data import petastorm_available
from pipelines.training.outputs import Outputs, open_outputs
from pipelines.training.schedule import newest_complete_checkpoint


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
        write(local, f"checkpoint-{epoch}.npz", b"w" * (10 + epoch))
        write(local, f"checkpoint-{epoch}.json", marker(epoch, 10 + epoch))
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
        remote.join(f"checkpoint-{epoch}.npz").write_bytes(b"w" * size)
    remote.join("checkpoint-1.json").write_bytes(marker(1, 11))
    remote.join("checkpoint-2.json").write_bytes(marker(2, 12, best=1))
    remote.join("checkpoint-3.json").write_bytes(marker(3, 99))  # its weights are not the size it says
    remote.join("history.csv").write_bytes(b"epoch,loss\n0,1.0\n1,0.5\n")
    assert newest_complete_checkpoint(remote)["epoch"] == 2
    outputs = Outputs(remote)
    assert outputs.pull_resume_state() == 2
    assert sorted(os.listdir(outputs.local)) == ["checkpoint-1.npz", "checkpoint-2.json", "checkpoint-2.npz",
                                                 "history.csv"]
    assert newest_complete_checkpoint(outputs.local)["epoch"] == 2  # what restore() then reads, locally
    outputs.push()  # nothing changed: nothing uploaded again, nothing of the remote pruned but epoch 3
    assert names(remote) == {"checkpoint-1.npz", "checkpoint-2.json", "checkpoint-2.npz", "history.csv"}
    assert newest_complete_checkpoint(str(tmp_path / "missing")) is None


@pytest.mark.skipif(not petastorm_available(), reason="the legacy filesystem is Petastorm's, which cannot run here")
def test_the_legacy_filesystem_answers_petastorms_calls_and_pickles(s3_bucket):
    from pipelines.training.legacy_fs import LegacyFileSystem, petastorm_url
    root = resolve(f"s3://{s3_bucket}/etl")
    root.join("train", "part-0.parquet").write_bytes(b"PAR1")
    root.join("train", "sub", "part-1.parquet").write_bytes(b"PAR11")
    fs = pickle.loads(pickle.dumps(LegacyFileSystem(root.filesystem)))
    url = petastorm_url(root.join("train", "part-0.parquet"))
    assert url == f"file:///{s3_bucket}/etl/train/part-0.parquet"
    top = f"/{s3_bucket}/etl/train"  # Petastorm's path of the URL
    assert fs.isdir(top) and not fs.isfile(top) and fs.isfile(top + "/part-0.parquet") and fs.exists(top)
    assert not fs.exists(top + "/missing")
    assert fs.ls(top) == [top + "/part-0.parquet", top + "/sub"]
    assert list(fs.walk(top)) == [(top, ["sub"], ["part-0.parquet"]), (top + "/sub", [], ["part-1.parquet"])]
    with fs.open(top + "/sub/part-1.parquet") as f:
        assert f.read() == b"PAR11"

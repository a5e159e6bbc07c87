"""Damaged checkpoints: each checkpoint's sha256 is in its marker; ``--resume`` and relaunches pass
over a damaged or unreadable file (named in one warning) and resume the newest sound one, or
refuse (exit 2) naming every file when none is sound. Real ``.npz`` files, no TensorFlow."""
import hashlib
import json
import os

import numpy as np
import pytest

from pipelines.io.storage import resolve
from pipelines.runtime.errors import Refused
from pipelines.training.config import TrainConfig
from pipelines.training.checkpoints.files import DamagedCheckpoint, read_checkpoint
from pipelines.training.records import ownership as runs
from pipelines.training.checkpoints.choose import sound_checkpoint
from pipelines.training.checkpoints.names import checkpoint_path, marker_path, step_checkpoint_path, step_marker_path


def write_checkpoint(directory, epoch, best=None, step=0, run=None, sha=True):
    """A checkpoint as the checkpointer writes it: its ``.npz`` (values following ``epoch`` and
    ``step``), then its marker with size, sha256, history and early-stopping state."""
    weights = step_checkpoint_path(directory, epoch + 1, step) if step else checkpoint_path(directory, epoch)
    with open(weights, "wb") as f:
        np.savez(f, trainable_0000=np.full((3, 2), epoch + step / 100, np.float32), optimizer_0000=np.array(epoch))
    data = open(weights, "rb").read()
    history = [{"epoch": e, "loss": 1.0 / e, "val_accuracy": 0.5 + e / 100} for e in range(1, epoch + 1)]
    best = epoch if best is None else best
    marker = {"epoch": epoch, "weights": os.path.basename(weights), "weights_bytes": len(data),
              "history": history, "logs": None if step else history[-1],
              "early_stopping": {"best": 0.5 + best / 100, "wait": epoch - best, "best_epoch": best, "stopped": False,
                                 "monitor": "val_accuracy"},
              **({"step": step} if step else {}), **({"run": run.record()} if run else {})}
    if sha:
        marker["weights_sha256"] = hashlib.sha256(data).hexdigest()
    with open(step_marker_path(directory, epoch + 1, step) if step else marker_path(directory, epoch), "w") as f:
        json.dump(marker, f)
    return weights


def nul_filled(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(b"\0" * size)


def flipped_at(where):
    def damage(path):
        data = bytearray(open(path, "rb").read())
        data[int(where * (len(data) - 1))] ^= 0x01
        with open(path, "wb") as f:
            f.write(bytes(data))
    return damage


def truncated(path):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


DAMAGES = {"NUL-filled": nul_filled, "a bit flipped in the header": flipped_at(0.0),
           "a bit flipped in the data": flipped_at(0.5), "a bit flipped in the directory": flipped_at(1.0),
           "truncated": truncated, "missing": os.remove}
WHY = {"NUL-filled": "sha256", "a bit flipped in the header": "sha256", "a bit flipped in the data": "sha256",
       "a bit flipped in the directory": "sha256", "truncated": "bytes, its marker records", "missing": "missing"}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_newest_checkpoint_is_passed_over_named_and_the_older_sound_one_resumed(tmp_path, damage, caplog):
    d = str(tmp_path)
    write_checkpoint(d, 1)
    DAMAGES[damage](write_checkpoint(d, 2))
    marker, passed = sound_checkpoint(d)
    assert marker["epoch"] == 1 and marker["_name"] == "checkpoint-1.json"
    assert len(passed) == 1 and passed[0].startswith("checkpoint-2.npz (") and WHY[damage] in passed[0]
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith(f"ignored: checkpoint checkpoint-2.npz in {d} is damaged (") and "\n" not in line


@pytest.mark.parametrize("damage", ["NUL-filled", "a bit flipped in the array", "truncated", "missing"])
def test_a_marker_without_a_checksum_still_passes_over_a_file_that_does_not_read(tmp_path, damage):
    """A marker written before checksums: the file must read whole (its size checked, every
    member's CRC-32); a NUL-filled one of the right size is no longer an unnamed np.load error.
    (A flip in a field no reader checks, a local header's time, passes: the sha256 is what finds it.)"""
    d = str(tmp_path)
    write_checkpoint(d, 1, sha=False)
    path = write_checkpoint(d, 2, sha=False)
    if damage == "a bit flipped in the array":
        data = bytearray(open(path, "rb").read())
        data[data.index(np.full((3, 2), 2.0, np.float32).tobytes()) + 5] ^= 0x01
        open(path, "wb").write(bytes(data))
    else:
        DAMAGES[damage](path)
    marker, passed = sound_checkpoint(d)
    assert marker["epoch"] == 1 and passed[0].startswith("checkpoint-2.npz (")


@pytest.mark.parametrize("damage", ["NUL-filled", "a bit flipped in the data", "missing"])
def test_a_damaged_best_epoch_file_resumes_the_sound_newer_checkpoint_with_its_epoch_as_the_best(tmp_path, damage,
                                                                                                 caplog):
    d = str(tmp_path)
    write_checkpoint(d, 2)
    write_checkpoint(d, 5, best=2)  # the pruned output: the newest and the best
    DAMAGES[damage](checkpoint_path(d, 2))
    marker, passed = sound_checkpoint(d)
    assert marker["_name"] == "checkpoint-5.json" and passed[0].startswith("checkpoint-2.npz (")
    assert marker["early_stopping"] == {"best": pytest.approx(0.55), "wait": 0, "best_epoch": 5, "stopped": False,
                                        "monitor": "val_accuracy"}
    assert json.load(open(marker_path(d, 5)))["early_stopping"]["best_epoch"] == 2  # the file is left as it was
    assert f"checkpoint checkpoint-2.npz in {d}, the best epoch's weights, is damaged" in caplog.text
    assert "resuming checkpoint-5.json with epoch 5 as the best so far" in caplog.text


def test_a_step_checkpoint_whose_best_is_damaged_takes_its_last_epoch_as_the_best_when_that_file_is_sound(tmp_path):
    d = str(tmp_path)
    write_checkpoint(d, 1)
    write_checkpoint(d, 3, best=1)
    write_checkpoint(d, 3, best=1, step=7)  # within epoch 4
    nul_filled(checkpoint_path(d, 1))
    marker, _ = sound_checkpoint(d)
    assert marker["_name"] == "checkpoint-4-step-7.json" and marker["early_stopping"]["best_epoch"] == 3
    nul_filled(checkpoint_path(d, 3))  # and epoch 3's too: nothing sound is left
    marker, passed = sound_checkpoint(d)
    assert marker is None and [p.split(" ")[0] for p in passed] == ["checkpoint-1.npz", "checkpoint-3.npz",
                                                                     "checkpoint-1.npz"]


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "etl"
    folder.mkdir()
    (folder / "manifest.json").write_text('{"run_id": "etl-1"}')
    return str(folder)


def identity(data, output):
    config = TrainConfig(data=data, output=output, backbone="tiny", weights="none", tracking=False)
    return runs.identify(config, 1)


@pytest.mark.parametrize("relaunch", [False, True])
def test_resume_with_every_checkpoint_damaged_is_refused_naming_the_files(data, tmp_path, relaunch):
    out = str(tmp_path / "out")
    os.makedirs(out)
    run = identity(data, out)
    write_checkpoint(out, 2, run=run)
    write_checkpoint(out, 4, best=2, run=run)
    nul_filled(checkpoint_path(out, 2))
    truncated(checkpoint_path(out, 4))
    with pytest.raises(runs.RunRefused) as refused:
        runs.claim(resolve(out), run, resume=not relaunch, relaunch=relaunch, overwrite=False)
    message = str(refused.value)
    assert isinstance(refused.value, Refused)  # exit 2, before any rank
    assert message.startswith(f"{'a relaunch' if relaunch else '--resume'}: no sound checkpoint in {out}")
    assert "checkpoint-4.npz (" in message and "checkpoint-2.npz (" in message and "\n" not in message
    write_checkpoint(out, 4, best=4, run=run)  # a sound copy put back
    assert runs.claim(resolve(out), run, resume=True, relaunch=False, overwrite=False).marker["epoch"] == 4


def test_a_damaged_file_is_named_when_loaded(tmp_path):
    from pipelines.training.checkpoints.files import load_checkpoint
    path = write_checkpoint(str(tmp_path), 1)
    assert sorted(read_checkpoint(resolve(path))) == ["optimizer_0000", "trainable_0000"]
    nul_filled(path)
    with pytest.raises(DamagedCheckpoint, match=f"checkpoint {path}: not a readable .npz"):
        load_checkpoint(None, path)

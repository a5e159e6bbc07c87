"""Exit codes tell bad input from failure (issue 35, item 9): a ``Refused`` alone is exit 2 and
one line; anything else is exit 1 with its redacted traceback, on the failing rank and at the
driver. The commands run in this process (their ``main``), the internal error injected into a
pure function of the work; no Spark, no rank starts."""
import json
import logging
import socket

import pytest

from pipelines.runtime.errors import MissingInput, NotAFolder, Refused, exit_status, failure_text

SECRET = "S3CR3T-hunter2"


def _internal(kind=KeyError):
    """An internal error quoting a secret, chained to a cause quoting another (a real traceback's
    shape: raised inside the work, the secret in the message and in the source line)."""
    def fail(*_args, **_kwargs):
        try:
            raise OSError(f"store said no: password={SECRET}")
        except OSError as cause:
            raise kind(f"lookup of secret_key={SECRET} failed") from cause
    return fail


def _assert_failure(err: str, kind: str, where: str = ""):
    """``err`` holds exit 1's last words: ``[WHERE ]failed:``, the whole traceback with its
    chained cause, every secret masked."""
    assert f"ERROR {f'{where} ' if where else ''}failed:\nTraceback (most recent call last):" in err, err
    assert "The above exception was the direct cause of the following exception:" in err, err
    assert f"{kind}: " in err and "secret_key=***" in err and "password=***" in err, err
    assert SECRET not in err, err


def _assert_refusal(err: str, text: str):
    """``err`` is exit 2's one line: the refusal's message, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and text in lines[0] and "Traceback" not in err, err


# -- which exceptions are refusals ------------------------------------------------------------

def _refusal_types():
    from pipelines.etl.listing import UnsupportedTree
    from pipelines.launch.failures import ClusterConfigError
    from pipelines.io.paths import UnsafePathError
    from pipelines.predict.inputs import NoImages
    from pipelines.predict.model import ModelContractError, UnsafeModel
    from pipelines.io.storage import StorageError
    from pipelines.tracking import TrackingUnavailable
    from pipelines.training.data import DataError
    from pipelines.training.data.errors import ImageSizeError
    from pipelines.training.model.imagenet import WeightsUnavailable
    from pipelines.training.data.rowcache import CacheFolderError
    from pipelines.training.records.ownership import RunRefused

    return [UnsupportedTree, ClusterConfigError, UnsafePathError, NoImages, ModelContractError, UnsafeModel,
            StorageError, TrackingUnavailable, DataError, ImageSizeError, WeightsUnavailable, CacheFolderError,
            RunRefused, MissingInput, NotAFolder]


def _failure_types():
    from pipelines.etl.commit import RunSuperseded
    from pipelines.etl.images import ImageRejected
    from pipelines.etl.job import NothingWritten
    from pipelines.launch.failures import HorovodJobFailed, RelaunchImpossible
    from pipelines.tracking import TrackingFailed
    from pipelines.training.data import ShardCountError
    from pipelines.training.data.rowcache import DamagedEntry

    return [RunSuperseded, ImageRejected, NothingWritten, HorovodJobFailed, RelaunchImpossible, TrackingFailed,
            ShardCountError, DamagedEntry]


def test_every_bad_input_type_is_a_refusal_and_no_failure_type_is():
    assert all(issubclass(t, Refused) for t in _refusal_types()), [t for t in _refusal_types()
                                                                    if not issubclass(t, Refused)]
    assert not any(issubclass(t, Refused) for t in _failure_types())
    # still what callers caught before they were refusals
    assert issubclass(MissingInput, FileNotFoundError) and issubclass(NotAFolder, NotADirectoryError)
    assert issubclass(Refused, ValueError)


def _checks(tmp_path):
    """Input checks of every stage and the launch, each with what it must refuse."""
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.memory import check_task_memory, parse_size_mib
    from pipelines.launch.config import LaunchConfig
    from pipelines.launch.gpus import check_local_gpus
    from pipelines.launch.network import interface_of
    from pipelines.predict.config import PredictConfig
    from pipelines.predict.inputs import plan_input
    from pipelines.training.config import TrainConfig
    from pipelines.training.schedule import plan_steps

    out = str(tmp_path / "out")
    return {
        "train --batch-size 0": lambda: TrainConfig(data=str(tmp_path), output=out, batch_size=0),
        "train --fine-tune-blocks": lambda: TrainConfig(data=str(tmp_path), output=out, fine_tune_blocks=99),
        "train --backbone": lambda: TrainConfig(data=str(tmp_path), output=out, backbone="nope"),
        "etl --input glob": lambda: ETLConfig(input=str(tmp_path / "a*"), output=out),
        "etl --max-pixels": lambda: ETLConfig(input=str(tmp_path), output=out, max_pixels=0),
        "predict --batch-size": lambda: PredictConfig(model="m", input=str(tmp_path), output=out, batch_size=0),
        "launch --spark-np": lambda: LaunchConfig(np=1.5),
        "more ranks than GPUs": lambda: check_local_gpus(3, 2),
        "an interface that does not exist": lambda: interface_of("127.0.0.1", "nosuchif0"),
        "a Spark memory string": lambda: parse_size_mib("lots"),
        "task memory": lambda: check_task_memory(2**30, (4, 2**30, "spark.executor.memory")),
        "global batch above the train split": lambda: plan_steps(10, 4, 8, 2),
        "a missing predict input": lambda: plan_input(str(tmp_path / "none"), [], 8, 2**20),
    }


CHECKS = ("train --batch-size 0", "train --fine-tune-blocks", "train --backbone", "etl --input glob",
          "etl --max-pixels", "predict --batch-size", "launch --spark-np", "more ranks than GPUs",
          "an interface that does not exist", "a Spark memory string", "task memory",
          "global batch above the train split", "a missing predict input")


def test_the_table_of_checks_is_whole(tmp_path):
    assert tuple(_checks(tmp_path)) == CHECKS


@pytest.mark.parametrize("check", CHECKS)
def test_input_checks_raise_refusals(check, tmp_path):
    with pytest.raises(Refused):
        _checks(tmp_path)[check]()


def test_a_missing_path_is_a_refusal_and_still_a_file_not_found_error(tmp_path):
    from pipelines.etl.listing import list_files

    with pytest.raises(MissingInput) as missing:
        list_files(str(tmp_path / "none"))
    assert isinstance(missing.value, FileNotFoundError)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotAFolder) as not_folder:
        list_files(str(tmp_path / "file"))
    assert isinstance(not_folder.value, NotADirectoryError)


# -- the helpers every command shares --------------------------------------------------------

def test_exit_status_is_2_and_one_line_for_a_refusal_else_1_and_the_traceback(caplog):
    log = logging.getLogger("test-exit-status")
    with caplog.at_level(logging.ERROR, logger="test-exit-status"):
        assert exit_status(Refused(f"--data refused (token={SECRET})"), log) == 2
        assert caplog.messages == ["--data refused (token=***)"]
        caplog.clear()
        assert exit_status(Refused("said by rank 0"), log, "rank 1 on h", say_refusal=False) == 2
        assert caplog.messages == []
        try:
            _internal(RuntimeError)()
        except RuntimeError as exc:
            assert exit_status(exc, log, "rank 1 on h") == 1
            assert failure_text(exc) in caplog.messages[0]
    _assert_failure("ERROR " + caplog.messages[0], "RuntimeError", "rank 1 on h")


# -- the command lines, in this process -----------------------------------------------------

def test_etl_exits_1_with_the_traceback_when_its_work_breaks_and_2_for_bad_input(tmp_path, capsys, monkeypatch):
    """An internal KeyError in the driver's split assignment (before Spark): exit 1, the whole
    traceback, redacted; the same command with a missing input: exit 2, one line."""
    import pipelines.etl.plan as etl_plan
    from pipelines.etl.cli import main
    from tests.support.imagegen import make_tree

    root = str(tmp_path / "tree")
    make_tree(root, classes=2, per_class=3, bad=False)
    monkeypatch.setattr(etl_plan, "assign_splits", _internal(KeyError))
    args = ["--output", str(tmp_path / "out"), "--no-tracking", "--image-size", "8"]
    assert main(["--input", root, *args]) == 1
    _assert_failure(capsys.readouterr().err, "KeyError")
    assert not (tmp_path / "out").exists()
    assert main(["--input", str(tmp_path / "none"), *args]) == 2
    _assert_refusal(capsys.readouterr().err, "input folder does not exist")


def test_predict_exits_1_with_the_traceback_when_its_work_breaks_and_2_for_bad_input(tmp_path, capsys, monkeypatch):
    import pipelines.predict.job as job
    from pipelines.predict.cli import main

    (tmp_path / "in").mkdir()
    args = ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out.parquet")]
    assert main(["--model", str(tmp_path / "no-model"), *args]) == 2
    _assert_refusal(capsys.readouterr().err, "model not found")
    monkeypatch.setattr(job, "prepare", _internal(ValueError))  # a plain ValueError: a bug, not a refusal
    assert main(["--model", str(tmp_path / "no-model"), *args]) == 1
    _assert_failure(capsys.readouterr().err, "ValueError")


def test_training_exits_1_with_the_traceback_when_its_work_breaks_and_2_for_bad_input(tmp_path, capsys, monkeypatch):
    """One process alone (no horovodrun): an internal error in the output check, exit 1 and the
    traceback; data that is no ETL output, exit 2 and one line."""
    import pipelines.training.cli as cli

    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    args = ["--data", str(tmp_path), "--output", str(tmp_path / "out"), "--no-tracking"]
    assert cli.main(args) == 2
    _assert_refusal(capsys.readouterr().err, "--data must be the output folder of jobs/etl.py")
    monkeypatch.setattr(cli, "check_run", lambda *a: None)
    monkeypatch.setattr(cli, "check_output", _internal(RuntimeError))
    assert cli.main(args) == 1
    _assert_failure(capsys.readouterr().err, "RuntimeError")


@pytest.mark.parametrize("rank", [0, 1])
def test_under_horovodrun_every_rank_says_its_failure_and_rank_0_alone_a_refusal(rank, tmp_path, capsys,
                                                                                monkeypatch):
    """As ``horovodrun`` starts each rank (its variables set): an internal error is logged by the
    rank it happened on, with its rank and host; a refusal (every rank refuses alike) by rank 0 only."""
    import pipelines.training.cli as cli
    from pipelines.training.data import DataError

    monkeypatch.setenv("HOROVOD_RANK", str(rank))
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setattr(cli, "refuse_early", lambda *a: None)  # rank 0's early checks, without data
    args = ["--data", str(tmp_path), "--output", str(tmp_path / "out"), "--no-tracking"]
    monkeypatch.setattr(cli, "run_training", _internal(KeyError))
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    _assert_failure(err, "KeyError", f"rank {rank} on {socket.gethostname()}")

    def refuse(_config):
        raise DataError("the train split has 1 row group but 2 ranks need one each")
    monkeypatch.setattr(cli, "run_training", refuse)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    if rank == 0:
        _assert_refusal(err, "2 ranks need one each")
    else:
        assert err == ""


# -- a rank's failure, at the driver ----------------------------------------------------------

def _record_of(exc_factory, rank, monkeypatch):
    """The record rank ``rank`` writes of the exception ``exc_factory`` raises (failure_record)."""
    from pipelines.launch.failures import failure_record

    monkeypatch.setenv("HOROVOD_RANK", str(rank))
    monkeypatch.setenv("HOROVOD_HOSTNAME", f"host-{rank}")
    try:
        exc_factory()
    except Exception as exc:  # noqa: BLE001 - recorded as a rank records it
        return failure_record(exc)


def _refuse():
    from pipelines.training.data import DataError
    raise DataError(f"no manifest.json in s3://k:{SECRET}@b/data")


def test_a_rank_s_record_keeps_its_redacted_traceback_or_marks_its_refusal(monkeypatch):
    failed = _record_of(_internal(KeyError), 1, monkeypatch)
    assert not failed["refused"] and failed["cause"].startswith("KeyError: ") and failed["host"] == "host-1"
    assert "Traceback (most recent call last)" in failed["traceback"] and "OSError: store said no" in failed["traceback"]
    assert SECRET not in json.dumps(failed)
    refused = _record_of(_refuse, 0, monkeypatch)
    assert refused["refused"] and refused["traceback"] == "" and SECRET not in json.dumps(refused)


def test_the_driver_exits_2_for_a_rank_s_refusal_and_1_with_the_rank_s_traceback_else(monkeypatch, caplog):
    """Through the local launcher's path: each rank's record in its result file, read back by
    collect_failures, raised as HorovodJobFailed, ended by the training command's launch_failed."""
    from pipelines.launch.failures import HorovodJobFailed, RankFailure, RelaunchImpossible
    from pipelines.training.cli import launch_failed

    log = logging.getLogger("test-driver")

    def ended(*records):
        failures = [RankFailure(r["rank"], r["cause"], r["traceback"], r["secondary"], r["host"],
                                refused=r["refused"]) for r in records]
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="test-driver"):
            code = launch_failed(HorovodJobFailed(failures), log)
        return code, "\n".join(caplog.messages)

    code, said = ended(_record_of(_refuse, 1, monkeypatch))
    assert code == 2 and said.startswith("rank 1 on host-1 refused: DataError: no manifest.json")
    assert "\n" not in said and SECRET not in said
    code, said = ended(_record_of(_internal(KeyError), 1, monkeypatch), _record_of(_refuse, 0, monkeypatch))
    assert code == 2  # rank 0 sorts first: the root cause is the refusal, rank 1 is "then also"
    code, said = ended(_record_of(_internal(KeyError), 1, monkeypatch))
    assert code == 1 and said.startswith("training failed: rank 1 on host-1 failed: KeyError")
    assert "Traceback (most recent call last)" in said and "direct cause" in said and SECRET not in said
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="test-driver"):
        assert launch_failed(RelaunchImpossible("rank 1 lost", 2, "no slots"), log) == 1


def _preempt():
    from pipelines.training.preemption import Preempted

    raise Preempted("preempted: every rank stopped after step 3 of epoch 2 (a SIGTERM)")


def test_the_driver_exits_76_when_every_rank_stopped_at_a_preemption_notice(monkeypatch, caplog):
    """Each rank's record of its Preempted: no traceback, its exit status; the driver says how to resume."""
    from pipelines.launch.failures import HorovodJobFailed, RankFailure
    from pipelines.training.cli import launch_failed

    records = [_record_of(_preempt, rank, monkeypatch) for rank in (1, 0)]
    assert [(r["exit_status"], r["traceback"]) for r in records] == [(76, ""), (76, "")]
    failures = [RankFailure(r["rank"], r["cause"], r["traceback"], r["secondary"], r["host"],
                            exit_status=r["exit_status"]) for r in records]
    with caplog.at_level(logging.WARNING, logger="test-driver"):
        assert launch_failed(HorovodJobFailed(failures), logging.getLogger("test-driver"), "/runs/a") == 76
    assert caplog.messages == ["rank 0 on host-0: preempted: every rank stopped after step 3 of epoch 2 (a SIGTERM)",
                               "preempted: the run stopped after its checkpoint in /runs/a; continue it with the same "
                               "command and --resume (it resumes at that step)"]


def test_a_local_rank_writes_its_redacted_failure_for_the_driver_which_reads_it_back(tmp_path, monkeypatch, capsys):
    """A local rank's process (``pipelines.launch.child.child_main``, as run_local starts it) records
    its failure in its result file, logs it with its traceback, redacted, and ends with status 1;
    the driver's collect_failures reads the record back, a refusal still a refusal."""
    import cloudpickle

    from pipelines.launch.child import child_main
    from pipelines.launch.failures import HorovodJobFailed
    from pipelines.launch.local import collect_failures
    from pipelines.runtime.logs import setup_logging

    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_HOSTNAME", "host-1")
    setup_logging("train", rank=1)
    job, result = tmp_path / "job.pkl", tmp_path / "result-1.json"

    def failed(function):
        job.write_bytes(cloudpickle.dumps((function, {})))
        assert child_main(str(job), str(result)) == 1
        (failure,) = collect_failures({1: json.loads(result.read_text())}, {1: 1}, "this-host")
        return failure, capsys.readouterr().err

    failure, err = failed(_internal(KeyError))
    assert "rank 1 on host-1 failed: KeyError" in err and "Traceback (most recent call last)" in err
    assert (failure.rank, failure.host, failure.refused) == (1, "host-1", False)
    assert failure.cause.startswith("KeyError") and "Traceback" in failure.traceback
    assert SECRET not in err + failure.cause + failure.traceback + result.read_text()
    failure, err = failed(_refuse)
    assert "rank 1 on host-1 refused: DataError" in err and "Traceback" not in err, err
    assert failure.refused and HorovodJobFailed([failure]).refused and SECRET not in err + result.read_text()

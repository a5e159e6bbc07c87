"""Command line of the training stage: every rank under ``horovodrun``, or one driver with ``--spark-np N``."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import tempfile
from typing import Iterator, Mapping, Optional, Sequence, Tuple

from pipelines.io.storage import is_local, resolve
from pipelines.launch import HorovodJobFailed, RelaunchImpossible, elastic
from pipelines.launch.config import LaunchConfig
from pipelines.launch.gpus import DEVICE_ORDER
from pipelines.runtime.config import parse_configs
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import exit_status
from pipelines.runtime.logs import plural, setup_logging
from pipelines.runtime.quiet import quiet_by_default
from pipelines.runtime.redact import redact_text
from pipelines.runtime.spark import spark_session
from pipelines.tracking import TrackingFailed, check_store
from pipelines.training.config import TrainConfig
from pipelines.training.devices import rank_cores, threads_per_rank
from pipelines.training.model.imagenet import ensure_imagenet_weights
from pipelines.training.plan import check_run
from pipelines.training.preemption import PREEMPTED_EXIT, Preempted, resume_line
from pipelines.training.records.mirror import check_output
from pipelines.training.records.ownership import check_output_claim
from pipelines.training.records.report import best_name
from pipelines.training.train import run_training

RANK_LOGS = "logs"  # under --output: each rank's whole output (HorovodRunner's log_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into a ``TrainConfig`` and a ``LaunchConfig``, and train.

    Returns:
        int: 0 on success; 2 with one line for a refusal; 1 when a rank fails and is not relaunched, MLflow
        could not log the results (outputs complete), or any other error (redacted traceback); 76
        (``PREEMPTED_EXIT``) when a SIGTERM stopped every rank after rank 0's checkpoint (``horovodrun`` exits 1)."""
    for name, value in DEVICE_ORDER.items():  # before TensorFlow loads: GPUs numbered as nvidia-smi does
        os.environ.setdefault(name, value)
    config, launch = parse_configs((TrainConfig, LaunchConfig), argv)
    quiet_by_default(config.verbose)  # before TensorFlow or Spark load; the ranks get it in config
    rank, world_size = horovodrun_place(os.environ)  # the one read of Horovod's variables here
    log = logging.getLogger("pipelines")
    try:
        if launch.launches:
            report = launch_ranks(config, launch)
        else:
            if not rank:
                refuse_early(config, rank, world_size)
            os.environ.update(launch.timeouts_env(os.environ))  # a rank itself: its waits bounded here, before hvd.init()
            if elastic.under_elastic(os.environ):  # horovodrun --min-np/--host-discovery-script: the ranks left go on
                report, rank = elastic.run_elastic(run_training, config=config)
            else:
                report = run_training(config)
            if rank:
                return 0
    except (HorovodJobFailed, RelaunchImpossible) as exc:
        return launch_failed(exc, log, config.outputs.output)
    except TrackingFailed as exc:  # rank 0, under horovodrun or alone
        log.error("%s", exc)
        return 1
    except Preempted:  # every rank stopped at one step, rank 0 checkpointed there
        if not rank:
            log.warning("%s", resume_line(config.outputs.output))
        return PREEMPTED_EXIT
    except Exception as exc:  # noqa: BLE001 - a refusal is 2, anything else 1 with its traceback
        if not log.handlers:  # it ended before its logging was set up
            setup_logging("train", rank=rank)
        where = "" if rank is None else f"rank {rank} on {socket.gethostname()}"
        # under horovodrun every rank refuses alike: rank 0 says why, once; a failure, every rank
        return exit_status(exc, log, where, say_refusal=launch.launches or not rank)
    print(result_line(report, config.outputs.output))
    return 0


def launch_failed(exc: Exception, log: logging.Logger, output: str = "") -> int:
    """The launching driver's last words on a failed launch (``exc``), and its exit code.

    Returns:
        int: 2 for a rank's refusal (one line); 76 for a preemption stop (with how to resume ``output``);
        else 1, with the failing rank's cause and redacted traceback."""
    root = exc.failures[0] if isinstance(exc, HorovodJobFailed) else None
    if root is not None and root.exit_status:  # the ranks stopped of their own (a preemption notice)
        log.warning("rank %d%s: %s", root.rank, f" on {root.host}" if root.host else "", root.cause.split(": ", 1)[-1])
        log.warning("%s", resume_line(output))
        return root.exit_status
    if isinstance(exc, HorovodJobFailed) and root is not None and exc.refused:
        log.error("rank %d%s refused: %s", root.rank, f" on {root.host}" if root.host else "", root.cause)
        return 2
    text = f"\n{redact_text(root.traceback.rstrip())}" if root is not None and root.traceback else ""
    log.error("training failed: %s%s", redact_text(str(exc)), text)
    return 1


def horovodrun_place(environ: Mapping[str, str]) -> Tuple[Optional[int], int]:
    """``(rank, world_size)`` from ``HOROVOD_RANK``/``HOROVOD_SIZE``; ``(None, 1)`` for a process alone."""
    rank = environ.get("HOROVOD_RANK")
    return (None if rank is None else int(rank)), int(environ.get("HOROVOD_SIZE", "1"))


def result_line(report: dict, output: str) -> str:
    """The one line a finished job prints: test metrics, chosen epoch, world size, where the outputs are."""
    test, validation = report["test"], report.get("validation") or {}
    tracked = f"; MLflow run {report['mlflow']['run_id']}" if report.get("mlflow") else ""
    chosen = (f" (validation accuracy {validation['accuracy']:.4f})"
              if validation.get("accuracy") is not None else "")
    return (f"test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f}) on {plural(test['count'], 'image')}; "
            f"{plural(report['epochs_run'], 'epoch')}, best {best_name(report['best_epoch'])}{chosen}; "
            f"world size {report['world_size']}, global batch {report['global_batch_size']}; "
            f"model and report in {output}{tracked}")


def launch_ranks(config: TrainConfig, launch: LaunchConfig) -> dict:
    """``--spark-np N``: check, then run the ranks with ``HorovodRunner``; returns rank 0's report.

    Raises ``Refused`` (exit 2), or ``HorovodJobFailed``/``RelaunchImpossible`` (exit 1)."""
    setup_logging("train driver")
    if launch.np < 0 and config.compute.bind_cores:  # local ranks: the cores are this machine's, check now
        rank_cores(0, launch.world_size, threads_per_rank(config.compute.threads, launch.world_size),
                   os.sched_getaffinity(0))
    run = check_before_ranks(config, launch.world_size)
    if config.outputs.tracking:
        check_store(config.outputs.tracking_uri)
    if launch.np > 0:
        spark_session("pipelines-train", verbose=config.verbose, log_level=read_settings().spark_log_level)
    with rank_log_dir(config) as logs:
        runner = launch.runner(logs, before_ranks=lambda: fetch_weights(config))
        return runner.run(run_training, config=config, run_id=run.run_id)  # every relaunch continues this run's checkpoints only


def refuse_early(config: TrainConfig, rank: Optional[int], world_size: int) -> None:
    """Rank 0's refusals and ``--weights imagenet`` fetch before TensorFlow loads; the others wait in ``hvd.init``."""
    setup_logging("train", rank=rank)  # setup_rank sets it again, from Horovod
    check_before_ranks(config, world_size)
    fetch_weights(config)


def check_before_ranks(config: TrainConfig, world_size: int):
    """The refusals made before any rank trains, without TensorFlow; returns the run's ``RunIdentity``.

    Raises:
        pipelines.runtime.errors.Refused: unusable data, an unusable or foreign ``--output``, a mismatched resume."""
    check_run(config.loader.data, config.fit.batch_size, world_size, config.storage_options)
    check_output(config.outputs.output, config.storage_options)
    return check_output_claim(config, world_size)


def fetch_weights(config: TrainConfig) -> None:
    """``--weights imagenet`` into Keras' cache, fetched once if need be; call after every refusal.

    Raises:
        pipelines.training.model.imagenet.WeightsUnavailable: a refusal (exit 2)."""
    ensure_imagenet_weights(config.model.backbone, config.model.weights)


@contextlib.contextmanager
def rank_log_dir(config: TrainConfig) -> Iterator[str]:
    """The local folder for each rank's output: ``OUTPUT/logs``, or a temporary one uploaded to a URI output."""
    if is_local(config.outputs.output):
        yield os.path.join(config.outputs.output, RANK_LOGS)
        return
    local = tempfile.mkdtemp(prefix="pipelines-rank-logs-")
    try:
        yield local
    finally:
        target = resolve(config.outputs.output, config.storage_options).join(RANK_LOGS)
        try:
            target.upload(local)
        except OSError as exc:
            logging.getLogger("pipelines").warning("the ranks' logs could not be copied to %s: %s", target, exc)
        shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

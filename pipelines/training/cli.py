"""Command line of the training stage.

Every rank runs it under ``horovodrun -np N python jobs/train.py ...``; or one driver runs it with
``--spark-np N`` (``spark-submit --master spark://HOST:PORT jobs/train.py --spark-np N ...``, or
``python jobs/train.py --spark-np -N`` for local processes) and launches the ranks itself with
:class:`pipelines.launcher.HorovodRunner`. Both call the same training function with the same config.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Optional, Sequence

from pipelines.config import parse_config
from pipelines.training.config import TrainConfig

RANK_LOGS = "logs"  # under --output: each rank's whole output (HorovodRunner's log_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into a :class:`TrainConfig` and train.

    Returns 0 on success; 2 with a one-line error when the data cannot feed the run or the
    launch is impossible (too few task slots, a Spark setting barrier tasks refuse, a network
    interface or host address that is not on this machine's executors, an MLflow tracking server
    that does not answer), before any rank starts; 1 with the failing rank and its cause when a
    rank fails (on its host: also its network), or when MLflow could not log the results (the
    training outputs are complete).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipelines.launcher import HorovodJobFailed, HorovodRunner
    from pipelines.logs import setup_logging
    from pipelines.tracking import TrackingFailed, check_store
    from pipelines.training.data import DataError, check_run
    from pipelines.training.train import run_training

    config = parse_config(TrainConfig, argv)
    log = logging.getLogger("pipelines")
    try:
        if config.spark_np:
            setup_logging("train driver")
            if config.spark_np < 0 and config.bind_cores:  # local ranks: the cores are this machine's, check now
                from pipelines.training.devices import rank_cores, threads_per_rank
                ranks = -config.spark_np
                rank_cores(0, ranks, threads_per_rank(config.threads, ranks), os.sched_getaffinity(0))
            check_run(config.data, config.batch_size, abs(config.spark_np))  # refuse before any rank starts
            if config.tracking:
                check_store(config.tracking_uri)
            if config.spark_np > 0:
                from pipelines.spark import spark_session
                spark_session("pipelines-train")
            runner = HorovodRunner(np=config.spark_np, slots_timeout_s=config.slots_timeout,
                                   network_interface=config.network_interface or None,
                                   log_dir=os.path.join(config.output, RANK_LOGS))
            report = runner.run(run_training, config=dataclasses.replace(config, spark_np=0, network_interface=""))
        else:
            report = run_training(config)
            if not _is_rank0():
                return 0
    except (DataError, ValueError, FileNotFoundError) as exc:
        if config.spark_np or os.environ.get("HOROVOD_RANK", "0") == "0":
            log.error("%s", exc)  # under horovodrun every rank refuses alike: rank 0 says why, once
        return 2
    except HorovodJobFailed as exc:
        log.error("training failed: %s", exc)
        return 1
    except TrackingFailed as exc:  # rank 0, under horovodrun or alone
        log.error("%s", exc)
        return 1
    test = report["test"]
    tracked = f"; MLflow run {report['mlflow']['run_id']}" if report.get("mlflow") else ""
    print(f"test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f}) on {test['count']} images; "
          f"{report['epochs_run']} epochs, best {report['best_epoch']}; "
          f"world size {report['world_size']}, global batch {report['global_batch_size']}; "
          f"model and report in {config.output}{tracked}")
    return 0


def _is_rank0() -> bool:
    import horovod.tensorflow.keras as hvd
    return hvd.rank() == 0


if __name__ == "__main__":
    sys.exit(main())

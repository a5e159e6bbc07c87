"""Command line of the training stage: ``horovodrun -np N python jobs/train.py ...``."""
from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

from pipelines.config import parse_config
from pipelines.training.config import TrainConfig


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into a :class:`TrainConfig` and train (every rank runs this).

    Returns 0 on success, 2 with a one-line error (logged by every rank, with its rank) when the
    data cannot feed the run.
    """
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipelines.training.data import DataError
    from pipelines.training.train import run_training

    config = parse_config(TrainConfig, argv)
    try:
        report = run_training(config)
    except (DataError, ValueError, FileNotFoundError) as exc:
        logging.getLogger("pipelines").error("%s", exc)
        return 2
    if report["world_size"] and _is_rank0():
        test = report["test"]
        print(f"test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f}) on {test['count']} images; "
              f"{report['epochs_run']} epochs, best {report['best_epoch']}; "
              f"world size {report['world_size']}, global batch {report['global_batch_size']}; "
              f"model and report in {config.output}")
    return 0


def _is_rank0() -> bool:
    import horovod.tensorflow.keras as hvd
    return hvd.rank() == 0


if __name__ == "__main__":
    sys.exit(main())

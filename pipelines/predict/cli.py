"""Command line of the batch-inference stage: ``spark-submit jobs/predict.py``."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.predict.config import PredictConfig
from pipelines.predict.job import format_summary, run_predict
from pipelines.runtime.config import run_command


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options, run the job, print the summary; return 0, 2 on a `Refused` (before Spark), 1 otherwise."""
    return run_command(PredictConfig, argv, "predict", run_predict, format_summary, {})


if __name__ == "__main__":
    sys.exit(main())

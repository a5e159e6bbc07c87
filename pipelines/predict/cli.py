"""Command line of the batch-inference stage: ``spark-submit jobs/predict.py``."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.predict.config import PredictConfig
from pipelines.predict.job import format_summary, run_predict
from pipelines.runtime.config import run_command


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into a :class:`PredictConfig`, run the job, print the summary.

    Returns 0 on success (unreadable images are rows with a reason, not failures); 2 with a
    one-line error for bad input before Spark starts (a :class:`~pipelines.runtime.errors.Refused`: a
    missing model, a model without its contract, an input with no image, an output that overlaps
    the input, an ETL split stored at another size than the model's); 1 with the redacted
    traceback for any other exception.
    """
    return run_command(PredictConfig, argv, "predict", run_predict, format_summary, {})


if __name__ == "__main__":
    sys.exit(main())

"""Command line of the ETL stage: ``spark-submit jobs/etl.py`` / ``pipelines-etl``."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.etl.commit import RunSuperseded
from pipelines.etl.config import ETLConfig
from pipelines.etl.job import NothingWritten, run_etl
from pipelines.etl.summary import format_summary
from pipelines.runtime.config import run_command
from pipelines.tracking import TrackingFailed


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into an :class:`ETLConfig`, run the job, print the summary.

    Returns 0 on success; 2 with a one-line error for bad input before Spark runs (a
    :class:`~pipelines.runtime.errors.Refused`: paths, URIs of an unknown scheme, a missing bucket, refused
    credentials, an output holding foreign data, trees, memory, a tracking store that cannot be
    used); 1 with a one-line error when Spark ran but wrote no image from a non-empty list of
    candidates (the previous output is kept), when a newer run committed the output first, or when
    MLflow could not log the finished output; 1 with the redacted traceback for any other exception.
    """
    return run_command(ETLConfig, argv, "etl", run_etl, format_summary,
                       {(NothingWritten, RunSuperseded, TrackingFailed): 1})


if __name__ == "__main__":
    sys.exit(main())

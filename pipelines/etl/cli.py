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
    """Parse the options into an `ETLConfig`, run the job, print the summary.

    Returns 0; 2: bad input (`Refused`, before Spark runs); 1: nothing written, a newer run committed first, MLflow
    failed (one line), or any other exception (the redacted traceback)."""
    return run_command(ETLConfig, argv, "etl", run_etl, format_summary,
                       {(NothingWritten, RunSuperseded, TrackingFailed): 1})


if __name__ == "__main__":
    sys.exit(main())

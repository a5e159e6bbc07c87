"""Command line of the ETL stage: ``spark-submit jobs/etl.py`` / ``pipelines-etl``."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.config import parse_config
from pipelines.etl.config import ETLConfig
from pipelines.logs import setup_logging


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into an :class:`ETLConfig`, run the job, print the summary.

    Returns 0 on success; 2 with a one-line error for bad input before Spark runs (paths, trees,
    memory, a tracking store that cannot be used); 1 with a one-line error when Spark ran but
    wrote no image from a non-empty list of candidates (the previous output is kept), or when
    MLflow could not log the finished output.
    """
    from pipelines.etl.job import NothingWritten, format_summary, run_etl
    from pipelines.tracking import TrackingFailed

    config = parse_config(ETLConfig, argv)
    log = setup_logging("etl")
    try:
        manifest = run_etl(config)
    except (FileNotFoundError, NotADirectoryError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    except (NothingWritten, TrackingFailed) as exc:
        log.error("%s", exc)
        return 1
    print(format_summary(manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main())

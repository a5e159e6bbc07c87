"""Command line of the search: ``spark-submit jobs/tune.py`` (or ``python jobs/tune.py``)."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.runtime.config import run_command
from pipelines.tracking import TrackingFailed
from pipelines.tune.config import TuneConfig
from pipelines.tune.search import NoTrialFinished, run_search, summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the search, print its summary and the chosen flags; return 0, 2 on `Refused` (before Spark), 1 otherwise."""
    return run_command(TuneConfig, argv, "tune", run_search, summary, {(NoTrialFinished, TrackingFailed): 1})


if __name__ == "__main__":
    sys.exit(main())

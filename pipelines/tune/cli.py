"""Command line of the search: ``spark-submit jobs/tune.py`` (or ``python jobs/tune.py``)."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from pipelines.runtime.config import run_command
from pipelines.tracking import TrackingFailed
from pipelines.tune.config import TuneConfig
from pipelines.tune.search import NoTrialFinished, run_search, summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the options into a :class:`TuneConfig`, run the search, print its summary and the
    flags of the chosen settings for ``jobs/train.py``.

    Returns 0 on success; 2 with a one-line error naming the flag for bad input before Spark
    starts (an empty or non-finite range, a count of 0, no complete feature cache: the line names
    the command that makes it; a tracking store that cannot be used); 1 with one line when every
    trial diverged or MLflow failed to log; 1 with the redacted traceback for any other exception.
    """
    return run_command(TuneConfig, argv, "tune", run_search, summary, {(NoTrialFinished, TrackingFailed): 1})


if __name__ == "__main__":
    sys.exit(main())

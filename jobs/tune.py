"""Search entry point: ``spark-submit jobs/tune.py --data DIR --output DIR`` (or ``python jobs/tune.py``).

It searches the head's settings on the feature cache ``jobs/train.py --feature-cache`` made. All
logic lives in :mod:`pipelines.tune`; see ``--help``.
"""
import sys

from pipelines.tune.cli import main  # main sets the noise (--verbose) before TensorFlow or Spark load

if __name__ == "__main__":
    sys.exit(main())

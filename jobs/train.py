"""Training entry point: ``horovodrun -np N python jobs/train.py --data DIR --output DIR``.

``python jobs/train.py ...`` alone runs one process. All logic lives in :mod:`pipelines.training`;
see ``--help``.
"""
import sys

from pipelines.training.cli import main  # main sets the noise (--verbose) before TensorFlow or Spark load

if __name__ == "__main__":
    sys.exit(main())

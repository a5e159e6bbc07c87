"""Training entry point: ``horovodrun -np N python jobs/train.py --data DIR --output DIR``.

``python jobs/train.py ...`` alone runs one process. All logic lives in :mod:`pipelines.training`;
see ``--help``.
"""
import sys

from pipelines.quiet import quiet_by_default

quiet_by_default()  # before TensorFlow or Spark load: warnings only, unless --verbose
from pipelines.training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

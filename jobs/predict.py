"""Batch-inference entry point: ``spark-submit jobs/predict.py --model MODEL --input DIR --output OUT.parquet``
(or ``python jobs/predict.py ...``).

All logic lives in :mod:`pipelines.predict`; see ``--help``.
"""
import sys

from pipelines.quiet import quiet_by_default

quiet_by_default()  # before TensorFlow or Spark load: warnings only, unless --verbose
from pipelines.predict.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

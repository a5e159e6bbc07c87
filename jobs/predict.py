"""Batch-inference entry point: ``spark-submit jobs/predict.py --model MODEL --input DIR --output OUT.parquet``
(or ``python jobs/predict.py ...``).

All logic lives in :mod:`pipelines.predict`; see ``--help``.
"""
import sys

from pipelines.predict.cli import main  # main sets the noise (--verbose) before TensorFlow or Spark load

if __name__ == "__main__":
    sys.exit(main())

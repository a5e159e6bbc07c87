"""ETL entry point: ``spark-submit jobs/etl.py --input DIR --output DIR`` (or ``python jobs/etl.py``).

All logic lives in :mod:`pipelines.etl`; see ``--help``.
"""
import sys

from pipelines.etl.cli import main  # main sets the noise (--verbose) before TensorFlow or Spark load

if __name__ == "__main__":
    sys.exit(main())

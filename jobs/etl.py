"""ETL entry point: ``spark-submit jobs/etl.py --input DIR --output DIR`` (or ``python jobs/etl.py``).

All logic lives in :mod:`pipelines.etl`; see ``--help``.
"""
import sys

from pipelines.quiet import quiet_by_default

quiet_by_default()  # before TensorFlow or Spark load: warnings only, unless --verbose
from pipelines.etl.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

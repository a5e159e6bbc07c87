#!/usr/bin/env bash
# The main job on the embedded sample: real photos -> Spark ETL -> Parquet (-> training).
# Called by `make main`; OUT (default out/) receives everything, the download cache stays in
# PIPELINES_CACHE (default ~/.cache/pipelines).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
OUT=${OUT:-out}
export PATH="$PWD/$VENV/bin:$PATH" PYSPARK_PYTHON="$PWD/$VENV/bin/python" TF_CPP_MIN_LOG_LEVEL=2

echo "== 1/2 sample data: Tux Paint photos as a Caltech-256-style tree"
python -m pipelines.samples tuxpaint --dest "$OUT/tuxpaint"

echo "== 2/2 ETL: spark-submit jobs/etl.py"
# 0.3 leaves >= 30 test images of the 148 photos (the split is a hash of each path).
spark-submit --master "local[*]" --driver-java-options "-Dlog4j2.configurationFile=conf/log4j2.properties" jobs/etl.py --input "$OUT/tuxpaint" --output "$OUT/etl" \
  --test-fraction 0.3 --image-size 299
echo "Parquet splits and manifest: $OUT/etl"

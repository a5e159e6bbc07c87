#!/usr/bin/env bash
# The search on `make main`'s output: its ETL output and the feature cache its training made
# (jobs/train.py --feature-cache), through Spark. Called by `make tune`; OUT as for `make main`,
# TRIALS (default 16) trials, the result in OUT/tune (tune.json, mlruns.db) and its last lines the
# flags for jobs/train.py. VERBOSE=1 shows the libraries' info lines.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[[ $VENV == /* ]] || VENV=$PWD/$VENV
OUT=${OUT:-out}
TRIALS=${TRIALS:-16}
export PATH="$VENV/bin:$PATH" PYSPARK_PYTHON="$VENV/bin/python" PYTHONUNBUFFERED=1
VERBOSE_FLAG=()
LOG4J=(--driver-java-options "-Dlog4j2.configurationFile=conf/log4j2.properties")
if [ "${VERBOSE:-0}" != 0 ]; then
  VERBOSE_FLAG=(--verbose) LOG4J=()
  export PIPELINES_VERBOSE=1 TF_CPP_MIN_LOG_LEVEL=0
else
  export TF_CPP_MIN_LOG_LEVEL=2
fi
[ -f "$OUT/etl/manifest.json" ] || { echo "[tune] no ETL output in $OUT/etl: run make main first" >&2; exit 2; }
WEIGHTS=$(python -m pipelines.tools.weights)
# the settings are for make main's training: its ranks (NP) and batch per rank (conf/main-train.args)
read -r -a MAIN_TRAIN < conf/main-train.args
BATCH=16
for i in "${!MAIN_TRAIN[@]}"; do [ "${MAIN_TRAIN[$i]}" != --batch-size ] || BATCH=${MAIN_TRAIN[$((i + 1))]}; done
spark-submit --master "local[*]" "${LOG4J[@]}" \
  jobs/tune.py --data "$OUT/etl" --output "$OUT/tune" --weights "$WEIGHTS" --trials "$TRIALS" \
    --ranks "${NP:-2}" --batch-size "$BATCH" "${VERBOSE_FLAG[@]}" \
  2>&1 | { grep --line-buffered -v -x -F 'WARNING: Using incubator modules: jdk.incubator.vector' || [ $? = 1 ]; }

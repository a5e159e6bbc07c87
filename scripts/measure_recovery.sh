#!/bin/bash
# Times one --max-failures 1 recovery against the same run uninterrupted: 2 local ranks, the tiny
# backbone, generated 71 px images, 4 epochs with a 3-epoch warmup; rank 1 is SIGKILLed once
# checkpoint 2 is complete (the test hook PIPELINES_FAULT_INJECT). Usage: scripts/measure_recovery.sh [WORKDIR]
# (run from a checkout whose venv is first on PATH).
set -e
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2 PIPELINES_TRACKING=0
W=${1:-/tmp/rec-measure}; rm -rf "$W"; mkdir -p "$W"
python -c "from tests.support.imagegen import make_tree; make_tree('$W/tree', classes=3, per_class=26, bad=False)"
python jobs/etl.py --input "$W/tree" --output "$W/etl" --image-size 71 --test-fraction 0.3 --min-row-groups 4 \
    > "$W/etl.log" 2>&1
ARGS=(--data "$W/etl" --weights none --backbone tiny --batch-size 4 --no-tensorboard --epochs 4 --patience 10
      --warmup-epochs 3 --spark-np -2)
/usr/bin/time -f "uninterrupted %e s" python jobs/train.py "${ARGS[@]}" --output "$W/plain" --cache-dir "$W/c1" \
    > "$W/plain.log" 2>&1 || true
# the hook acts only where a token file arms it (pipelines/launch/rankenv.py, fault_armed): this
# script's own, owner-only, as the test suite writes one
(umask 077; python -c "from pipelines.launch.rankenv import FAULT_TOKEN_TEXT as t; print(t, end='')" > "$W/fault-token")
PIPELINES_FAULT_TOKEN="$W/fault-token" PIPELINES_FAULT_INJECT=rank=1,epoch=2,mode=kill /usr/bin/time -f "recovered %e s" python jobs/train.py "${ARGS[@]}" \
    --output "$W/rec" --cache-dir "$W/c2" --max-failures 1 > "$W/rec.log" 2>&1 || true
tail -1 "$W/plain.log"; tail -1 "$W/rec.log"
grep -h -E "injecting a fault|WARNING attempt|resuming after|test accuracy" "$W/rec.log" | cut -c1-200

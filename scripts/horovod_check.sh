#!/usr/bin/env bash
# Usage: scripts/horovod_check.sh VENV [gpu]
# Prints Horovod's build table (`horovodrun --check-build`) and exits 1 unless Horovod was built with
# TensorFlow and Gloo (and NCCL with `gpu`). Only the table is printed: horovodrun's own processes
# import TensorFlow, whose load-time lines ignore TF_CPP_MIN_LOG_LEVEL on TF 2.21
# (tensorflow/tensorflow#100442); all of the output is shown when the table is missing.
set -euo pipefail
VENV=$1
NEED=${2:-}
check=$(PATH="$VENV/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>&1) || true
table=$(sed -n '/^Horovod v/,$p' <<<"$check")
if [ -z "$table" ]; then
  echo "$check" >&2
  echo "[setup] horovodrun --check-build printed no build table" >&2
  exit 1
fi
echo "$table"
grep -q '\[X\] TensorFlow' <<<"$table" || { echo "[setup] Horovod was built without TensorFlow" >&2; exit 1; }
grep -q '\[X\] Gloo' <<<"$table" || { echo "[setup] Horovod was built without Gloo" >&2; exit 1; }
if [ "$NEED" = gpu ]; then
  grep -q '\[X\] NCCL' <<<"$table" || { echo "[setup] Horovod was built without NCCL" >&2; exit 1; }
fi

#!/usr/bin/env bash
# Spark worker GPU discovery script (spark.worker.resource.gpu.discoveryScript): prints the GPUs
# this worker offers as Spark expects, e.g. {"name": "gpu", "addresses": ["0","1"]}.
# Use with: spark.worker.resource.gpu.amount=N, spark.executor.resource.gpu.amount=N,
#           spark.task.resource.gpu.amount=1 (one Horovod rank per GPU).
# A worker limited by CUDA_VISIBLE_DEVICES (a container, YARN) offers its GPUs as 0..n-1, indices
# into that list, which is how the launcher reads an address (pipelines/launch/gpus.py, as PySpark's
# TorchDistributor does); otherwise nvidia-smi's indices, in PCI bus order (the ranks run with
# CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers them the same way).
set -euo pipefail
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  count=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '[^[:space:]]' || true)
  indices=$( [ "$count" -gt 0 ] && seq 0 $((count - 1)) || true)
else
  indices=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
fi
addresses=$(printf '%s\n' "$indices" | grep . | sed 's/ //g; s/.*/"&"/' | paste -sd, - || true)
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"

#!/usr/bin/env bash
# Spark worker GPU discovery script (spark.worker.resource.gpu.discoveryScript): prints the GPUs
# this worker offers as Spark expects, e.g. {"name": "gpu", "addresses": ["0","1"]}.
# Use with: spark.worker.resource.gpu.amount=N, spark.executor.resource.gpu.amount=N,
#           spark.task.resource.gpu.amount=1 (one Horovod rank per GPU).
set -euo pipefail
addresses=$( (nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true) | sed 's/.*/"&"/' | paste -sd, -)
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"

#!/usr/bin/env bash
# horovodrun's host discovery script for ONE machine (horovodrun --host-discovery-script): one line
# NAME:1 per slot this machine offers now, each slot under a name of its own, slot i being 127.0.0.1
# with i leading zeros in its last number (127.0.0.1:1, 127.0.0.01:1, 127.0.0.001:1, ...): Horovod
# blacklists a failed worker's whole host, so a machine listed once loses every rank with one;
# pipelines/launch/discovery.py says why and how a rank finds its slot (its GPU, its cores) again.
#   host_discovery.sh         the GPUs nvidia-smi lists now (GPU i is slot i; a GPU that fell off the
#                             bus drops its slot); under CUDA_VISIBLE_DEVICES, 0..n-1 of that list
#   host_discovery.sh N       N slots, 0..N-1 (CPU training)
#   host_discovery.sh FILE    the slot indices FILE holds now (e.g. "0 1"), read at each call: a
#                             scheduler (or a test) takes a slot away or gives it back by editing it
# horovodrun runs it every second. A cluster lists its hosts instead (docs/cluster.md).
set -euo pipefail
if [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  slots=$(seq 0 $(("$1" - 1)))
elif [ $# -ge 1 ]; then
  slots=$(cat -- "$1")
elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  count=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '[^[:space:]]' || true)
  slots=$( [ "$count" -gt 0 ] && seq 0 $((count - 1)) || true)
else
  slots=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)
fi
for i in $slots; do
  [[ "$i" =~ ^[0-9]+$ ]] || { echo "host_discovery.sh: not a slot index: $i" >&2; exit 2; }
  printf '127.0.0.%s1:1\n' "$(printf '%*s' "$i" '' | tr ' ' 0)"
done

#!/usr/bin/env bash
# Regenerates requirements/<stack>.lock from requirements/<stack>.in: the whole closure pinned by
# pip-compile on the stack's first Python (so that its markers apply), each `# no-deps:` pin of the
# .in appended, then every pin given the sha256 of the files `pip download` fetches for it on this
# platform (Linux x86_64) for each Python version the stack names (a wheel per version, or the sdist).
# VARIANT gpu: requirements/<stack>-gpu.lock, the same with tensorflow[and-cuda] for tensorflow-cpu
# (the GPU image's; made from a copy of the .in, so the versions stay written once).
# VARIANT peers: requirements/<stack>-peers.lock from requirements/<stack>-peers.in, the benchmarks'
# peer libraries (make bench-peers), held by `-c` to the stack's lock.
# Needs the package index; the set-up never runs it.
# Usage: scripts/lock.sh STACK [gpu|peers]     (make lock STACK=...)
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${1:?usage: scripts/lock.sh STACK}
python3 -m pipelines.stack check "$STACK" || exit 2
read -r -a VERSIONS <<<"$(python3 -m pipelines.stack pythons "$STACK")"
PY=$(STACK=$STACK bash scripts/setup_env.sh --find-python) || exit 2
tools=$(mktemp -d); trap 'rm -rf "$tools"' EXIT
"$PY" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q pip-tools==7.5.2
IN=$STACK
if [ "${2:-}" = gpu ]; then
  IN=$STACK-gpu
  sed 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' "requirements/$STACK.in" > "requirements/$IN.in"
  trap 'rm -rf "$tools" "requirements/$IN.in"' EXIT
fi
if [ "${2:-}" = peers ]; then IN=$STACK-peers; fi
LOCK=requirements/$IN.lock

(cd requirements && CUSTOM_COMPILE_COMMAND="make lock STACK=$STACK" "$tools/venv/bin/pip-compile" --quiet \
   --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links -o "$IN.lock.new" "$IN.in")
{ grep '^# no-deps:' "requirements/$IN.in" || true; } | sed 's/^# no-deps: */# installed with --no-deps (see the .in)\n/' >> "requirements/$IN.lock.new"
for version in "${VERSIONS[@]}"; do
  grep -E '^[A-Za-z0-9]' "requirements/$IN.lock.new" | sed 's/ .*//' > "$tools/pins.txt"
  "$tools/venv/bin/pip" download -q --no-deps --python-version "$version" --prefer-binary \
    -d "$tools/files" -r "$tools/pins.txt"
done
python3 scripts/lockfile.py "requirements/$IN.lock.new" --add-hashes "$tools/files"
mv "requirements/$IN.lock.new" "$LOCK"
echo "[lock] $LOCK written: $(grep -cE '^[A-Za-z0-9]' "$LOCK") pins, $(grep -c -- '--hash=' "$LOCK") hashes"

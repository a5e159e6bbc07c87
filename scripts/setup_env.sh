#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment with the stack pinned in setup.cfg.
# Idempotent: a stamp holding the hash of setup.cfg and this script skips the work on a rerun.
# Usage: scripts/setup_env.sh [VENV_DIR]   (default .venv)
# PIPELINES_TF_EXTRA=gpu installs tensorflow[and-cuda] and builds Horovod with NCCL (the GPU
# Dockerfile does this); the default, cpu, installs tensorflow-cpu and Horovod with Gloo only.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}

# A Python that TensorFlow 2.15 supports: $PYTHON if given, else python3.11, else python3 if it
# is 3.9-3.11; otherwise stop with one line (an existing venv keeps the Python it was made with).
py_ok() { "$1" -c 'import sys; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 11))' 2>/dev/null; }
PY=""
if [ ! -x "$VENV/bin/python" ]; then
  for candidate in ${PYTHON:-python3.11 python3}; do
    if command -v "$candidate" >/dev/null 2>&1 && py_ok "$candidate"; then PY=$candidate; break; fi
  done
  if [ -z "$PY" ]; then
    found=""
    if command -v "${PYTHON:-python3}" >/dev/null 2>&1; then found=$( { "${PYTHON:-python3}" -V 2>&1 || true; } | head -n 1); fi
    echo "[setup] needs Python 3.9, 3.10 or 3.11 (TensorFlow 2.15); found ${PYTHON:-python3}: ${found:-none}; give one with PYTHON=/path/to/python3.11 make setup" >&2
    exit 1
  fi
fi
STAMP="$VENV/.pipelines-stamp"
TF_EXTRA=${PIPELINES_TF_EXTRA:-cpu}
want=$( (cat setup.cfg pyproject.toml scripts/setup_env.sh; echo "$TF_EXTRA") | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import pipelines" 2>/dev/null; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q "pip>=23.2" "setuptools>=61,<70" wheel "cmake>=3.13,<4"

# Pins come from setup.cfg so that there is one list to change.
pins=$(TF_EXTRA="$TF_EXTRA" "$VENV/bin/python" - <<'PY'
import configparser, os
c = configparser.ConfigParser()
c.read("setup.cfg")
reqs = [r.strip() for r in c["options"]["install_requires"].splitlines() if r.strip()]
extras = [r.strip() for key in (os.environ["TF_EXTRA"], "test") for r in c["options.extras_require"][key].splitlines() if r.strip()]
print(" ".join(r for r in reqs + extras if not r.startswith("horovod")))
PY
)
horovod_pin=$(grep -E '^\s*horovod==' setup.cfg | tr -d ' ')
echo "[setup] installing: $pins"
"${PIP[@]}" install -q $pins

# Horovod has no wheel: it compiles against the TensorFlow just installed (about 2.5 min; pip
# caches the built wheel, so a second venv on the same machine reuses it).
if [ "$TF_EXTRA" = gpu ]; then export HOROVOD_GPU_OPERATIONS=NCCL; fi
if ! "$VENV/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] building $horovod_pin with TensorFlow + Gloo (no MPI)${HOROVOD_GPU_OPERATIONS:+ + $HOROVOD_GPU_OPERATIONS}"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
    "${PIP[@]}" install -q --no-build-isolation "$horovod_pin"
fi

"${PIP[@]}" install -q --no-build-isolation --no-deps -e .
"${PIP[@]}" check || true   # informative: petastorm/horovod metadata over-declare some ranges

# TF_CPP_MIN_LOG_LEVEL=3: only the build table, not TensorFlow's oneDNN and CPU-feature lines.
check=$(PATH="$VENV/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>&1)
echo "$check"
grep -q '\[X\] TensorFlow' <<<"$check" || { echo "[setup] Horovod was built without TensorFlow" >&2; exit 1; }
grep -q '\[X\] Gloo' <<<"$check" || { echo "[setup] Horovod was built without Gloo" >&2; exit 1; }
if [ "$TF_EXTRA" = gpu ]; then
  grep -q '\[X\] NCCL' <<<"$check" || { echo "[setup] Horovod was built without NCCL" >&2; exit 1; }
fi

echo "$want" > "$STAMP"
echo "[setup] ready: $VENV"

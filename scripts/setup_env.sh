#!/usr/bin/env bash
# Creates (or reuses) the virtual environment of one stack, installed from its hash-locked
# requirements (requirements/<stack>.lock, generated from requirements/<stack>.in by scripts/lock.sh).
# Idempotent: a stamp holding the hash of the lock, the patch and this script skips the work on a rerun.
# Usage: scripts/setup_env.sh [VENV_DIR]            STACK=mission (default) or current; PYTHON=... to choose
#        scripts/setup_env.sh --find-python         prints the Python the stack would use
# The venv defaults to .venv (mission) or .venv-<stack>.
# PIPELINES_TF_EXTRA=gpu installs requirements/<stack>-gpu.lock (TensorFlow with CUDA) and builds
# Horovod with NCCL (the GPU Dockerfile does this); the default, cpu, builds Horovod with Gloo only.
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${STACK:-mission}
python3 -m pipelines.stack check "$STACK" || exit 2
TF_EXTRA=${PIPELINES_TF_EXTRA:-cpu}
LOCK=requirements/$STACK.lock
[ "$TF_EXTRA" = gpu ] && LOCK=requirements/$STACK-gpu.lock
read -r -a VERSIONS <<<"$(python3 -m pipelines.stack pythons "$STACK")"

# A Python of the stack's versions: $PYTHON if given, else python3.X on PATH, in pyenv or in /usr/bin
# for each X the stack names, first that runs; otherwise one line and exit 2.
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
py_fits() { local v; v=$(py_version "$1") || return 1; [[ " ${VERSIONS[*]} " == *" $v "* ]]; }
find_python() {
  local candidates=() v
  if [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON"); else
    for v in "${VERSIONS[@]}"; do
      candidates+=("python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v" "/usr/bin/python$v")
    done
  fi
  for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && py_fits "$c"; then command -v "$c"; return 0; fi
  done
  local found=""; [ -n "${PYTHON:-}" ] && found="; PYTHON=$PYTHON is $( { py_version "$PYTHON" || echo 'not a Python'; } )"
  local wanted="${VERSIONS[*]}"
  echo "[setup] the $STACK stack needs Python ${wanted// / or }${found}: give one with PYTHON=/path/to/python${VERSIONS[0]} make setup STACK=$STACK" >&2
  return 2
}
if [ "${1:-}" = --find-python ]; then find_python; exit; fi
[ -f "$LOCK" ] || { echo "[setup] $LOCK does not exist: scripts/lock.sh makes it" >&2; exit 2; }
if [ "$STACK" = mission ]; then VENV=${1:-.venv}; else VENV=${1:-.venv-$STACK}; fi

if [ -x "$VENV/bin/python" ]; then
  py_fits "$VENV/bin/python" || { echo "[setup] $VENV has Python $(py_version "$VENV/bin/python"), the $STACK stack needs ${VERSIONS[*]}: remove $VENV or choose another VENV" >&2; exit 2; }
else
  PY=$(find_python) || exit 2
fi
STAMP="$VENV/.pipelines-stamp"
PATCH=$(python3 -c "import sys; sys.path.insert(0, '.'); from pipelines import stack; print(stack.get('$STACK').horovod_patch or '')")
want=$( (cat "$LOCK" setup.cfg pyproject.toml scripts/setup_env.sh scripts/lockfile.py ${PATCH:+"$PATCH"}; echo "$STACK $TF_EXTRA") | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import pipelines" 2>/dev/null; then
  echo "[setup] $VENV ($STACK stack) is up to date"
  exit 0
fi
rm -f "$STAMP"  # a venv is usable by others only once the checks below pass
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# 1. Everything but Horovod, each file checked against the lock's sha256; --no-deps: the lock is the
#    whole closure (and tf-keras must not bring a second TensorFlow).
"$VPY" scripts/lockfile.py "$LOCK" --without horovod > "$work/first.txt"
echo "[setup] installing $LOCK ($STACK stack, Python $(py_version "$VPY"), hashes required)"
"${PIP[@]}" install -q --no-deps --require-hashes -r "$work/first.txt"

# 2. Horovod has no wheel: its sdist (hash-checked) compiles against the TensorFlow just installed
#    (about 2.5 min). Released as is on mission (pip caches the built wheel, so a second venv reuses
#    it); on current, patched first, and its wheel kept in $PIPELINES_CACHE/wheels.
"$VPY" scripts/lockfile.py "$LOCK" --only horovod > "$work/horovod.txt"
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo
# the lock's CMake (the venv's bin is on no PATH here; without it Horovod wants a system cmake)
export HOROVOD_CMAKE="$(cd "$VENV/bin" && pwd)/cmake"
if [ "$TF_EXTRA" = gpu ]; then
  # One NCCL in the process: Horovod links (shared) the nvidia-nccl-cu12 wheel that TensorFlow loads,
  # not a second, static copy; the wheel has libnccl.so.2 only, the build looks for libnccl.so.
  # CUDA kernels for Volta, Ampere and Hopper only (unset, every architecture is compiled).
  nccl=$("$VPY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')
  ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED \
         HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-70,80,90}
fi
if ! "$VPY" -c "import horovod.tensorflow" 2>/dev/null; then
  if [ -z "$PATCH" ]; then
    echo "[setup] building Horovod with TensorFlow + Gloo (no MPI)${HOROVOD_GPU_OPERATIONS:+ + $HOROVOD_GPU_OPERATIONS}"
    "${PIP[@]}" install -q --no-deps --require-hashes --no-build-isolation -r "$work/horovod.txt"
  else
    # pip's wheel cache keys on the sdist alone, so the patched wheel is kept under a key of its own:
    # the sdist's pin and hash, the patch, the lock (TensorFlow) and the build's settings (not the venv's
    # own path to CMake, so that another clone finds it).
    key=$( (cat "$work/horovod.txt" "$PATCH" "$LOCK"; py_version "$VPY"
            env | grep '^HOROVOD_' | grep -v '^HOROVOD_CMAKE=' | sort) | sha256sum | cut -c1-16)
    built=${PIPELINES_CACHE:-$HOME/.cache/pipelines}/wheels/horovod-$key
    if ! compgen -G "$built/horovod-*.whl" >/dev/null; then
      echo "[setup] building Horovod with TensorFlow + Gloo (no MPI), patched with $PATCH"
      "${PIP[@]}" download -q --no-deps --no-binary :all: --require-hashes -r "$work/horovod.txt" -d "$work"
      tar -xzf "$work"/horovod-*.tar.gz -C "$work"
      patch -s -p1 -d "$work"/horovod-*/ < "$PATCH"
      "${PIP[@]}" wheel -q --no-deps --no-build-isolation --no-cache-dir -w "$work/wheel" "$work"/horovod-*/
      mkdir -p "$(dirname "$built")" && rm -rf "$built.tmp$$" && mv "$work/wheel" "$built.tmp$$"
      mv -T "$built.tmp$$" "$built" 2>/dev/null || rm -rf "$built.tmp$$"  # another setup kept it first
    else
      echo "[setup] Horovod patched with $PATCH: the wheel built earlier, $built"
    fi
    "${PIP[@]}" install -q --no-deps "$built"/horovod-*.whl
  fi
fi

"${PIP[@]}" install -q --no-build-isolation --no-deps -e .
# informative: petastorm/horovod metadata over-declare some ranges; tf-keras names `tensorflow`
"${PIP[@]}" check || true

bash scripts/horovod_check.sh "$VENV" "$TF_EXTRA"
# The Keras 2 API of the stack imports, and Horovod's Keras module with it.
TF_CPP_MIN_LOG_LEVEL=3 "$VPY" -c "import pipelines.stack.kerasapi as k, horovod.tensorflow.keras; print('[setup] Keras', k.keras_version(), 'from', k.STACK.keras_module)"

echo "$want" > "$STAMP"
echo "[setup] ready: $VENV ($STACK stack)"

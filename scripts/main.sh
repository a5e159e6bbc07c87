#!/usr/bin/env bash
# The main job: real photos -> Spark ETL -> Parquet -> Horovod training, on the embedded sample or,
# with INPUT=ROOT, on your own tree (ROOT/CLASS/*.jpg; no sample download then).
# Called by `make main`; OUT (default out/) receives everything, downloads are cached in
# PIPELINES_CACHE (default ~/.cache/pipelines), NP (default 2) ranks train. Progress shows live
# whatever stdout is (terminal, pipe, nohup, CI): Python is unbuffered and the filter flushes every
# line. VERBOSE=1 shows the libraries' info lines and warnings (quiet by default).
# `main.sh --check-input` only checks INPUT (the Makefile runs it before the venv's set-up).
set -euo pipefail
INPUT=${INPUT:-}
# A relative INPUT is the caller's; a URI (s3://...) is checked by the ETL itself.
[[ -z $INPUT || $INPUT == /* || $INPUT == *://* ]] || INPUT=$PWD/$INPUT
check_input() {
  [[ -z $INPUT || $INPUT == *://* ]] && return 0
  if [ ! -d "$INPUT" ]; then
    echo "make main: INPUT=$INPUT is not a folder (expected ROOT/CLASS/*.jpg)" >&2; exit 2
  fi
  if [ -z "$(find "$INPUT" -mindepth 2 -type f -print -quit)" ]; then
    echo "make main: INPUT=$INPUT holds no file in a class folder (expected ROOT/CLASS/*.jpg)" >&2; exit 2
  fi
}
check_input
[ "${1:-}" != --check-input ] || exit 0
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[[ $VENV == /* ]] || VENV=$PWD/$VENV  # an absolute VENV (the images' /opt/venv) stays as given
OUT=${OUT:-out}
NP=${NP:-2}
export PATH="$VENV/bin:$PATH" PYSPARK_PYTHON="$VENV/bin/python" PYTHONUNBUFFERED=1
VERBOSE_FLAG=()
if [ "${VERBOSE:-0}" != 0 ]; then
  VERBOSE_FLAG=(--verbose)
  export PIPELINES_VERBOSE=1 TF_CPP_MIN_LOG_LEVEL=0
else
  export TF_CPP_MIN_LOG_LEVEL=2
fi
LOG4J=()
[ "${VERBOSE:-0}" != 0 ] || LOG4J=(--driver-java-options "-Dlog4j2.configurationFile=conf/log4j2.properties")
# Java 17 says on stderr that Spark's launcher gave the JVM an incubator module (harmless, once per
# JVM): drop that one line unless VERBOSE (grep's status 1, nothing left to print, is no failure).
quiet_jvm() {
  if [ "${VERBOSE:-0}" != 0 ]; then cat; else
    grep --line-buffered -v -x -F 'WARNING: Using incubator modules: jdk.incubator.vector' || [ $? = 1 ]; fi
}

if [ -n "$INPUT" ]; then
  echo "== 1/4 your images: $INPUT (no sample download)"
else
  echo "== 1/4 sample data: Tux Paint photos as a Caltech-256-style tree"
  INPUT=$OUT/tuxpaint
  python -m pipelines.tools.samples tuxpaint --dest "$INPUT"
fi

echo "== 2/4 Xception ImageNet weights, converted offline"
WEIGHTS=$(python -m pipelines.tools.weights)
echo "$WEIGHTS"

echo "== 3/4 ETL: spark-submit jobs/etl.py"
# 0.3 leaves >= 30 test images of the sample's 148 photos, 0.2 about 30 validation images, the split
# the epoch is chosen on (the split is a hash of each path; the test split is read once, at the end).
spark-submit --master "local[*]" "${LOG4J[@]}" \
  jobs/etl.py --input "$INPUT" --output "$OUT/etl" --test-fraction 0.3 --validation-fraction 0.2 \
    --image-size 299 "${VERBOSE_FLAG[@]}" \
  2>&1 | quiet_jvm

echo "== 4/4 training: horovodrun -np $NP (Gloo, CPU)"
# horovodrun itself loads TensorFlow to check its build; TF 2.21 then logs through absl before absl is
# set up, ignoring TF_CPP_MIN_LOG_LEVEL (tensorflow#100442): drop those INFO lines unless VERBOSE (our
# own processes filter them as they load TensorFlow: pipelines/runtime/tflog.py).
NOISE=(-e '^\[[0-9]*\]<stderr>:  ' -e 'is slow compared to the batch time')
[ "${VERBOSE:-0}" != 0 ] || NOISE+=(-e '^WARNING: All log messages before absl::InitializeLog() is called'
                                   -e '^I[0-9]\{4\} [0-9:.]* *[0-9]* [^ ]*:[0-9]*\] ')
# --overwrite: a rerun replaces the previous main job's run, deleting only the files that run recorded
# --line-buffered: each line goes on as it comes, not in 4 KB blocks minutes later.
# conf/main-train.args: the main job's training options (benchmarks/seed_accuracy.py trains with them too)
read -r -a MAIN_TRAIN < conf/main-train.args
horovodrun -np "$NP" -H "localhost:$NP" --gloo \
  python -u jobs/train.py --data "$OUT/etl" --output "$OUT/train" --weights "$WEIGHTS" \
    "${MAIN_TRAIN[@]}" --cache-dir "$OUT/cache" --overwrite "${VERBOSE_FLAG[@]}" 2>&1 \
  | grep --line-buffered -v "${NOISE[@]}"

python - "$OUT/train/metrics.json" <<'PY'
import json, os, sys
from pipelines.runtime.logs import plural
from pipelines.training.records.report import best_name
m = json.load(open(sys.argv[1]))
t, v = m["test"], m["validation"]
out = os.path.dirname(sys.argv[1])
print(f"\nexact test accuracy: {t['accuracy']:.4f} on {plural(t['count'], 'image')} "
      f"({plural(m['num_classes'], 'class')}, chance {1 / m['num_classes']:.3f}); test loss {t['loss']:.4f}; "
      "the test split was read once, after training, and chose nothing")
print(f"exact validation accuracy of the best epoch: {v['accuracy']:.4f} on {plural(v['expected_count'], 'image')} "
      f"(the split that chose epoch {best_name(m['best_epoch'])})")
p = m.get("probe") or {}
if p.get("test_accuracy") is not None:
    print(f"linear probe beside it: test accuracy {p['test_accuracy']:.4f}, validation accuracy "
          f"{p['validation_accuracy']:.4f} (logistic regression on the same frozen features, C {p['C']:g} chosen on "
          f"validation; {p['seconds']:.1f} s)")
else:
    print(f"linear probe: none ({p.get('skipped', 'not in this report')})")
s = m.get("stopping") or {}
if s:
    print(f"early stopping: --stopping {s['rule']} ({s['monitor']}, patience {plural(s['patience'], 'epoch')} = "
          f"max({s['patience_epochs']}, {s['patience_steps']} steps / {s['steps_per_epoch']} an epoch)); "
          + (f"stopped after epoch {s['stopped_epoch']}" if s["stopped_epoch"] else "the epochs ran out"))
h = m.get("head") or {}
if h:
    print(f"the head started from the {m['head_init']}'s weights; kept: the {h['kept']} head (validation loss: "
          f"trained {h['trained']['loss']:.4f}, the probe's {h['probe']['loss']:.4f})")
print(f"epochs run {m['epochs_run']}, best epoch {best_name(m['best_epoch'])}, world size {m['world_size']}, "
      f"global batch {m['global_batch_size']}, {m['train_images_per_second']:.1f} training images/s")
print(f"model: {out}/model.keras (takes the ETL's uint8 RGB images: {out}/model.json)   report: {sys.argv[1]}")
print("pictures:")
for name, path in m.get("pictures", {}).items():
    print(f"  {name:14s} {path}")
PY

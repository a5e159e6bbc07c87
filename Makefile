# Two commands on a fresh machine: `make main` and `make test`. Both are idempotent.
# STACK=mission (the default: Horovod + Petastorm on TensorFlow 2.15, Python 3.11) or STACK=current
# (TensorFlow 2.21 with tf-keras, patched Horovod, our own reader, Python 3.12); pipelines/stack/__init__.py
# says what differs, requirements/<stack>.in the versions.
STACK  ?= mission
# Checked before anything runs: an unknown stack is one line naming the stacks (exit 2).
STACK_ERROR := $(shell python3 -m pipelines.stack check '$(STACK)' 2>&1)
ifneq ($(STACK_ERROR),)
$(error $(STACK_ERROR))
endif
VENV   ?= $(if $(filter mission,$(STACK)),.venv,.venv-$(STACK))
PY     := $(VENV)/bin/python
OUT    ?= $(if $(filter mission,$(STACK)),out,out-$(STACK))
# make main INPUT=ROOT: your own ROOT/CLASS/*.jpg tree instead of the sample; checked before the set-up.
INPUT  ?=
NP     ?= 2
ifneq ($(INPUT),)
INPUT_ERROR := $(shell INPUT='$(INPUT)' bash scripts/main.sh --check-input 2>&1)
ifneq ($(INPUT_ERROR),)
$(error $(INPUT_ERROR))
endif
endif
export STACK
export PIPELINES_CACHE ?= $(HOME)/.cache/pipelines
# pytest-xdist workers. In the whole suite a test file stays on one worker (--dist loadfile) so
# that its module fixtures (a Spark cluster, a trained run) are built once; it is bound by the CPU,
# and a third worker on 2 cores gained 3 % (1,552 s against 1,597 s, 2026-12-02). The unit tests
# are spread test by test (--dist worksteal) on three: some wait on sockets and timeouts, and on 2
# cores they took 52-54 s with three workers, 59-60 s with two (2026-12-02).
TEST_WORKERS ?= 2
FAST_WORKERS ?= 3
LINT   ?= lint
PYTEST = $(PY) -m pytest -q -p no:cacheprovider --durations=25

.PHONY: setup setup-mission setup-current main tune test test-stack test-tools test-fast lint bench bench-peers lock clean image-test

setup: $(VENV)/.pipelines-stamp

setup-mission setup-current:  ## one stack's set-up by name, so that `make -j2` builds both at once
	$(MAKE) setup STACK=$(@:setup-%=%)

$(VENV)/.pipelines-stamp: requirements/$(STACK).lock setup.cfg pyproject.toml scripts/setup_env.sh scripts/lockfile.py
	bash scripts/setup_env.sh $(VENV)

main: setup  ## fetch the sample photos (or take INPUT=ROOT), run the ETL and training on NP ranks, print the results
	OUT='$(OUT)' VENV='$(VENV)' INPUT='$(INPUT)' NP='$(NP)' bash scripts/main.sh

tune: setup  ## after `make main`: search the head's settings on its feature cache through Spark (TRIALS=16), print the flags for jobs/train.py
	OUT=$(OUT) VENV=$(VENV) bash scripts/tune.sh

test:  ## both stacks: the whole suite on mission, then on current the tests marked `current` and the fast tests that touch the stack
	$(MAKE) -j2 --output-sync=target setup-mission setup-current  # both first: cross-stack tests start the two
	$(MAKE) test-stack STACK=mission
	$(MAKE) test-stack STACK=current LINT=  # the lint once, on mission: current's mypy is another minute

# The current stack's share: the tests marked current, and the fast tests outside the stack-free
# folders (tests/conftest.py, STACKFREE). Each test phase of 1 s or more: benchmarks/results/.
CURRENT_SHARE = ((not slow and not stackfree) or current) and not tool
test-stack: setup $(LINT)  ## one stack's share of the suite (STACK=...): on current, CURRENT_SHARE
	$(PY) -m compileall -q pipelines jobs tests  # once: under PYTHONDONTWRITEBYTECODE every process compiled them
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "$(if $(filter mission,$(STACK)),not tool,$(CURRENT_SHARE))" \
	    --durations-csv=benchmarks/results/test_durations_$(STACK).csv tests

test-tools: setup  ## the tool scripts run whole (scripts/gpu_check.py --dry-run: its scaling and loader runs), on STACK
	$(PYTEST) -m tool tests

test-fast: setup lint  ## lint, then the fast tests, on STACK
	$(PYTEST) -n $(FAST_WORKERS) --dist worksteal -m "not slow" tests

lint: setup  ## ruff (pyflakes, import order) and mypy on pipelines/, configured in pyproject.toml; fails the run when unclean
	$(VENV)/bin/ruff check pipelines
	$(PY) -m mypy

image-test:  ## as root: both stacks' CPU images built on bases made from Debian's archive, `make main` run in each (docs/stacks.md, Container images)
	bash scripts/image_test.sh

bench: setup
	$(PY) benchmarks/etl_bench.py

bench-peers:  ## the loader benchmark's peers (Ray Data) into $(VENV), hash-checked, from requirements/$(STACK)-peers.lock; never the set-up's, never imported by pipelines/
	@[ -x $(PY) ] || { echo "[bench-peers] $(VENV) has no Python: make setup STACK=$(STACK) first" >&2; exit 2; }
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r requirements/$(STACK)-peers.lock

lock:  ## regenerate requirements/$(STACK).lock (and mission-gpu.lock, $(STACK)-peers.lock) from requirements/$(STACK).in (needs the index)
	bash scripts/lock.sh $(STACK)
	if [ $(STACK) = mission ]; then bash scripts/lock.sh mission gpu; fi
	bash scripts/lock.sh $(STACK) peers

clean:
	rm -rf $(OUT) build *.egg-info

# Two commands on a fresh machine: `make main` and `make test`. Both are idempotent.
VENV   ?= .venv
PY     := $(VENV)/bin/python
OUT    ?= out
export PIPELINES_CACHE ?= $(HOME)/.cache/pipelines
# pytest-xdist workers; a test file stays on one worker (--dist loadfile) so that its module
# fixtures (a Spark cluster, a trained run) are built once
TEST_WORKERS ?= 2

.PHONY: setup main test test-fast bench clean

setup: $(VENV)/.pipelines-stamp

$(VENV)/.pipelines-stamp: setup.cfg pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)

main: setup  ## fetch the sample photos, run the ETL (and training), print the results
	OUT=$(OUT) VENV=$(VENV) bash scripts/main.sh

test: setup  ## the whole suite: unit tests and real Spark / Horovod / Petastorm end to end
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

test-fast: setup  ## unit tests only
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

bench: setup
	$(PY) benchmarks/etl_bench.py

clean:
	rm -rf $(OUT) build *.egg-info

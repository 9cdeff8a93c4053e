# Lockstep — developer entry points. Every target bootstraps .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PKG_DIRS := $(shell find lockstep topology barrier readers meta_tables examples -type d -not -name __pycache__)

.PHONY: demo test test-fast lint typecheck format clean bench bench-coordinator bench-scaling \
	bench-pipeline bench-platform bench-exec crash-check crash-check-exec

# The venv, with the project installed editable (strict mode: a link tree that type checkers
# and tools can follow). Re-installed when pyproject.toml changes or a package file is added.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The jars Lockstep puts on a JVM come from Maven Central by their pinned coordinates
# (barrier/jars.py) into ~/.cache/lockstep/jars ($LOCKSTEP_CACHE), once: offline afterwards.
$(VENV)/.installed: pyproject.toml $(PKG_DIRS) | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,spark,service,kafka,lineage]' --config-settings editable_mode=strict
	$(BIN)/lockstep fetch > /dev/null
	touch $@

# dbt for tests/test_exec_dbt.py, in an environment of its own: a dbt project's models run
# under `lockstep exec` like any program (and dbt 1.10's pins conflict with mypy's).
DBT_VENV := .venv-dbt
$(DBT_VENV)/.installed: examples/exec_shopping/dbt/requirements.txt
	$(PYTHON) -m venv $(DBT_VENV)
	$(DBT_VENV)/bin/pip install -q -r $<
	touch $@

demo: $(VENV)/.installed
	$(BIN)/lockstep demo

# Two workers, each taking whole test files (module fixtures stay in one process): most of
# the suite waits on JVMs, subprocesses and servers, so two cores run it in ~15 minutes
# instead of ~26. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed $(DBT_VENV)/.installed lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

test-fast: $(VENV)/.installed
	$(BIN)/pytest -m "not spark and not kafka and not postgres and not slow"

lint: $(VENV)/.installed typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy needs the lockstep.* namespace as files: build a link tree and check it.
typecheck: $(VENV)/.installed
	@rm -rf .typecheck && mkdir -p .typecheck/lockstep
	@for f in $(CURDIR)/lockstep/*; do case $$f in */__pycache__) ;; *) ln -s $$f .typecheck/lockstep/;; esac; done
	@for d in topology barrier readers meta_tables examples; do ln -s $(CURDIR)/$$d .typecheck/lockstep/$$d; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml -p lockstep

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Benchmarks (figures, not pass/fail; see bench/README.md) and the long crash-and-check run.
bench: bench-coordinator bench-scaling bench-pipeline

bench-coordinator: $(VENV)/.installed
	$(BIN)/python bench/coordinator.py

bench-scaling: $(VENV)/.installed
	$(BIN)/python bench/scaling.py

bench-pipeline: $(VENV)/.installed
	$(BIN)/python bench/pipeline.py

bench-platform: $(VENV)/.installed
	$(BIN)/python bench/platform_scale.py

# lockstep exec: a SQL job by exec vs plainly vs the Python runtime, and the shopping
# pipeline as programs through exec --loop (8 barriers, Spark: ~15 min here)
bench-exec: $(VENV)/.installed
	$(BIN)/python bench/exec_pipeline.py --barriers 8

CRASH_MINUTES ?= 10
crash-check: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --coordinator both

crash-check-exec: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --jobs exec

clean:
	rm -rf $(VENV) build .typecheck .pytest_cache .mypy_cache .ruff_cache *.egg-info

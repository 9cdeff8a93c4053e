# Lockstep — developer entry points. Every target bootstraps .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PKG_DIRS := $(shell find lockstep topology barrier readers meta_tables examples -type d -not -name __pycache__)

.PHONY: demo test test-fast test-spark4 servers lint typecheck format clean bench bench-coordinator bench-scaling \
	bench-pipeline bench-platform bench-exec bench-exec-connect bench-pace bench-health bench-log crash-check crash-check-exec \
	crash-check-s3 crash-check-catch-up crash-check-log crash-harness-runs demo-s3 bench-storage engines-check

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

# Spark 4: the project again in an environment of its own (one PySpark an environment), with
# its Iceberg runtime (iceberg-spark-4.0) and the Spark Connect client. make test runs the
# Spark 4 tier in it: the demo, the Spark smoke tests, the exec examples (spawned and over
# Spark Connect) and the engines' reads under each view.
SPARK4_VENV := .venv-spark4
SPARK4_TESTS := tests/barrier/test_spark_smoke.py tests/end_to_end/test_demo.py \
	tests/cli/test_exec_spark.py tests/service/iceberg/test_iceberg_rest_engines.py \
	tests/bench/test_bench_exec_connect_smoke.py tests/cli/test_run_remote.py \
	tests/end_to_end/test_crash_exec.py::test_exec_programs_on_spark_connect_killed_at_random_lose_and_duplicate_nothing
$(SPARK4_VENV)/.installed: pyproject.toml $(PKG_DIRS) | $(VENV)/.installed
	$(PYTHON) -m venv $(SPARK4_VENV)
	$(SPARK4_VENV)/bin/pip install -q --upgrade pip
	$(SPARK4_VENV)/bin/pip install -q -e '.[dev,spark4,service,kafka,lineage]' --config-settings editable_mode=strict
	$(SPARK4_VENV)/bin/lockstep fetch > /dev/null
	touch $@

# The servers the engine and Kafka tests start, fetched from Maven Central before the tests
# (Trino 476, Apache Kafka 4.1.2: tools/_trino.py, tools/_kafka.py; cached, offline after).
servers: $(VENV)/.installed
	$(BIN)/python tools/_kafka.py --fetch > /dev/null
	$(BIN)/python tools/_trino.py > /dev/null

# dbt for tests/cli/test_exec_dbt.py, in an environment of its own: a dbt project's models run
# under `lockstep exec` like any program (and dbt 1.10's pins conflict with mypy's).
DBT_VENV := .venv-dbt
$(DBT_VENV)/.installed: examples/exec_shopping/dbt/requirements.txt
	$(PYTHON) -m venv $(DBT_VENV)
	$(DBT_VENV)/bin/pip install -q -r $<
	touch $@

demo: $(VENV)/.installed
	$(BIN)/lockstep demo

# the demo on an object store: a SeaweedFS of its own, the served catalog vending credentials
# (tools/demo_s3.py; --stay keeps them running: make demo-s3 DEMO_S3_ARGS=--stay)
demo-s3: $(VENV)/.installed
	$(BIN)/python tools/demo_s3.py $(DEMO_S3_ARGS)

# Two workers, each taking whole test files (module fixtures stay in one process): most of
# the suite waits on JVMs, subprocesses and servers, so two cores run it in ~15 minutes
# instead of ~26. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
# Beside the main suite, in one process after the other (their log printed at the end): the
# Spark 4 tier, then the object-store tier (on SeaweedFS, in .venv: the crash harness, the
# storage benchmarks' smoke runs, the jobs with vended credentials) and the tutorial (3 min,
# to even the two sides). Most of the suite waits on JVMs and servers, so they share the
# cores well.
# And from the start, in a process of its own that mostly sleeps: a vended credential's
# expiry (the store's STS issues nothing shorter than 900 s), then the crash harness's
# catch-up run and its other short runs (7 min of the main suite's time before: main took
# 28.5 min with them), its log in .expiry-tier.log.
SIDE_TESTS := tests/end_to_end/test_crash_object_store.py tests/bench/test_bench_storage_smoke.py \
	tests/service/iceberg/test_vending_jobs.py tests/end_to_end/test_tutorial.py
EXPIRY_TESTS := tests/service/iceberg/test_vending_expiry.py tests/end_to_end/test_crash_catch_up.py \
	tests/end_to_end/test_crash_harness.py tests/log/test_log_pipeline.py \
	tests/end_to_end/test_crash_log.py
test: $(VENV)/.installed $(DBT_VENV)/.installed $(SPARK4_VENV)/.installed servers lint
	@$(BIN)/pytest -p no:cacheprovider $(EXPIRY_TESTS) > .expiry-tier.log 2>&1 & expiry=$$!; \
	( $(SPARK4_VENV)/bin/pytest -p no:cacheprovider $(SPARK4_TESTS); spark4=$$?; \
	  $(BIN)/pytest -p no:cacheprovider $(SIDE_TESTS); s3=$$?; exit $$(( spark4 || s3 )) ) \
	  > .side-tiers.log 2>&1 & \
	tier=$$!; $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile \
	  $(addprefix --ignore=,$(SIDE_TESTS) $(EXPIRY_TESTS)); \
	main=$$?; wait $$tier; side=$$?; wait $$expiry; late=$$?; \
	echo "== beside it: the Spark 4 tier ($(SPARK4_VENV)), then the object-store tier:"; \
	grep -E "^(FAILED|ERROR) |^=+ .*(passed|failed|error)" .side-tiers.log; \
	tail -n 30 .side-tiers.log; \
	echo "== and a vended credential's expiry, then the catch-up crash run:"; \
	grep -E "^(FAILED|ERROR) " .expiry-tier.log; tail -n 15 .expiry-tier.log; \
	exit $$(( main || side || late ))

# the Spark 4 tier alone
test-spark4: $(SPARK4_VENV)/.installed
	$(SPARK4_VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile $(SPARK4_TESTS)

test-fast: $(VENV)/.installed
	$(BIN)/pytest -m "not spark and not kafka and not postgres and not mariadb and not slow"

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

# the pipeline on an object store vs a local disk, and a table load with and without vending
bench-storage: $(VENV)/.installed
	$(BIN)/python bench/pipeline_storage.py
	$(BIN)/python bench/vending_loads.py

# lockstep exec over Spark Connect (Spark 4): a job per barrier by exec spawning spark-sql or
# spark-submit, by exec over one warm Spark Connect server, and in the Python runtime
bench-exec-connect: $(SPARK4_VENV)/.installed
	$(SPARK4_VENV)/bin/python bench/exec_connect.py --barriers 8

# lockstep exec: a SQL job by exec vs plainly vs the Python runtime, and the shopping
# pipeline as programs through exec --loop (8 barriers, Spark: ~15 min here)
bench-exec: $(VENV)/.installed
	$(BIN)/python bench/exec_pipeline.py --barriers 8

# barriers at the pipeline's pace (#47): a job slower than the interval under the plain clock,
# a cap on barriers in flight, and the cap with catch-up (30 barriers each: ~9 min here)
bench-pace: $(VENV)/.installed
	$(BIN)/python bench/pipeline_pace.py

# /healthz on the service's port and on its health port while 30 threads load tables of the
# served catalog (#48): 10 rounds of a baseline and a flood of 300 loads (~2 min here)
bench-health: $(VENV)/.installed
	$(BIN)/python bench/health_under_load.py

# the log tier (#50): issue -> log consumer beside issue -> snapshot, and the log's cost to a job
bench-log: $(VENV)/.installed
	$(BIN)/python bench/log_tier.py

CRASH_MINUTES ?= 10
crash-check: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --coordinator both

# The long form of the engines' reads (CI runs the short one in
# tests/service/iceberg/test_iceberg_rest_engines.py): DuckDB, pyiceberg, Spark 3.5, Spark 4
# and Trino, 100 reads each under every view while the demo advances >= 20 barriers through
# the served catalog on PostgreSQL (an hour or more).
ENGINES_ARGS ?= --reads 100 --min-barriers 20
engines-check: $(VENV)/.installed $(SPARK4_VENV)/.installed servers
	$(BIN)/python tools/engines_check.py $(ENGINES_ARGS)

crash-check-exec: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --jobs exec

# CI's short crash-harness tests under two workers, RUNS times, each in a fresh clone of HEAD
# (tools/clean_clone_runs.py: committed work only; a failed run kept whole, its path printed)
RUNS ?= 20
crash-harness-runs: $(VENV)/.installed
	$(BIN)/python tools/clean_clone_runs.py --runs $(RUNS)

# the same on an object store: a SeaweedFS per run, restarted mid-barrier (tools/_crash_s3.py)
crash-check-s3: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --coordinator both --warehouse s3

# with catch-up jobs (#47, tools/_crash_catch_up.py): the deep pipeline's jobs registered with
# catch_up (all but top_items), the roots reading windows, barriers faster than the jobs; each
# table checked at the barriers it has, the skipped ones listed in __META_TABLE_SKIPPED and
# never read at RC/RR; then the exec programs the same way
crash-check-catch-up: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --coordinator both --catch-up
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --jobs exec --catch-up

# with the log tier (#50 item 2, tools/_crash_log.py): every job's sink logged on a Kafka broker
# each run starts, job processes also killed at before_log, log_sent and after_log; each
# table's log read whole: exactly its WRITTEN barriers, each with the changes between its
# snapshots, and __META_LOG's rows naming their snapshots and ends
crash-check-log: $(VENV)/.installed
	$(BIN)/python tools/crash_check.py --minutes $(CRASH_MINUTES) --coordinator both --log

clean:
	rm -rf $(VENV) $(SPARK4_VENV) $(DBT_VENV) build .typecheck .pytest_cache .mypy_cache .ruff_cache *.egg-info

# Every target sets itself up from a fresh machine: scripts/bootstrap.sh installs the locked versions.
# Python writes the bytecode of what it imports (its default), even where the machine says not to
# (PYTHONDONTWRITEBYTECODE, set on this machine and CI's): the tests start hundreds of processes (agents,
# Airflow tasks, first tries) that would otherwise compile every module they import, 40 % of a fresh
# Airflow process's CPU. The first importer writes it, into .venv and this tree's __pycache__ folders.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test faults campaign lint bench airflow permissions

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/python scripts/demo.py

airflow: setup
	.venv/bin/cloudtrain up

# The suite runs in TEST_WORKERS processes (pytest-xdist; each has its own Airflow home, DB and
# emulator): most tests wait on emulated instances, so more workers than cores pays (6 against 4 on
# 2 cores: pytest 10:36 against 12:24, the same CPU-seconds, docs/testing.md). PYTEST_ARGS
# narrows it, e.g. `make test PYTEST_ARGS=tests/cloud/test_runs.py`. The duplicate cases of the long
# fault campaigns (marker `faults`, docs/testing.md) run in `make faults`, not here.
TEST_WORKERS ?= 6
PYTEST = .venv/bin/python -m pytest -p no:cacheprovider -q -n $(TEST_WORKERS) --dist worksteal
# Before the workers start (make test, make faults): our modules' bytecode (`compileall`), pytest's
# rewritten test modules once for all workers, the collection's biggest imports' bytecode
PREPARE = .venv/bin/python scripts/warm_bytecode.py & .venv/bin/python scripts/rewrite_tests.py & \
	.venv/bin/python -m compileall -q airflow_cloudtrain example_dags; compiled=$$?; wait; exit $$compiled
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check airflow_cloudtrain tests benchmarks example_dags
	@# bytecode for our modules too: the agents and Airflow processes the tests start would compile them;
	@# beside it, pytest's rewritten test modules, once for the six workers (scripts/rewrite_tests.py),
	@# and the bytecode of the collection's biggest imports, one process per core (scripts/warm_bytecode.py)
	$(PREPARE)
	@# mypy (one thread, ~25 CPU-seconds from a fresh clone) runs beside the suite, which leaves the
	@# cores idle a sixth of the time; its verdict fails `make test` as before, printed after the suite
	@out=$$(mktemp); .venv/bin/mypy > $$out 2>&1 & types_pid=$$!; \
	$(PYTEST) --durations=15 -m "not faults" $(PYTEST_ARGS); tests=$$?; \
	wait $$types_pid; types=$$?; echo "mypy:"; cat $$out; rm -f $$out; \
	exit $$(( tests != 0 ? tests : types ))

# The long campaigns: every kill point on the second cloud or in the second mode, the whole real
# deployment. Not in CI's `make test`; run it before a release or after touching the run machinery.
# Then the randomized fault campaign (benchmarks/faults.py, docs/reliability.md): FAULT_SCENARIOS drawn
# from FAULT_SEED, in FAULT_WORKERS processes (`make campaign` runs it alone).
FAULT_SCENARIOS ?= 200
FAULT_SEED ?= 1
FAULT_WORKERS ?= 2
faults: setup
	$(PREPARE)
	$(PYTEST) --durations=15 -m faults $(PYTEST_ARGS)
	.venv/bin/python benchmarks/faults.py --scenarios $(FAULT_SCENARIOS) --seed $(FAULT_SEED) --workers $(FAULT_WORKERS)

campaign: setup
	.venv/bin/python benchmarks/faults.py --scenarios $(FAULT_SCENARIOS) --seed $(FAULT_SEED) --workers $(FAULT_WORKERS)

bench: setup
	.venv/bin/python benchmarks/parse_cost.py
	.venv/bin/python benchmarks/catalog.py
	.venv/bin/python benchmarks/poll_calls.py
	.venv/bin/python benchmarks/spot_policy.py
	.venv/bin/python benchmarks/recovery.py
	.venv/bin/python benchmarks/fleet.py --quick

# Re-record which API calls each operator's runs make (both clouds, both sides) and regenerate the
# permission documents from them (README "Permissions"): the tests that run operators, with
# CLOUDTRAIN_RECORD_CALLS set (tests/api_calls_hook.py), then the record is replaced by what they called.
permissions: setup
	@calls=$$(mktemp -d) && \
	CLOUDTRAIN_RECORD_CALLS=$$calls $(PYTEST) -m "not faults" tests/dags tests/cloud tests/system $(PYTEST_ARGS); \
	.venv/bin/python -m airflow_cloudtrain.permissions.generate --merge $$calls

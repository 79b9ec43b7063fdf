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
PYTEST_ONE = .venv/bin/python -m pytest -p no:cacheprovider -q
PYTEST = $(PYTEST_ONE) -n $(TEST_WORKERS) --dist worksteal
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
	@# The xdist workers' cloud tests leave the cores idle about a seventh of the run while they wait
	@# on emulated instances. Two jobs that never wait take those idle cycles at the lowest CPU priority
	@# (nice 19) instead of a worker's turn: mypy (one thread, ~25 CPU-seconds from a fresh clone) and,
	@# unless PYTEST_ARGS names what to run, the unit tests (tests/unit: 6,000 cases, no instance, ~70
	@# CPU-seconds) in one process of their own. Each verdict fails `make test`; each output is printed
	@# after the workers' run (docs/testing.md, "The idle cores").
	@out=$$(mktemp); nice -n 19 .venv/bin/mypy > $$out 2>&1 & types_pid=$$!; \
	units=$$(mktemp); unit_pid=; split=; \
	if [ -z "$(PYTEST_ARGS)" ]; then \
	  nice -n 19 $(PYTEST_ONE) --durations=5 -m "not faults" tests/unit > $$units 2>&1 & unit_pid=$$!; \
	  split=--ignore=tests/unit; \
	fi; \
	trap 'kill $$types_pid $$unit_pid 2>/dev/null' INT TERM; \
	$(PYTEST) --durations=15 -m "not faults" $$split $(PYTEST_ARGS); tests=$$?; \
	unit=0; if [ -n "$$unit_pid" ]; then wait $$unit_pid; unit=$$?; echo "tests/unit (one process, nice 19):"; \
	  cat $$units; fi; rm -f $$units; \
	wait $$types_pid; types=$$?; echo "mypy:"; cat $$out; rm -f $$out; \
	exit $$(( tests != 0 ? tests : unit != 0 ? unit : types ))

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

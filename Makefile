# Every target sets itself up from a fresh machine: scripts/bootstrap.sh installs the locked versions.
.PHONY: setup demo test lint bench airflow

setup:
	@bash scripts/bootstrap.sh

demo: setup
	.venv/bin/python scripts/demo.py

airflow: setup
	.venv/bin/cloudtrain up

test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check airflow_cloudtrain tests benchmarks example_dags
	.venv/bin/python -m pytest -p no:cacheprovider -q

bench: setup
	.venv/bin/python benchmarks/catalog.py
	.venv/bin/python benchmarks/poll_calls.py
	.venv/bin/python benchmarks/spot_policy.py
	.venv/bin/python benchmarks/recovery.py
	.venv/bin/python benchmarks/fleet.py --quick

#!/usr/bin/env bash
# Create .venv with exactly the locked versions (requirements-lock.txt) and this package in editable mode.
# Idempotent: a second run only re-syncs when the lock changed.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi
stamp=.venv/.lock-sha
want=$(sha256sum requirements-lock.txt pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -d .venv ] || uv venv --quiet --python python3 .venv
# --compile-bytecode: every process (the tests start hundreds: agents, Airflow tasks) would otherwise
# compile each module it imports, where PYTHONDONTWRITEBYTECODE keeps Python from caching it (40 % of
# a fresh Airflow process's CPU); the .pyc files are written once here instead.
uv pip sync --quiet --compile-bytecode --python .venv/bin/python requirements-lock.txt
uv pip install --quiet --python .venv/bin/python --no-deps -e .
echo "$want" > "$stamp"

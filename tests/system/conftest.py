"""System tests, the Airflow providers' way: ``example_*.py`` DAG files, each ending in
``test_run = get_test_run(dag)``, collected here. Against a real account when ``SYSTEM_TESTS_ENV_ID`` is
set (with ``CLOUDTRAIN_SYSTEM_BUCKET`` / ``CLOUDTRAIN_SYSTEM_GCS_BUCKET``), else against the emulated
clouds (``make test``), so they never rot. See README "System tests"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def pytest_collect_file(file_path: Path, parent: Any) -> Any:
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest collects it itself
    if file_path.name.startswith("example_") and file_path.suffix == ".py":
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture
def system_clouds(request: pytest.FixtureRequest) -> Any:
    """The real account (nothing to do) or the emulated clouds with a migrated Airflow DB."""
    from system_helpers import REAL

    request.getfixturevalue("airflow_db")
    if REAL:
        return None
    return request.getfixturevalue("emu")

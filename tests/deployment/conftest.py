"""A real Airflow deployment: ``cloudtrain up``'s code (:mod:`airflow_cloudtrain.cli_up`)
starts api-server, scheduler, dag-processor and triggerer (LocalExecutor, SQLite) in a temporary
AIRFLOW_HOME against the session's emulator; the tests drive it through the public REST API (v2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deployment_helpers import TEST_SETTINGS, Api, Deployment, wait_for

from airflow_cloudtrain.cli_up import EXAMPLE_DAGS, free_port, home_secrets, local_airflow


@pytest.fixture()
def deployment(_emulator: Any, tmp_path: Path) -> Iterator[Deployment]:
    home = tmp_path / "airflow_home"
    with local_airflow(home, EXAMPLE_DAGS, free_port(), _emulator.env(), TEST_SETTINGS) as airflow:
        api = Api(airflow, home_secrets(home)["password"])
        wait_for("ui_train to be parsed", lambda: _has_dag(api, "ui_train"), timeout=300)
        api.call("PATCH", "/dags/ui_train", {"is_paused": False})  # new DAGs start paused, as in Airflow
        yield Deployment(airflow, api, home)
    assert airflow.left_running() == [], "processes of the deployment left running"


def _has_dag(api: Api, dag_id: str) -> bool:
    try:
        return bool(api.call("GET", f"/dags/{dag_id}"))
    except AssertionError:
        return False

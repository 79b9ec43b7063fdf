"""A real Airflow deployment: ``cloudtrain up`` itself (what ``make airflow`` runs), a process of its
own with its own emulated clouds, in a temporary AIRFLOW_HOME; the tests drive it through the public
REST API (v2), the ``cloudtrain`` CLI next to it, and signals, as a user would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deployment_helpers import Api, Deployment, Up
from waiting import wait_for

from airflow_cloudtrain.cli_up import free_port, home_secrets


@pytest.fixture()
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    up = Up(tmp_path / "airflow_home", free_port())
    try:
        up.start()
        api = Api(up, home_secrets(up.home)["password"])
        wait_for(lambda: api.has_dag("ui_train"), timeout=300, interval=1.0, message="ui_train to be parsed")
        api.call("PATCH", "/dags/ui_train", {"is_paused": False})  # new DAGs start paused, as in Airflow
        yield Deployment(up, api)
    finally:
        up.kill_everything()
    assert up.left_running() == [], "processes of the deployment left running"

"""Driving a real Airflow deployment from tests: the public REST API (v2) and waiting on conditions."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.cli_up import LocalAirflow

# Test-only settings: a triggerer that stopped heartbeating is replaced after 15 s, not 30 s, so the
# killed-triggerer test needs a shorter job. Everything else is what ``cloudtrain up`` runs.
TEST_SETTINGS = {
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "3",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__CORE__PARALLELISM": "4",
}


def wait_for(what: str, check: Callable[[], Any], timeout: float = 300.0, every: float = 1.0) -> Any:
    """``check()``'s first truthy value; fails the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {value!r})")
        time.sleep(every)


class Api:
    """The public REST API (``/api/v2``) with a JWT from the simple auth manager's token endpoint."""

    def __init__(self, airflow: LocalAirflow, password: str) -> None:
        self.airflow = airflow
        self.password = password
        self._token = airflow.token(password)

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        url = f"{self.airflow.url}/api/v2{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        for _ in range(2):
            request = urllib.request.Request(
                url,
                method=method,
                data=None if body is None else json.dumps(body).encode(),
                headers={
                    "Authorization": f"Bearer {self._token}",
                    "Content-Type": "application/json",
                    "Accept": "application/json",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as err:
                if err.code == 401:  # token expired: one more try with a fresh one
                    self._token = self.airflow.token(self.password)
                    continue
                raise AssertionError(f"{method} {path}: HTTP {err.code} {err.read().decode()[:500]}") from err
        raise AssertionError(f"{method} {path}: still unauthorized with a fresh token")

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def task(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"))

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        return self.call("GET", path, query={"deserialize": "true"})["value"]

    def log_lines(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[str]:
        """The task log as the UI shows it (the worker's and the triggerer's parts), one event a line."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        content = self.call("GET", path, query={"full_content": "true"})["content"]
        return [str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in content]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 420.0) -> str:
        """The run's final state (``success`` or ``failed``)."""
        return str(
            wait_for(
                f"{dag_id} run {run_id} to end",
                lambda: (s := self.run_state(dag_id, run_id)) in ("success", "failed") and s,
                timeout,
                every=2,
            )
        )


class Deployment:
    def __init__(self, airflow: LocalAirflow, api: Api, home: Path) -> None:
        self.airflow, self.api, self.home = airflow, api, home

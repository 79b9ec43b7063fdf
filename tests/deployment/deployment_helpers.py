"""Driving a real Airflow deployment from tests: the public REST API (v2) and waiting on conditions."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
from waiting import wait_for

# Test-only settings (``cloudtrain up --set``): a triggerer that stopped heartbeating is replaced
# after 15 s, not 30 s, so the killed-triggerer test needs a shorter job. Everything else is what
# ``cloudtrain up`` runs.
TEST_SETTINGS = {
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "3",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "15",
    "AIRFLOW__CORE__PARALLELISM": "4",
    # the DAG files do not change while a test's deployment runs: parsed once at the start, not again
    # every 30 s (the default); the two deployments of make test: 41 parsing processes -> 17, ~2 CPU-s
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
    # not AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=3 (tried: the three deployments' schedulers took
    # 31 CPU-seconds instead of 55): the LocalExecutor's event for a task's deferring half is then read up
    # to 3 s later, and a trigger that fires within it had its resumed task killed as no longer running
    # (retrain_spot in the browser test, a spot notice 6 s after the relaunch), an Airflow race it widens
}
UP_DEADLINE_S = 600.0  # migrating and starting four Airflow processes on a busy machine


class Api:
    """The public REST API (``/api/v2``) with a JWT from the simple auth manager's token endpoint."""

    def __init__(self, airflow: Any, password: str) -> None:
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

    def has_dag(self, dag_id: str) -> bool:
        """Whether the dag-processor has parsed ``dag_id`` yet (404 until then)."""
        try:
            return bool(self.call("GET", f"/dags/{dag_id}"))
        except AssertionError:
            return False

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
                lambda: (s := self.run_state(dag_id, run_id)) in ("success", "failed") and s,
                timeout=timeout,
                interval=2,
                message=f"{dag_id} run {run_id} to end",
            )
        )


class Up:
    """``cloudtrain up`` as ``make airflow`` runs it: a process in a session of its own, its output in
    files; the test finds Airflow's processes among its children, as a user would with ``ps``."""

    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.url = f"http://localhost:{port}"
        self.out, self.err = home.parent / "up.out", home.parent / "up.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: set[int] = set()  # every process seen under it, for the check that none is left
        self._ups = 0  # "Airflow is up" lines seen: one per start
        self.extra_args: list[str] = []  # more `cloudtrain up` arguments (the production test's)

    def start(self) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AWS_")) and k != "STORAGE_EMULATOR_HOST"
        }
        args = [a for key, value in TEST_SETTINGS.items() for a in ("--set", f"{key}={value}")]
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "airflow_cloudtrain.cli",
                    "up",
                    "--home",
                    str(self.home),
                    "--port",
                    str(self.port),
                    *args,
                    *self.extra_args,
                ],
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        wait_for(
            lambda: self.stdout().count("Airflow is up") > self._ups or self._exited(),
            timeout=UP_DEADLINE_S,
            interval=2,
            message="cloudtrain up to say Airflow is up",
        )
        assert self.proc.poll() is None, f"cloudtrain up exited:\n{self.stderr()[-3000:]}"
        self._ups += 1

    def _exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stdout(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def children(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.pids.update(p.pid for p in found)
        return found

    def airflow_process(self, name: str) -> psutil.Process:
        """The ``airflow <name>`` process ``cloudtrain up`` started (the leader of its session)."""
        for proc in self.children():
            with contextlib.suppress(psutil.Error):
                cmd = proc.cmdline()
                if cmd[-3:] == ["-m", "airflow", name] and proc.pid == os.getsid(proc.pid):
                    return proc
        raise AssertionError(f"no airflow {name} under cloudtrain up")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Ctrl-C's or SIGTERM's stop; the exit status."""
        assert self.proc is not None
        self.children()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=UP_DEADLINE_S)

    def left_running(self) -> list[int]:
        alive = []
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        return alive

    def kill_everything(self) -> None:
        """After a failed test: nothing of it may outlive the test."""
        if self.proc is not None and self.proc.poll() is None:
            self.children()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.left_running():
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        wait_for(
            lambda: not self.left_running(), timeout=120, interval=0.5, message="the killed processes to end"
        )

    def token(self, password: str, user: str = "admin") -> str:
        body = json.dumps({"username": user, "password": password}).encode()
        request = urllib.request.Request(
            f"{self.url}/auth/token", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return str(json.loads(resp.read())["access_token"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``cloudtrain`` command in a shell that sourced the env file ``cloudtrain up`` wrote."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AWS_"))}
        command = (
            f"source {shlex.quote(str(self.home / 'emulator.env'))} && {shlex.quote(sys.executable)} "
            f"-m airflow_cloudtrain.cli {' '.join(shlex.quote(a) for a in args)}"
        )
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300)

    def running_instances(self) -> list[dict[str, Any]]:
        """What ``cloudtrain emulator status --json`` lists."""
        done = self.cli("emulator", "status", "--json")
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout))

    def ec2(self) -> Any:
        return self.aws("ec2")

    def aws(self, service: str) -> Any:
        """A boto3 client of ``service`` on this deployment's emulated AWS (its ``emulator.env``)."""
        import boto3

        from airflow_cloudtrain.cli_emulator import read_env_file

        env = read_env_file(self.home / "emulator.env")
        return boto3.client(
            service,
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name=env["AWS_DEFAULT_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )


class Deployment:
    def __init__(self, up: Up, api: Api) -> None:
        self.up, self.api = up, api

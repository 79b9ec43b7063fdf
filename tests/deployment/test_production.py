"""The provider in a production-shaped Airflow: ``cloudtrain up --production`` (PostgreSQL, Redis,
CeleryExecutor with two workers, two triggerers), started once for the module, driven through the
REST API and signals as an operator of such a deployment would.

In ``make test``: 16 deferred runs of mixed operators (CloudTrainOperator and CheckpointResumeOperator
on both clouds, a sensor) spread over both triggerers, one triggerer SIGKILLed mid-run; every run ends
well, no instance launched twice, nothing left. The same with 40 runs is in ``make faults``: the
deployment spends about 19 CPU-seconds per run (two Celery task executions and the trigger), and
``make test`` must fit 2 cores (docs/testing.md). PostgreSQL and Redis come from the machine's packages:
``cloudtrain up --production`` installs them with apt-get when they are missing (CI runs as root).
In ``make faults``: a Celery worker SIGKILLed during a blocking CheckpointResumeOperator run (the
retry adopts the same instance).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from deployment_helpers import Api, Deployment, Up
from waiting import wait_for

from airflow_cloudtrain.cli_up import free_port, home_secrets
from airflow_cloudtrain.cli_up_production import PROD_ENV_FILE, TRIGGERERS, WORKERS, production_settings
from airflow_cloudtrain.contract.runs import TAG_RUN

T = TypeVar("T")
DAGS = Path(__file__).resolve().parent / "production_dags"
DAG_IDS = ("prod_train", "prod_resume", "prod_sensor", "prod_blocking")
SETTINGS = {
    "AIRFLOW__CORE__PARALLELISM": "32",
    # each triggerer takes at most 12 triggers: of 16 (or 40) runs, both must hold some whatever their
    # timing; with 40, the rest wait in the table for a free slot
    "AIRFLOW__TRIGGERER__CAPACITY": "12",
    # a task whose worker was killed is failed (and retried) after 120 s without a heartbeat, not 300 s
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "120",
}
# (dag, cloud) -> how many runs
MIX_16 = {
    ("prod_train", "ec2"): 5,
    ("prod_train", "gcloud"): 4,
    ("prod_resume", "ec2spot"): 3,
    ("prod_resume", "gcspot"): 2,
    ("prod_sensor", "ec2"): 2,
}
MIX_40 = {
    ("prod_train", "ec2"): 12,
    ("prod_train", "gcloud"): 10,
    ("prod_resume", "ec2spot"): 8,
    ("prod_resume", "gcspot"): 6,
    ("prod_sensor", "ec2"): 4,
}


@pytest.fixture(scope="module")
def prod() -> Iterator[Deployment]:
    # PostgreSQL runs as the postgres user (it refuses root): its data folder must be reachable by it,
    # which pytest's 0700 tmp folders are not
    base = Path(tempfile.mkdtemp(prefix="cloudtrain-prod-"))
    base.chmod(0o711)
    up = Up(base / "airflow_home", free_port())
    up.extra_args = ["--production", "--dags-folder", str(DAGS)]
    up.extra_args += [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    try:
        up.start()
        password = home_secrets(up.home)["password"]
        api = wait_for(
            lambda: _patient(lambda: Api(up, password)), timeout=300, interval=2, message="a token"
        )
        for dag_id in DAG_IDS:
            wait_for(lambda d=dag_id: _has_dag(api, d), timeout=300, interval=1.0, message=f"{dag_id} parsed")
            wait_for(lambda d=dag_id: _patient(lambda: _unpause(api, d)), timeout=300, interval=2)
        yield Deployment(up, api)
    finally:
        up.kill_everything()
        shutil.rmtree(base, ignore_errors=True)
    assert up.left_running() == [], "processes of the deployment left running"


def _unpause(api: Api, dag_id: str) -> Any:
    return api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})  # new DAGs start paused


def _has_dag(api: Api, dag_id: str) -> bool:
    try:
        return bool(api.call("GET", f"/dags/{dag_id}"))
    except (AssertionError, OSError):
        return False


def _process_by_output(up: Up, name: str) -> psutil.Process:
    """``cloudtrain up``'s process ``name`` (two triggerers share one command line: told apart by the
    ``<name>.out`` file their output goes to)."""
    want = str((up.home / "logs" / f"{name}.out").resolve())
    for proc in up.children():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid == os.getsid(proc.pid) and os.readlink(f"/proc/{proc.pid}/fd/1") == want:
                return proc
    raise AssertionError(f"no {name} under cloudtrain up")


def _query(up: Up, sql: str) -> list[tuple[Any, ...]]:
    """A query on the deployment's metadata database, as its ``airflow`` role (``production.env``)."""
    import psycopg2

    settings = production_settings(up.home.resolve())
    conn = psycopg2.connect(
        host="127.0.0.1",
        port=int(settings["POSTGRES_PORT"]),
        user="airflow",
        password=settings["AIRFLOW_DB_PASSWORD"],
        dbname="airflow",
        connect_timeout=30,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _triggers_by_triggerer(up: Up) -> dict[int | None, int]:
    """The trigger table: how many triggers each triggerer (its job id) holds."""
    rows = _query(up, "SELECT triggerer_id, count(*) FROM trigger GROUP BY triggerer_id")
    return {row[0]: int(row[1]) for row in rows}


def _triggers_on_silent_triggerers(up: Up) -> int:
    """Triggers still assigned to a triggerer that stopped heartbeating (TEST_SETTINGS: every 3 s)."""
    sql = (
        "SELECT count(*) FROM trigger t JOIN job j ON t.triggerer_id = j.id "
        "WHERE j.latest_heartbeat < now() - interval '20 seconds'"
    )
    return int(_query(up, sql)[0][0])


def _both_hold(up: Up) -> dict[int | None, int] | None:
    held = _triggers_by_triggerer(up)
    return held if len([t for t, n in held.items() if t is not None and n]) >= 2 else None


def _ec2_launches_per_run(up: Up) -> collections.Counter[str]:
    """Every EC2 instance the emulated cloud ever ran (terminated ones too), counted per run id tag."""
    counts: collections.Counter[str] = collections.Counter()
    for page in up.ec2().get_paginator("describe_instances").paginate():
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                if TAG_RUN in tags:
                    counts[tags[TAG_RUN]] += 1
    return counts


def _patient(call: Callable[[], T]) -> T | None:
    """``call()``, or None when the api-server did not answer in time (two cores, 40 runs starting):
    for ``wait_for`` to ask again."""
    try:
        return call()
    except OSError:  # a timeout, a refused or reset connection
        return None


def _trigger(api: Api, dag_id: str, run_id: str, conf: dict[str, Any]) -> str:
    """A run with our own ``dag_run_id``, so that asking again after a timeout never makes a second one."""

    def post() -> str | None:
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf}
        try:
            return str(api.call("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"])
        except AssertionError as err:
            if "HTTP 409" in str(err):  # the earlier try made it
                return run_id
            raise
        except OSError:
            return None

    return wait_for(post, timeout=600, interval=2, message=f"{dag_id} {run_id} to be triggered")


def _wait_run(api: Api, dag_id: str, run_id: str, timeout: float) -> str:
    return wait_for(
        lambda: (s := _patient(lambda: api.run_state(dag_id, run_id))) in ("success", "failed") and s,
        timeout=timeout,
        interval=3,
        message=f"{dag_id} run {run_id} to end",
    )


def _xcom(api: Api, dag_id: str, run_id: str) -> Any:
    return wait_for(lambda: _patient(lambda: api.xcom(dag_id, run_id, "train")), timeout=300, interval=2)


def _mixed_runs(api: Api, mix: dict[tuple[str, str], int]) -> list[tuple[str, str, str]]:
    # long enough that the kill lands while most runs are deferred, short enough for make test
    command = "echo start-$((1+1)); sleep 45; echo end-$((2+2))"
    runs = []
    total = sum(mix.values())
    for (dag_id, cloud), count in mix.items():
        for k in range(count):
            run_id = _trigger(api, dag_id, f"mix{total}-{cloud}-{k}", {"cloud": cloud, "command": command})
            runs.append((dag_id, cloud, run_id))
    return runs


@pytest.mark.timeout(
    3600
)  # one start of the deployment, the runs on two shared cores; each wait has its deadline
@pytest.mark.parametrize(
    # the whole deployment's start and 16 runs cost ~220 CPU-seconds: a campaign, in make faults
    "mix",
    [
        pytest.param(MIX_16, id="16", marks=pytest.mark.faults),
        pytest.param(MIX_40, id="40", marks=pytest.mark.faults),
    ],
)
def test_deferred_runs_over_two_triggerers_one_killed(
    prod: Deployment, mix: dict[tuple[str, str], int]
) -> None:
    up, api = prod.up, prod.api
    assert (
        set(production_settings(up.home.resolve())) and (up.home / PROD_ENV_FILE).stat().st_mode & 0o077 == 0
    )
    for name in (*TRIGGERERS, *WORKERS):
        _process_by_output(up, name)  # all four run
    runs = _mixed_runs(api, mix)
    # both triggerers hold triggers (each takes at most 12): then one is killed mid-run
    held = wait_for(
        lambda: _both_hold(up), timeout=900, interval=2, message="both triggerers to hold triggers"
    )
    _process_by_output(up, TRIGGERERS[0]).send_signal(signal.SIGKILL)  # as a lost machine would
    wait_for(
        lambda: re.search(r"airflow triggerer-1 exited with signal SIGKILL.*restarting it", up.stderr()),
        timeout=180,
        interval=1.0,
        message="cloudtrain up to notice the killed triggerer",
    )
    # Airflow hands the dead triggerer's triggers to a live one (the other, or triggerer-1 restarted)
    wait_for(
        lambda: _triggers_on_silent_triggerers(up) == 0,
        timeout=600,
        interval=2,
        message=f"the killed triggerer's triggers to move (before the kill: {held})",
    )
    ends = {run_id: _wait_run(api, dag_id, run_id, timeout=1500) for dag_id, _, run_id in runs}
    failed = [r for r in runs if ends[r[2]] != "success"]
    assert not failed, failed
    results: dict[str, Any] = {run_id: _xcom(api, dag_id, run_id) for dag_id, _, run_id in runs}
    assert all(r["exit_code"] == 0 for r in results.values()), results
    # no instance launched twice: one EC2 instance per run (the emulated EC2 keeps terminated ones)
    launches = _ec2_launches_per_run(up)
    ec2_runs = [results[run_id]["run_id"] for _, cloud, run_id in runs if cloud.startswith("ec2")]
    assert {run: launches[run] for run in ec2_runs} == dict.fromkeys(ec2_runs, 1), launches
    # nothing left on either cloud, and Airflow's side of it: no trigger row left
    assert up.running_instances() == []
    assert _triggers_by_triggerer(up) == {}
    assert up.stop() == 0, up.stderr()[-3000:]
    assert up.left_running() == []
    assert "Stopped." in up.stdout()


def _log_lines(api: Api, dag_id: str, run_id: str) -> list[str]:
    """The task's first try's log, or nothing while it has none (not started, or no answer in time)."""
    try:
        return api.log_lines(dag_id, run_id, "train")
    except (AssertionError, OSError):  # 404 until the task instance exists
        return []


def _task_process(up: Up, ti_id: str) -> psutil.Process | None:
    """The process running task instance ``ti_id`` in a Celery worker (titled ``airflow worker -- <id>``)."""
    for proc in up.children():
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(f"airflow worker -- {ti_id}"):
                return proc
    return None


def _worker_of(up: Up, proc: psutil.Process) -> str:
    """Which of ``cloudtrain up``'s workers ``proc`` runs under (its session's ``<name>.out``)."""
    leader = os.getsid(proc.pid)
    for name in WORKERS:
        if _process_by_output(up, name).pid == leader:
            return name
    raise AssertionError(f"{proc.pid} runs under no worker")


@pytest.mark.faults
@pytest.mark.timeout(1800)
def test_a_worker_killed_during_a_blocking_run_the_retry_adopts_the_instance(prod: Deployment) -> None:
    up, api = prod.up, prod.api
    command = "echo first-$((1+1)); sleep 120; echo done-$((2+2))"
    run_id = _trigger(api, "prod_blocking", "blocking-1", {"cloud": "ec2spot", "command": command})
    wait_for(
        lambda: any("first-2" in line for line in _log_lines(api, "prod_blocking", run_id)),
        timeout=600,
        interval=2,
        message="the job's first line in the blocking task's log",
    )
    instances = up.running_instances()
    assert len(instances) == 1, instances
    ti_id = str(api.task("prod_blocking", run_id, "train")["id"])
    task = wait_for(lambda: _task_process(up, ti_id), timeout=60, interval=1, message="its task's process")
    worker = _worker_of(up, task)
    # SIGKILL the whole worker (the Celery worker, its pool, the task): as a lost machine would
    for proc in [*_process_by_output(up, worker).children(recursive=True), _process_by_output(up, worker)]:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert _wait_run(api, "prod_blocking", run_id, timeout=1200) == "success"
    result = _xcom(api, "prod_blocking", run_id)
    assert result["instance_id"] == instances[0]["id"] and result["exit_code"] == 0, result
    assert _ec2_launches_per_run(up)[result["run_id"]] == 1  # one launch: the retry adopted it
    assert api.task("prod_blocking", run_id, "train")["try_number"] >= 2
    assert up.running_instances() == []

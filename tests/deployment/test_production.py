"""The provider in a production-shaped Airflow: ``cloudtrain up --production`` (PostgreSQL, Redis,
CeleryExecutor with two warm workers, two triggerers), driven through the REST API, Celery's remote
control and signals as an operator of such a deployment would, and stopped as Ctrl-C stops it at the
end (exit status 0, nothing left running).

One case on one deployment (its start is most of the cost), every fault below at once, as on a bad
day; in ``make test`` (dealt to a worker first: the longest case): 40 deferred runs of
mixed operators (CloudTrainOperator and CheckpointResumeOperator on both clouds, a deferrable sensor)
spread over both triggerers, while a blocking CheckpointResumeOperator run and a blocking
SpotFleetOperator sweep run on the worker that is then lost. One triggerer and that Celery worker
(its whole process tree) are SIGKILLed together, and the other triggerer is frozen (SIGSTOP) until
Airflow has handed both triggerers' triggers to the killed one's restart, then thawed, so that for a
while two triggerers run the same triggers: every deferred run ends well and no instance is launched
twice; the blocking run's retry runs on the other worker and adopts the same
instance; the sweep's retry runs on the other worker and re-attaches to the same group, every item
done once; nothing is left on either cloud. The example DAGs are served beside the test's own (two
DAG bundles), and the product's main job (``ec2_train``, ``gce_train``) runs there too. PostgreSQL and
Redis come from the machine's packages: ``cloudtrain up --production`` installs them with apt-get when
they are missing (CI runs as root).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from celery_workers import DEFAULT, kill_tree, output, process_by_output, ran_in, route
from dag_helpers import fleet_nothing_left
from deployment_helpers import Api, Deployment, Up
from waiting import wait_for

from airflow_cloudtrain.cli_up import EXAMPLE_DAGS, free_port, home_secrets
from airflow_cloudtrain.cli_up_production import PROD_ENV_FILE, TRIGGERERS, WORKERS, production_settings
from airflow_cloudtrain.contract.runs import TAG_RUN

T = TypeVar("T")
DAGS = Path(__file__).resolve().parent / "production_dags"
EXAMPLES = ("ec2_train", "gce_train")  # the product's main job, from example_dags/, on each cloud
DAG_IDS = ("prod_train", "prod_resume", "prod_sensor", "prod_blocking", "prod_fleet", *EXAMPLES)
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
# two DAG bundles: the example DAGs as `cloudtrain up --production` serves them, and the test's own
BUNDLES = [
    {"name": "examples", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(EXAMPLE_DAGS)}},
    {"name": "production-test", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(DAGS)}},
]
SETTINGS = {
    "AIRFLOW__CORE__PARALLELISM": "32",
    # each triggerer takes at most 12 triggers: of 16 (or 40) runs, both must hold some whatever their
    # timing; with 40, the rest wait in the table for a free slot
    "AIRFLOW__TRIGGERER__CAPACITY": "12",
    # a task whose worker was killed is failed (and retried) after 60 s without a heartbeat, not 300 s
    # (a live task's supervisor heartbeats every few seconds: a loaded machine is far from missing 60)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
}
# (dag, cloud) -> how many deferred runs
MIX = {
    ("prod_train", "ec2"): 12,
    ("prod_train", "gcloud"): 10,
    ("prod_resume", "ec2spot"): 8,
    ("prod_resume", "gcspot"): 6,
    ("prod_sensor", "ec2"): 4,
}
PINNED = "pinned"  # the blocking DAGs' queue (production_dags/prod_dags.py): the killed worker's alone
LOST, OTHER = WORKERS  # the worker lost mid-run, and the one every retry must go to
FLEET_ITEMS = 3  # prod_fleet's items: the first runs to its end, the others hold until released


@pytest.fixture(scope="module")
def prod() -> Iterator[Deployment]:
    # PostgreSQL runs as the postgres user (it refuses root): its data folder must be reachable by it,
    # which pytest's 0700 tmp folders are not
    base = Path(tempfile.mkdtemp(prefix="cloudtrain-prod-"))
    base.chmod(0o711)
    up = Up(base / "airflow_home", free_port())
    up.extra_args = [
        "--production",
        "--set",
        f"AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST={json.dumps(BUNDLES)}",
    ]
    up.extra_args += [a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")]
    try:
        up.start()
        password = home_secrets(up.home)["password"]
        api = wait_for(
            lambda: _patient(lambda: Api(up, password)), timeout=300, interval=2, message="a token"
        )
        for dag_id in DAG_IDS:
            wait_for(
                lambda d=dag_id: _patient(lambda: api.has_dag(d)),
                timeout=300,
                interval=1.0,
                message=f"{dag_id} parsed",
            )
            _unpause(api, dag_id)  # new DAGs start paused
        yield Deployment(up, api)
        # after the module's cases (not inside one: they share this deployment), Ctrl-C's stop
        assert up.stop() == 0, up.stderr()[-3000:]
        assert "Stopped." in up.stdout()
    finally:
        up.kill_everything()
        if not os.environ.get("CLOUDTRAIN_TEST_KEEP_DEPLOYMENT"):  # set: its home stays, logs to read
            shutil.rmtree(base, ignore_errors=True)
    assert up.left_running() == [], "processes of the deployment left running"


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


# a triggerer job that stopped heartbeating (TEST_SETTINGS: every 3 s; replaced after 15 s)
SILENT = "j.latest_heartbeat < now() - interval '20 seconds'"


def _triggers_on_silent_triggerers(up: Up) -> int:
    """Triggers still assigned to a silent triggerer."""
    sql = f"SELECT count(*) FROM trigger t JOIN job j ON t.triggerer_id = j.id WHERE {SILENT}"
    return int(_query(up, sql)[0][0])


def _silent_triggerers(up: Up) -> int:
    """Triggerer jobs that have stopped heartbeating (killed, or frozen) but were never ended."""
    sql = f"SELECT count(*) FROM job j WHERE j.job_type = 'TriggererJob' AND j.state = 'running' AND {SILENT}"
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


def _xcom(api: Api, dag_id: str, run_id: str, task_id: str = "train") -> Any:
    return wait_for(lambda: _patient(lambda: api.xcom(dag_id, run_id, task_id)), timeout=300, interval=2)


def _unpause(api: Api, dag_id: str) -> None:
    wait_for(
        lambda: _patient(lambda: api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})) is not None,
        timeout=300,
        interval=2,
        message=f"{dag_id} unpaused",
    )


def _mixed_runs(api: Api) -> list[tuple[str, str, str]]:
    # long enough that the kill lands while most runs are deferred
    command = "echo start-$((1+1)); sleep 45; echo end-$((2+2))"
    runs = []
    for (dag_id, cloud), count in MIX.items():
        for k in range(count):
            runs.append(
                (
                    dag_id,
                    cloud,
                    _trigger(api, dag_id, f"mix-{cloud}-{k}", {"cloud": cloud, "command": command}),
                )
            )
    return runs


def _log_lines(api: Api, dag_id: str, run_id: str, task_id: str = "train", try_number: int = 1) -> list[str]:
    """A try's task log, or nothing while it has none (not started, or no answer in time)."""
    try:
        return api.log_lines(dag_id, run_id, task_id, try_number)
    except (AssertionError, OSError):  # 404 until the task instance (or that try) exists
        return []


def _found(pattern: str, lines: list[str]) -> str | None:
    """The first group of ``pattern``'s first match in ``lines``."""
    matches = (re.search(pattern, line) for line in lines)
    return next((m.group(1) for m in matches if m), None)


def _mid_sweep(api: Api, run_id: str, sqs: Any, queue_url: str) -> bool:
    """At least one item succeeded (the sweep's log says so) while the others are in flight (received
    by a worker: hidden in the emulated SQS queue)."""
    lines = _log_lines(api, "prod_fleet", run_id, "sweep")
    done = sum(1 for line in lines if re.search(r"Item \S+ succeeded", line))
    attribute = "ApproximateNumberOfMessagesNotVisible"
    in_flight = int(
        sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[attribute])["Attributes"][attribute]
    )
    return done >= 1 and in_flight == FLEET_ITEMS - done


def _group_arn(asg: Any, group: str) -> str | None:
    found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    return str(found[0]["AutoScalingGroupARN"]) if found else None


def _try_id(api: Api, dag_id: str, run_id: str, task_id: str) -> str:
    return str(api.task(dag_id, run_id, task_id)["id"])


# One start of the deployment, the runs on two shared cores; each wait has its own deadline. About
# 200-280 CPU-seconds of make test's ~1,300 (docs/testing.md).
@pytest.mark.timeout(3600)
def test_a_bad_day_in_production(prod: Deployment, tmp_path: Path) -> None:
    from airflow_cloudtrain.clouds.aws.fleet import queue_name

    up, api = prod.up, prod.api
    assert (
        set(production_settings(up.home.resolve())) and (up.home / PROD_ENV_FILE).stat().st_mode & 0o077 == 0
    )
    for name in (*TRIGGERERS, *WORKERS):
        process_by_output(up, name)  # all four run
    for name in WORKERS:  # warm workers: the provider and the SDKs imported before the pool forks
        wait_for(lambda n=name: "cloudtrain warm-up:" in output(up, n), timeout=300, message=f"{name} warm")
    # the worker to be lost takes the two blocking tasks and nothing else
    route(up, LOST, {PINNED: True, DEFAULT: False})

    # the two blocking runs hold on their instances until the test creates the release file
    release = tmp_path / "release"
    held = f"echo first-$((1+1)); until [ -e {release} ]; do sleep 1; done; echo done-$((2+2))"
    blocking = _trigger(api, "prod_blocking", "blocking-1", {"cloud": "ec2spot", "command": held})
    fleet = _trigger(api, "prod_fleet", "fleet-1", {"release": str(release)})
    wait_for(
        lambda: any("first-2" in line for line in _log_lines(api, "prod_blocking", blocking)),
        timeout=600,
        interval=2,
        message="the blocking job's first line in its task log",
    )
    group = wait_for(
        lambda: _found(r"Created group (ct-\S+):", _log_lines(api, "prod_fleet", fleet, "sweep")),
        timeout=600,
        interval=2,
        message="the fleet's group in the sweep's log",
    )
    asg, sqs = up.aws("autoscaling"), up.aws("sqs")
    queue_url = sqs.get_queue_url(QueueName=queue_name(group.removeprefix("ct-")))["QueueUrl"]
    wait_for(
        lambda: _mid_sweep(api, fleet, sqs, queue_url),
        timeout=600,
        interval=2,
        message="one item done and the others in flight",
    )
    arn = _group_arn(asg, group)
    assert arn is not None
    pinned = [("prod_blocking", blocking, "train"), ("prod_fleet", fleet, "sweep")]  # (dag, run, task)
    first_tries = {dag: _try_id(api, dag, run, task) for dag, run, task in pinned}
    assert {dag: ran_in(up, ti) for dag, ti in first_tries.items()} == dict.fromkeys(first_tries, [LOST])

    runs = _mixed_runs(api)
    examples = [(dag_id, _trigger(api, dag_id, f"example-{dag_id}", {})) for dag_id in EXAMPLES]
    # both triggerers hold triggers (each takes at most 12): then one is lost, and the worker with it
    before = wait_for(
        lambda: _both_hold(up), timeout=900, interval=2, message="both triggerers to hold triggers"
    )
    noticed = r"airflow triggerer-1 exited with signal SIGKILL.*restarting it"
    frozen = process_by_output(up, TRIGGERERS[1])
    process_by_output(up, TRIGGERERS[0]).send_signal(signal.SIGKILL)
    # the other triggerer stalls (a long pause, a frozen VM) past the health check, and comes back
    # after its triggers were handed over: for a while both it and their new owner run them
    frozen.send_signal(signal.SIGSTOP)
    try:
        kill_tree(process_by_output(up, LOST))
        route(up, OTHER, {PINNED: True})  # the restarted LOST consumes only the default queue
        wait_for(
            lambda: re.search(noticed, up.stderr()),
            timeout=180,
            interval=1.0,
            message="cloudtrain up to notice the killed triggerer",
        )
        # Airflow hands the dead and the frozen triggerer's triggers to a live one (triggerer-1 restarted)
        wait_for(
            lambda: _silent_triggerers(up) >= 2,
            timeout=300,
            interval=2,
            message="the killed and the frozen triggerer to be silent past the check's 20 s",
        )
        wait_for(
            lambda: _triggers_on_silent_triggerers(up) == 0,
            timeout=600,
            interval=2,
            message=f"the lost triggerers' triggers to move (before: {before})",
        )
    finally:
        frozen.send_signal(signal.SIGCONT)
    # the retries (after the heartbeat timeout) take over: the same instance, the same group
    adopted = wait_for(
        lambda: _found(
            r"Adopting instance (\S+) launched by an earlier try",
            _log_lines(api, "prod_blocking", blocking, "train", 2),
        ),
        timeout=900,
        interval=2,
        message="the blocking run's retry to adopt its instance",
    )
    reattached = wait_for(
        lambda: _found(r"Re-attached to group (ct-\S+)", _log_lines(api, "prod_fleet", fleet, "sweep", 2)),
        timeout=900,
        interval=2,
        message="the sweep's retry to re-attach",
    )
    assert (reattached, _group_arn(asg, group)) == (group, arn)  # the same group, not a new one
    release.touch()  # the held job and items go on, under the retries' watch

    ends = {run_id: _wait_run(api, dag_id, run_id, timeout=1500) for dag_id, _, run_id in runs}
    ends[blocking] = _wait_run(api, "prod_blocking", blocking, timeout=900)
    ends[fleet] = _wait_run(api, "prod_fleet", fleet, timeout=900)
    ends.update({run_id: _wait_run(api, dag_id, run_id, timeout=900) for dag_id, run_id in examples})
    assert [r for r, state in ends.items() if state != "success"] == []
    results: dict[str, Any] = {run_id: _xcom(api, dag_id, run_id) for dag_id, _, run_id in runs}
    assert all(r["exit_code"] == 0 for r in results.values()), results
    # no instance launched twice: one EC2 instance per run (the emulated EC2 keeps terminated ones)
    launches = _ec2_launches_per_run(up)
    ec2_runs = [results[run_id]["run_id"] for _, cloud, run_id in runs if cloud.startswith("ec2")]
    assert {run: launches[run] for run in ec2_runs} == dict.fromkeys(ec2_runs, 1), launches

    # the example DAGs: the main job trained on each cloud, its evaluation read the model
    assert [_xcom(api, dag_id, run_id)["exit_code"] for dag_id, run_id in examples] == [0, 0]
    # the blocking run: its retry adopted the instance try 1 launched, and ran on the other worker
    result = _xcom(api, "prod_blocking", blocking)
    assert (result["instance_id"], result["exit_code"], launches[result["run_id"]]) == (adopted, 0, 1), result
    # the sweep: the retry re-attached, every item ran once, one group ever
    sweep = _xcom(api, "prod_fleet", fleet, "sweep")
    assert sweep["group"] == group, sweep
    assert (sweep["items_succeeded"], sweep["items_failed"], sweep["items_duplicated"]) == (
        FLEET_ITEMS,
        [],
        [],
    )
    assert [item["duplicate_runs"] for item in sweep["items"]] == [0] * FLEET_ITEMS, sweep["items"]
    logs = [_log_lines(api, "prod_fleet", fleet, "sweep", n) for n in (1, 2)]
    assert [sum("Created group" in line for line in lines) for lines in logs] == [1, 0]
    for dag, run, task in pinned:
        retry = api.task(dag, run, task)
        assert retry["try_number"] == 2, retry
        assert (ran_in(up, first_tries[dag]), ran_in(up, str(retry["id"]))) == ([LOST], [OTHER])

    # nothing left on either cloud, and Airflow's side of it: no trigger row left
    fleet_nothing_left(group.removeprefix("ct-"), up.aws)
    assert up.running_instances() == []
    assert _triggers_by_triggerer(up) == {}

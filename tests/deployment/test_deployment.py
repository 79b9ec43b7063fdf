"""The example DAGs in a real Airflow deployment (``cloudtrain up``, what ``make airflow`` runs):
started as a user starts it, the example DAGs parsed, the ``cloudtrain`` CLI next to it, a triggerer
SIGKILLed mid-run and restarted by ``cloudtrain up`` itself, a deferred task marked failed from
outside, ``cloudtrain up`` stopped and started again with a run deferred (the run finishes), and
nothing left at the end.

Two tests, each in steps on one deployment (starting the processes is most of the cost): the first,
in ``make test``, is ``make airflow``'s own path (start, the example DAGs parsed, the CLI through the
home's ``emulator.env``, Ctrl-C's stop leaving nothing). A DAG run through the REST API, the params
form and the real scheduler, triggerer and LocalExecutor is the browser test's (``test_ui_page``:
the same processes, ``cli_up.local_airflow``, with the test's own emulated clouds), and on
``cloudtrain up --production`` the production test's: running one here too repeated them. The second, the faults of a deployment (a killed triggerer, a
task failed from outside, a stop and a start with a run deferred), is marked ``faults`` and runs in
``make faults`` (docs/testing.md)."""

from __future__ import annotations

import re
import signal

import pytest
from deployment_helpers import Deployment, Up
from waiting import wait_for

DAG = "ui_train"


def _instance_state(up: Up, instance_id: str) -> str:
    reservations = up.ec2().describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def _count(lines: list[str], text: str) -> int:
    return sum(text in line for line in lines)


def _deferred_on_one_instance(deployment: Deployment, run_id: str, first_line: str) -> str:
    """Wait until the run's task is deferred and its trigger runs in the triggerer (the job's
    ``first_line`` is in the task log); the instance's id. A task marked failed before any triggerer
    picked its trigger up gets no ``on_kill`` from Airflow: not the case under test."""
    api = deployment.api
    wait_for(
        lambda: api.task(DAG, run_id, "train")["state"] == "deferred",
        timeout=300.0,
        interval=1.0,
        message=f"{run_id}'s train task to defer",
    )
    wait_for(
        lambda: _count(api.log_lines(DAG, run_id, "train"), first_line),
        timeout=180,
        interval=2,
        message=f"{first_line!r} in the task log (the trigger runs)",
    )
    instances = deployment.up.running_instances()
    assert len(instances) == 1, instances
    return str(instances[0]["id"])


def _a_killed_triggerer_is_restarted_and_the_run_ends_on_the_same_instance(deployment: Deployment) -> None:
    api, up = deployment.api, deployment.up
    # long enough to outlast the restart and the 15 s after which a silent triggerer's work moves
    conf = {"command": "echo before-$((1+1)); sleep 45; echo after-$((2+2))"}
    run_id = api.trigger(DAG, conf)
    instance_id = _deferred_on_one_instance(deployment, run_id, "before-2")
    triggerer = up.airflow_process("triggerer")
    triggerer.kill()  # SIGKILL, as a lost machine or the OOM killer would; nobody restarts it but up
    said = wait_for(
        lambda: re.search(r"airflow triggerer exited with signal SIGKILL.*restarting it", up.stderr()),
        timeout=120,
        interval=1.0,
        message="cloudtrain up to say it restarts the triggerer",
    )
    assert said
    wait_for(
        lambda: "airflow triggerer restarted" in up.stderr(),
        timeout=120,
        interval=1.0,
        message="the triggerer restarted",
    )
    assert up.airflow_process("triggerer").pid != triggerer.pid
    assert api.wait_run(DAG, run_id) == "success", "\n".join(api.log_lines(DAG, run_id, "train")[-60:])
    result = api.xcom(DAG, run_id, "train")
    assert result["instance_id"] == instance_id and result["exit_code"] == 0
    assert _instance_state(up, instance_id) == "terminated"
    lines = api.log_lines(DAG, run_id, "train")
    # a triggerer killed outright may repeat the lines shown since its last cursor save, never later ones
    assert _count(lines, "before-2") >= 1 and _count(lines, "after-4") == 1, lines
    assert up.running_instances() == []
    assert up.proc is not None and up.proc.poll() is None  # the deployment lives on


def _marking_a_deferred_task_failed_terminates_its_instance(deployment: Deployment) -> None:
    api = deployment.api
    run_id = api.trigger(DAG, {"command": "echo started-$((3+3)); sleep 600"})
    instance_id = _deferred_on_one_instance(deployment, run_id, "started-6")
    api.call(
        "PATCH",
        f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/train",
        {"new_state": "failed", "note": "marked failed by the deployment test"},
    )
    wait_for(
        lambda: _instance_state(deployment.up, instance_id) == "terminated",
        timeout=120,
        interval=1.0,
        message=f"{instance_id} to be terminated",
    )
    assert api.wait_run(DAG, run_id) == "failed"

    def said_so() -> list[str] | None:
        lines = api.log_lines(DAG, run_id, "train")
        return lines if _count(lines, f"terminating instance {instance_id}") else None

    # said once, before the release (a line after it may be overtaken by the trigger's end)
    lines = wait_for(
        said_so, timeout=120, interval=1.0, message="the task log to say the instance is terminated"
    )
    assert _count(lines, f"terminating instance {instance_id}") == 1, lines
    assert sum("Released" in line and instance_id in line for line in lines) <= 1, lines
    assert deployment.up.running_instances() == []


def _a_run_deferred_when_up_stops_finishes_after_the_next_start(deployment: Deployment) -> None:
    """Ctrl-C's stop with a task deferred: the emulated clouds keep their state in the Airflow home,
    so after the next start the instance is still there, its agent runs the job again, and the
    task picks the run up and ends it on the same instance."""
    api, up = deployment.api, deployment.up
    go = up.home.parent / "go"  # the job ends once this file exists: only after the restart
    command = f"echo first-$((4+4)); while [ ! -e {go} ]; do sleep 1; done; echo last-$((5+5))"
    run_id = api.trigger(DAG, {"command": command})
    instance_id = _deferred_on_one_instance(deployment, run_id, "first-8")
    assert up.stop(signal.SIGINT) == 0, up.stderr()[-3000:]
    assert up.left_running() == [], "processes of the deployment left running after the stop"
    assert "Traceback" not in up.stderr(), up.stderr()[-3000:]
    up.start()
    assert "Restored the emulated clouds" in up.stdout()
    # the instance outlived the stop (same id), and its agent runs the job again
    assert instance_id in [i["id"] for i in up.running_instances()]
    go.touch()
    assert api.wait_run(DAG, run_id) == "success", "\n".join(api.log_lines(DAG, run_id, "train")[-60:])
    result = api.xcom(DAG, run_id, "train")
    assert result["instance_id"] == instance_id and result["exit_code"] == 0
    assert _instance_state(up, instance_id) == "terminated"
    lines = api.log_lines(DAG, run_id, "train")
    # the stopped triggerer said what became of the task, and the run's end is in the log
    assert _count(lines, "Triggerer stopping: the run continues on the cloud") >= 1, lines
    assert _count(lines, "last-10") >= 1, lines
    assert up.running_instances() == []


def _stopping_leaves_nothing(up: Up) -> None:
    assert up.stop() == 0, up.stderr()[-3000:]
    assert up.left_running() == []
    assert "Stopped." in up.stdout()
    # the JWT key is long enough for HS512: Airflow does not warn about it
    assert "HMAC key" not in (up.home / "logs" / "api-server.out").read_text(errors="replace")


@pytest.mark.timeout(900)  # one start of the deployment included; each wait below has its own deadline
def test_make_airflow_starts_serves_the_example_dags_and_stops_clean(deployment: Deployment) -> None:
    up = deployment.up
    # the CLI's environment is in the Airflow home, and the start says how to use it
    assert f"source {up.home.resolve() / 'emulator.env'}" in up.stdout()
    for args in (("jobs", "list"), ("emulator", "status")):  # with it, the CLI reaches the emulated clouds
        done = up.cli(*args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    _stopping_leaves_nothing(up)


@pytest.mark.faults
@pytest.mark.timeout(1800)  # two starts of the deployment included; each wait below has its own deadline
def test_a_real_deployment_survives_its_faults(deployment: Deployment) -> None:
    _a_killed_triggerer_is_restarted_and_the_run_ends_on_the_same_instance(deployment)
    _marking_a_deferred_task_failed_terminates_its_instance(deployment)
    _a_run_deferred_when_up_stops_finishes_after_the_next_start(deployment)
    _stopping_leaves_nothing(deployment.up)

"""MLEngineTrainOperator on the emulated Vertex AI, inside real Airflow (``dag.test()``): the replicas
a scale tier means run with consistent TF_CONFIG, each log line reaches the task log once, resuming a
resumed job still writes into the first job's folder, a killed task cancels its job, a failed job fails
the task with Vertex's message, and a preempted Spot replica resumes from its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dag_helpers import task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.storage import open_run_folder
from airflow_cloudtrain.ui.runs import load_running

CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
BUCKET = "gs://cloudtrain-emulated/mlengine-tests"
# "[workerpool0-0 09:31:07.412] text", then the task log's own "[logger] loc=..." suffix, if any
LINE = re.compile(r"\[(workerpool\d-\d+|service) \d\d:\d\d:\d\d\.\d{3}\] (.*?)(?:\s+\[[\w.]+\] loc=\S+)?$")


def job_dag(dag_id: str, tasks: dict[str, str], deferrable: bool = False, chain: bool = True) -> Any:
    """One MLEngineTrainOperator per entry of ``tasks`` (task id -> extra keyword arguments)."""
    ops = "\n".join(
        f"""    {task_id} = MLEngineTrainOperator(task_id={task_id!r}, region="us-central1", bucket={BUCKET!r},
        code={CODE!r}, python_module="trainer.task", deferrable={deferrable}, poll_interval=0.5,
        log_polling_interval=0.5, {extra})"""
        for task_id, extra in tasks.items()
    )
    order = " >> ".join(tasks) if chain and len(tasks) > 1 else ""
    source = (
        textwrap.dedent(
            f"""
            from datetime import datetime, timedelta
            from airflow.sdk import DAG
            from airflow_cloudtrain.operators import MLEngineTrainOperator

            with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            """
        )
        + ops
        + (f"\n    {order}\n" if order else "\n")
    )
    return write_dag(source, dag_id)


def job_lines(out: str) -> list[tuple[str, str]]:
    """(replica, text) of every job line the task log showed."""
    return [(m.group(1), m.group(2)) for m in map(LINE.search, out.splitlines()) if m]


def active_jobs(emu: Any) -> list[dict[str, Any]]:
    ended = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}
    return [j for j in emu.vertex.jobs() if j["state"] not in ended]


def test_a_custom_cluster_runs_its_replicas_with_one_tf_config(emu, airflow_db, capfd) -> None:
    dag = job_dag(
        "vertex_custom",
        {
            "train": "scale_tier='CUSTOM', master_type='standard', worker_type='standard', worker_count=2, "
            "parameter_server_type='standard', parameter_server_count=1, job_id='custom_cluster_1', "
            "training_args=['--steps', '6', '--step-s', '0.05']"
        },
    )
    emu.reset_counts()
    run = dag.test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["state"] == "JOB_STATE_SUCCEEDED" and result["job_id"] == "custom_cluster_1"
    assert result["job_dir"] == f"{BUCKET}/custom_cluster_1"
    assert [(r["role"], r["count"], r["machine_type"]) for r in result["replicas"]] == [
        ("chief", 1, "n1-standard-4"),
        ("worker", 2, "n1-standard-4"),
        ("parameter_server", 1, "n1-standard-4"),
    ]
    assert (
        result["cost_usd"] > 0 and result["cost_is_estimate"] and "estimate" in result["cost_basis"].lower()
    )
    from test_spot_fleet import indexed_cost  # what cloudtrain costs says the DAG cost

    assert indexed_cost(BUCKET, "vertex_custom") == result["cost_usd"]
    assert result["console_url"].startswith(
        "https://console.cloud.google.com/vertex-ai/locations/us-central1/"
    )
    assert result["job_name"].rsplit("/", 1)[-1] in result["console_url"] and result["resumed_from"] is None
    lines = job_lines(capfd.readouterr().out)
    roles = {r: t for r, t in lines if t.startswith("role ")}
    assert set(roles) == {"workerpool0-0", "workerpool1-0", "workerpool1-1", "workerpool2-0"}, lines
    assert roles["workerpool0-0"].startswith("role chief 0") and roles["workerpool2-0"].startswith(
        "role ps 0"
    )
    assert {roles["workerpool1-0"][:13], roles["workerpool1-1"][:13]} == {"role worker 0", "role worker 1"}
    clusters = {t.split(" in cluster ", 1)[1] for t in roles.values()}
    assert clusters == {"{'chief': 1, 'worker': 2, 'ps': 1}"}  # one cluster, as every replica sees it
    steps = Counter(t.split(" loss")[0] for r, t in lines if t.startswith("step "))
    assert steps == {f"step {n}": 1 for n in range(1, 7)}, steps  # every line once
    model = json.loads(open_run_folder(result["job_dir"]).get_text("model/model.json"))
    assert model["step"] == 6 and model["job_dir"] == result["job_dir"]  # --job-dir reached the trainer
    assert emu.request_counts().get("customJobs.create") == 1
    assert not active_jobs(emu)


def test_deferred_resume_of_a_resume_writes_into_the_first_job_s_folder(emu, airflow_db, capfd) -> None:
    args = "scale_tier='BASIC', training_args=['--steps', '6', '--step-s', '0.05', '--checkpoint-every', '3']"
    dag = job_dag(
        "vertex_resume_twice",
        {
            "first": f"{args}, job_id='first_job_1'",
            "again": f"{args}, job_id='again_job_1', resume_from='first_job_1'",
            "third": f"{args}, resume_from='again_job_1'",
        },
        deferrable=True,
    )
    run = dag.test()
    assert task_states(run) == {"first": "success", "again": "success", "third": "success"}
    first, again, third = (xcom(run, t) for t in ("first", "again", "third"))
    folder = f"{BUCKET}/first_job_1"
    assert first["job_dir"] == again["job_dir"] == third["job_dir"] == folder
    assert again["resumed_from"] == "first_job_1" and third["resumed_from"] == "first_job_1"
    assert third["job_id"].startswith("third_")  # the default id: <task id>_<UTC timestamp>
    lines = [t for _, t in job_lines(capfd.readouterr().out)]
    assert "resumed from step 6 (gs://cloudtrain-emulated/mlengine-tests/first_job_1/checkpoints/)" in lines
    assert any(t.startswith("resumed from step 12") for t in lines), lines
    steps = Counter(t.split(" loss")[0] for t in lines if t.startswith("step "))
    assert sorted(steps, key=lambda s: int(s.split()[1])) == [f"step {n}" for n in range(1, 19)]
    assert set(steps.values()) == {1}, steps  # each line once, from the trigger's cursor
    model = json.loads(open_run_folder(folder).get_text("model/model.json"))
    assert model["step"] == 18
    assert open_run_folder(f"{BUCKET}/again_job_1").list("") == []  # nothing outside the first folder
    assert not active_jobs(emu)
    # the Cloud training page's timeline of the resume: the job it went on from, then its own, each
    # with what Vertex told of it and the checkpoints it wrote (not the later resume's)
    from airflow_cloudtrain.lifecycle.cost_index import read_records
    from airflow_cloudtrain.ui.run_timeline import timeline_of
    from airflow_cloudtrain.ui.runs import run_detail

    svg = timeline_of(run_detail(read_records(open_run_folder(BUCKET), time.time() - 3600), "again_job_1"))
    assert re.findall(r'<text x="4" y="\d+">(#[^<]+)</text>', svg) == ["#1 first_job_1", "#2 again_job_1"]
    marks = re.findall(r'ct-mark ct-(\w+)" data-index="(\d)"><(?:rect|circle)[^>]*><title>\w+: ([^<]+)<', svg)
    states = [(i, label) for kind, i, label in marks if kind == "state"]
    assert states == [(i, s) for i in "01" for s in ("created", "running", "succeeded")], svg
    checkpoints = [(i, label) for kind, i, label in marks if kind == "checkpoint"]
    assert checkpoints == [("0", "step 3"), ("0", "step 6"), ("1", "step 9"), ("1", "step 12")], svg


def test_a_failing_job_fails_the_task_with_vertex_s_message(emu, airflow_db, capfd) -> None:
    dag = job_dag("vertex_failing", {"train": "scale_tier='BASIC', training_args=['--steps', 'many']"})
    run = dag.test()
    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "JOB_STATE_FAILED" in out and "workerpool0-0 exited with a non-zero status of 2" in out
    assert "argument --steps: invalid int value" in out  # the trainer's own error, from its log
    assert not active_jobs(emu)


def test_a_killed_task_cancels_its_job(emu, airflow_db) -> None:
    """SIGTERM to the task process is how Airflow kills a running task: on_kill cancels the job."""
    dag = job_dag(
        "vertex_killed",
        {
            "train": "scale_tier='BASIC', job_id='killed_job_1', training_args=['--steps', '600', '--step-s', '0.1']"
        },
    )
    before = signal.getsignal(signal.SIGTERM)

    def kill_when_running() -> None:
        wait_for(
            lambda: any(
                j["state"] == "JOB_STATE_RUNNING" and j["displayName"] == "killed_job_1"
                for j in emu.vertex.jobs()
            )
        )
        wait_for(lambda: open_run_folder(f"{BUCKET}/killed_job_1").list("checkpoints/"))
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=kill_when_running, daemon=True)
    try:
        watcher.start()
        run = dag.test()
        watcher.join(30)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not watcher.is_alive()
    assert task_states(run) == {"train": "failed"}
    (job,) = [j for j in emu.vertex.jobs() if j["displayName"] == "killed_job_1"]
    wait_for(lambda: emu.vertex.job(job["name"])["state"] == "JOB_STATE_CANCELLED", timeout=60)
    assert not any(emu.vertex.replica_processes(job["name"]).values())  # every replica process is gone
    assert not any(r["key"] == "killed_job_1" for r in load_running([BUCKET]))  # off the page too


def test_a_preempted_spot_replica_restarts_from_its_checkpoint(emu, airflow_db, capfd) -> None:
    dag = job_dag(
        "vertex_spot",
        {
            "train": "scale_tier='BASIC', spot=True, job_id='spot_job_1', "
            "training_args=['--steps', '80', '--step-s', '0.1', '--checkpoint-every', '4']"
        },
        deferrable=True,
    )

    running: list[dict[str, Any]] = []  # the Cloud training page's row of the job while it runs

    def preempt_after_a_checkpoint() -> None:
        wait_for(lambda: open_run_folder(f"{BUCKET}/spot_job_1").get_text("checkpoints/ckpt-000008.json"))
        running.extend(r for r in load_running([BUCKET]) if r["key"] == "spot_job_1")
        (job,) = [j for j in emu.vertex.jobs() if j["displayName"] == "spot_job_1"]
        emu.preempt_replica(job["name"], "workerpool0-0")

    watcher = threading.Thread(target=preempt_after_a_checkpoint, daemon=True)
    watcher.start()
    run = dag.test()
    watcher.join(30)
    assert not watcher.is_alive()
    assert task_states(run) == {"train": "success"}
    lines = [t for _, t in job_lines(capfd.readouterr().out)]
    resumed = [t for t in lines if t.startswith("resumed from step")]
    assert len(resumed) == 1 and int(resumed[0].split()[3]) >= 8, lines  # not from scratch
    result = xcom(run, "train")
    assert result["spot"] is True
    assert not active_jobs(emu)
    # on the page while it ran (written at submit, the trigger kept it): its replica, its list price
    (row,) = running
    assert (row["operator"], row["cloud"], row["instance_id"]) == (
        "MLEngineTrainOperator",
        "vertex",
        "spot_job_1",
    )
    assert row["nodes"] == sum(r["count"] for r in result["replicas"]) and row["spot"]
    assert row["hourly_usd"] > 0 and row["cost_so_far_usd"] > 0
    assert not any(r["key"] == "spot_job_1" for r in load_running([BUCKET]))  # out once priced


def test_cloudtrain_jobs_list_and_logs_without_airflow(emu, airflow_db, capsys) -> None:
    from airflow_cloudtrain.cli import main

    run = job_dag(
        "vertex_cli", {"train": "scale_tier='BASIC', job_id='cli_job_1', training_args=['--steps', '3']"}
    ).test()
    assert task_states(run) == {"train": "success"}
    capsys.readouterr()
    assert main(["jobs", "list"]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"cli_job_1\s+SUCCEEDED", listing), listing
    assert main(["jobs", "list", "--running"]) == 0
    assert "cli_job_1" not in capsys.readouterr().out
    assert main(["jobs", "logs", "cli_job_1", "--follow", "--polling-interval", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "step 3 loss" in out and "ended JOB_STATE_SUCCEEDED" in out

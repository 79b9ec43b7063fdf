"""A worker (or the triggerer with it) killed at each step of submitting and waiting for a Vertex AI
job (SIGKILL: no cleanup code of ours runs), then the task run again: the retry re-attaches to the job
the dead try submitted instead of submitting a second one, the task succeeds, the job's log lines are
not shown twice after a deferred wait, and no job of the run is left running.

Try 1 runs ``dag.test()`` in a subprocess that kills itself at the step under test; try 2 runs the same
DAG run in this process.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from dag_helpers import start_first_try, task_states, write_dag, xcom

CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
BUCKET = "gs://cloudtrain-emulated/mlengine-killed"
STEPS = ["before_create", "after_create", "waiting", "deferred"]

DAG_SOURCE = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

import airflow_cloudtrain.clouds.gcp.vertex as vertex
import airflow_cloudtrain.lifecycle.vertex.job as vertex_job
import airflow_cloudtrain.triggers.vertex_job as vertex_trigger
from airflow_cloudtrain.operators import MLEngineTrainOperator

DIE_AT = os.environ.get("CLOUDTRAIN_TEST_DIE_AT")  # set only in the process that plays the dying worker


def die(step):
    if DIE_AT == step:
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no on_kill: a worker lost with its machine


_create, _wait, _show = vertex.VertexJobs.create, vertex_job.VertexJobRun.wait, vertex_trigger.VertexJobTrigger._show


def create(self, body):
    die("before_create")
    job = _create(self, body)
    die("after_create")  # the job exists; the ledger never heard its name
    return job


def wait(self, job, *args, **kwargs):
    die("waiting")
    return _wait(self, job, *args, **kwargs)


def show(self, tail):
    _show(self, tail)
    if any(p.endswith("checkpoints/ckpt-000004.json") for p in tail.folder.list("checkpoints/")):
        die("deferred")  # lines already shown, the cursor saved: the retry must go on from it


vertex.VertexJobs.create = create
vertex_job.VertexJobRun.wait = wait
vertex_trigger.VertexJobTrigger._show = show

with DAG(DAG_ID, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    MLEngineTrainOperator(
        task_id="train", region="us-central1", bucket=BUCKET, code=CODE, python_module="trainer.task",
        scale_tier="BASIC", job_id=JOB_ID, deferrable=DEFERRABLE, poll_interval=0.5,
        log_polling_interval=0.5, training_args=["--steps", "24", "--step-s", "0.2", "--checkpoint-every", "2"],
    )
"""


@pytest.mark.parametrize("step", STEPS)
def test_a_killed_try_is_re_attached_not_duplicated(emu, airflow_db, capfd, step: str) -> None:
    dag_id = f"vertex_killed_{step}"
    job_id = f"killed_{step}_1"
    header = f"DAG_ID = {dag_id!r}\nJOB_ID = {job_id!r}\nBUCKET = {BUCKET!r}\nCODE = {CODE!r}\n"
    header += f"DEFERRABLE = {step == 'deferred'}\n"
    dag = write_dag(header + DAG_SOURCE, dag_id)
    when = datetime(2026, 3, 1, tzinfo=timezone.utc) + timedelta(hours=STEPS.index(step))
    emu.reset_counts()
    first = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE_AT": step})
    _, err = first.communicate(timeout=240)
    assert first.returncode == -9, err[-3000:]  # it died where the test said
    created_by_first = emu.request_counts().get("customJobs.create", 0)
    assert created_by_first == (0 if step == "before_create" else 1)
    capfd.readouterr()
    run = dag.test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}
    out = capfd.readouterr().out
    assert emu.request_counts().get("customJobs.create") == 1  # one job in all
    ours = [j for j in emu.vertex.jobs() if j["displayName"] == job_id]
    assert len(ours) == 1 and ours[0]["state"] == "JOB_STATE_SUCCEEDED"
    result = xcom(run, "train")
    assert result["job_name"] == ours[0]["name"] and result["job_dir"] == f"{BUCKET}/{job_id}"
    if step != "before_create":  # running: re-attached; ended meanwhile: its result delivered
        assert "Re-attaching to Vertex AI job" in out or "already succeeded in an earlier try" in out
    lines = Counter(
        line.split("] ", 1)[1].split(" [airflow", 1)[0]
        for line in out.splitlines()
        if "[workerpool0-0 " in line
    )
    assert all(n == 1 for n in lines.values()), lines
    if step == "deferred":  # try 1 showed the first steps and saved its cursor: try 2 goes on after it
        assert "step 1 loss" not in "".join(lines) and "step 24" in "".join(lines)

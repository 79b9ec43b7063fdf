"""A Vertex AI wait follows its Google connection: a second ``with Emulator()`` session in the same
process (as the README invites users to test their DAGs) is waited on at its own endpoint, and a
connection edited while the triggerer runs is seen without a restart (issue 22)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from dag_helpers import task_states, write_dag
from relay import relay

from airflow_cloudtrain.clouds.gcp.vertex import JobRecord
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.hooks import follow
from airflow_cloudtrain.hooks.vertex import VertexHook
from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
from airflow_cloudtrain.operators.mlengine_config import parse_job_config
from airflow_cloudtrain.triggers.vertex_job import VertexJobTrigger

CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
BUCKET = "gs://cloudtrain-emulated/vertex-connection"
ENDED = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}


def submit(task_id: str, steps: int, conn_id: str = "google_cloud_default") -> JobRecord:
    config = parse_job_config(
        {
            "region": "us-central1",
            "bucket": BUCKET,
            "code": CODE,
            "python_module": "trainer.task",
            "scale_tier": "BASIC",
            "training_args": ["--steps", str(steps), "--step-s", "0.1"],
        }
    )
    key = RunKey("connection_tests", task_id, "r1", -1, BUCKET)
    return VertexJobRun(config, key, VertexHook(gcp_conn_id=conn_id)).start()


async def first_event(t: VertexJobTrigger) -> dict[str, Any]:
    async for event in t.run():
        return event.payload
    raise AssertionError("no event")


def wait_job(t: VertexJobTrigger, timeout: float = 180.0) -> dict[str, Any]:
    """The trigger's event, as the triggerer (or ``dag.test()``) gets it: each in its own loop."""
    return asyncio.run(asyncio.wait_for(first_event(t), timeout))


def test_a_second_emulator_session_is_waited_on_at_its_own_endpoint() -> None:
    """Session 1's endpoint is gone when session 2 waits: a client kept from session 1 would retry it
    for ten minutes, then fail a job that succeeded."""
    from airflow_cloudtrain.emulator import Emulator

    for session in (1, 2):
        with Emulator() as emu:
            job = submit(f"session_{session}", steps=10)
            started = time.monotonic()
            event = wait_job(VertexJobTrigger(job.name, poll_interval=0.5, log_polling_interval=0.5), 120)
            assert event["status"] == "done", (session, event)
            assert event["job"]["state"] == "JOB_STATE_SUCCEEDED"
            assert emu.request_counts().get("customJobs.list", 0) >= 1  # this session's endpoint
            assert time.monotonic() - started < 120
            assert all(j["state"] in ENDED for j in emu.vertex.jobs())


def test_a_deferrable_operator_in_a_second_emulator_session_succeeds(airflow_db) -> None:
    """The README's ``with Emulator() as emu: dag.test()``, twice in one process."""
    from airflow_cloudtrain.emulator import Emulator

    source = f"""
from datetime import datetime
from airflow.sdk import DAG
from airflow_cloudtrain.operators import MLEngineTrainOperator

with DAG("vertex_two_sessions", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    MLEngineTrainOperator(task_id="train", region="us-central1", bucket={BUCKET!r}, code={CODE!r},
        python_module="trainer.task", scale_tier="BASIC", training_args=["--steps", "5", "--step-s", "0.1"],
        deferrable=True, poll_interval=0.5, log_polling_interval=0.5)
"""
    dag = write_dag(source, "vertex_two_sessions")
    for session in (1, 2):
        with Emulator() as emu:
            started = time.monotonic()
            run = dag.test()
            assert task_states(run) == {"train": "success"}, session
            assert time.monotonic() - started < 180
            assert emu.request_counts().get("customJobs.list", 0) >= 1
            assert all(j["state"] in ENDED for j in emu.vertex.jobs())


def test_a_connection_edited_while_its_poll_group_lives_is_seen(emu, monkeypatch) -> None:
    """One job keeps the group (and its client) alive; the connection is edited to reach Vertex
    through a relay; the group's polls go there within the recheck period, and a trigger that joins
    after the edit is served through it too."""
    monkeypatch.setattr(follow, "RECHECK_S", 1.0)
    conn = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_VERTEX_EDITED", json.dumps(conn))
    long = submit("long", steps=150, conn_id="vertex_edited")
    with relay(emu.vertex_endpoint) as r:

        async def main() -> list[dict[str, Any]]:
            waiting = asyncio.ensure_future(
                first_event(VertexJobTrigger(long.name, conn_id="vertex_edited", poll_interval=0.5))
            )
            deadline = time.monotonic() + 120
            while emu.request_counts().get("customJobs.list", 0) < 2:
                assert time.monotonic() < deadline and not waiting.done()
                await asyncio.sleep(0.1)
            conn["extra"]["vertex_endpoint"] = r.url  # the edit, as the triggerer's process sees it
            os.environ["AIRFLOW_CONN_VERTEX_EDITED"] = json.dumps(conn)
            while r.count(r"customJobs\?") < 1:
                assert time.monotonic() < deadline, "the edited connection was never used"
                assert not waiting.done(), "the job ended before any poll used the edited connection"
                await asyncio.sleep(0.1)
            short = await asyncio.to_thread(submit, "short", 5, "vertex_edited")
            joined = VertexJobTrigger(short.name, conn_id="vertex_edited", poll_interval=0.5)
            return await asyncio.wait_for(asyncio.gather(waiting, first_event(joined)), 180)

        events = asyncio.run(main())
        through = r.count(r"customJobs")
    assert [e["status"] for e in events] == ["done", "done"], events
    assert {e["job"]["state"] for e in events} == {"JOB_STATE_SUCCEEDED"}
    assert through >= 3  # the lists after the edit, and the joined job's end

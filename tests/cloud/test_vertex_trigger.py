"""VertexJobTrigger in one event loop, as the triggerer runs it: deferred jobs of one project and region
share one ``customJobs.list`` per poll, each trigger yields its own job's end, a cancelled trigger stops
at once, and ``on_kill`` cancels the job."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from relay import relay

from airflow_cloudtrain.clouds.gcp.vertex import JobRecord
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.hooks.vertex import VertexHook
from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
from airflow_cloudtrain.operators.mlengine_config import parse_job_config
from airflow_cloudtrain.triggers.vertex_job import VertexJobTrigger

CODE = str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code")
BUCKET = "gs://cloudtrain-emulated/vertex-trigger"


def submit(task_id: str, steps: int) -> JobRecord:
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
    return VertexJobRun(config, RunKey("trigger_tests", task_id, "r1", -1, BUCKET), VertexHook()).start()


def trigger(job: JobRecord) -> VertexJobTrigger:
    return VertexJobTrigger(job.name, poll_interval=0.5, log_polling_interval=0.5, job_dir=job.output_dir)


async def first_event(t: VertexJobTrigger) -> dict[str, Any]:
    async for event in t.run():
        return event.payload
    raise AssertionError("no event")


def test_deferred_jobs_share_one_list_per_poll(emu) -> None:
    jobs = [submit(f"share_{n}", steps=30 + 2 * n) for n in range(3)]  # running together
    emu.reset_counts()

    async def main() -> list[dict[str, Any]]:
        return await asyncio.wait_for(asyncio.gather(*(first_event(trigger(j)) for j in jobs)), 180)

    started = time.monotonic()
    events = asyncio.run(main())
    elapsed = time.monotonic() - started
    assert [e["status"] for e in events] == ["done"] * 3
    assert [e["job"]["name"] for e in events] == [j.name for j in jobs]  # each its own job
    assert {e["job"]["state"] for e in events} == {"JOB_STATE_SUCCEEDED"}
    counts = emu.request_counts()
    # One poll loop for the three triggers: it lists, then sleeps the interval, so it can list at most
    # once per interval however fast or slow the machine is; three unshared loops would list three
    # times as often.
    assert counts["customJobs.list"] <= elapsed / 0.5 + 1, (counts, elapsed)
    # a job that ended is read once, however long its trigger takes to drain its log and leave
    assert counts.get("customJobs.get", 0) == 3, counts


def test_a_cancelled_trigger_stops_and_on_kill_cancels_the_job(emu) -> None:
    job = submit("killed", steps=600)
    t = trigger(job)

    async def main() -> None:
        task = asyncio.ensure_future(first_event(t))
        deadline = time.monotonic() + 120
        while emu.vertex.job(job.name)["state"] != "JOB_STATE_RUNNING":
            assert time.monotonic() < deadline, "the job never ran"
            await asyncio.sleep(0.2)
        task.cancel()  # the triggerer cancels the trigger of a killed task...
        with pytest.raises(asyncio.CancelledError):
            await task
        await t.on_kill()  # ...and then calls on_kill, which cancels the cloud work

    asyncio.run(main())
    deadline = time.monotonic() + 60
    while emu.vertex.job(job.name)["state"] != "JOB_STATE_CANCELLED":
        assert time.monotonic() < deadline, emu.vertex.job(job.name)["state"]
        time.sleep(0.2)
    assert not any(emu.vertex.replica_processes(job.name).values())


@pytest.mark.parametrize("fault", ["throttled", "unavailable"])
def test_throttled_polls_and_an_unreadable_log_do_not_end_the_wait(emu, capfd, fault: str) -> None:
    """A 429 (or a 503) on the shared list is waited out; a log that cannot be read never fails the
    job."""
    job = submit(f"{fault}-polls", steps=20)
    refuse = emu.throttle if fault == "throttled" else emu.unavailable
    refuse(0.4, api="customJobs.list")
    refuse(1.0, api="entries.list", seed=None)
    try:
        event = asyncio.run(asyncio.wait_for(first_event(trigger(job)), 240))
    finally:
        emu.clear_faults()
    assert event["status"] == "done" and event["job"]["state"] == "JOB_STATE_SUCCEEDED"
    counts = emu.request_counts()
    assert counts.get(f"{fault}:customJobs.list", 0) >= 1 and counts.get(f"{fault}:entries.list", 0) >= 1
    assert "Reading the job's log failed" in "".join(capfd.readouterr())


@pytest.mark.parametrize("fault", ["throttled", "unavailable"])
def test_a_refused_submit_is_retried_and_makes_one_job(emu, fault: str) -> None:
    """Throttling (429) or a server error (503) on ``customJobs.create`` is ridden out, as on every other
    call (it failed the task: campaign scenario s006), and never makes a second job: after a failed
    create the next attempt looks for the job by run key first."""
    refuse = emu.throttle if fault == "throttled" else emu.unavailable
    refuse(0.5, api="customJobs.create", seed=1)  # seed 1 draws 0.13, then 0.85: the first create only
    emu.reset_counts()
    key = RunKey("trigger_tests", f"{fault}-submit", "r1", -1, BUCKET)
    config = parse_job_config(
        {"region": "us-central1", "bucket": BUCKET, "code": CODE, "python_module": "trainer.task",
         "scale_tier": "BASIC", "training_args": ["--steps", "2", "--step-s", "0.1"]}
    )  # fmt: skip
    run = VertexJobRun(config, key, VertexHook())
    try:
        job = run.start()
    finally:
        emu.clear_faults()
        run.cancel()
    counts = emu.request_counts()
    assert counts.get(f"{fault}:customJobs.create") == 1 and counts["customJobs.create"] == 2, counts
    assert [j.name for j in run.jobs.find(key.digest)] == [job.name]


def conn_through(monkeypatch: pytest.MonkeyPatch, conn_id: str, vertex_endpoint: str) -> None:
    """Connection ``conn_id``: the emulator's Google connection with its Vertex AI endpoint replaced."""
    conn = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    conn["extra"]["vertex_endpoint"] = vertex_endpoint
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_triggers_joining_during_a_slow_list_never_take_a_live_job_for_a_deleted_one(
    emu, monkeypatch
) -> None:
    """Issue 22: two jobs deferring 142 ms apart; the second joined the poll group while the list for
    the first was under way, was handed that list's answer (without its job) and failed its SUCCEEDED
    job as "no longer exists". Here the list takes 0.4 s and triggers join at random moments."""
    jobs = [submit(f"join_{n}", steps=30) for n in range(4)]
    rng = random.Random(22)
    with relay(emu.vertex_endpoint, r"customJobs\?", 0.4) as r:
        conn_through(monkeypatch, "vertex_slow_list", r.url)

        async def joins(job: JobRecord, delay: float) -> dict[str, Any]:
            await asyncio.sleep(delay)
            t = VertexJobTrigger(
                job.name, conn_id="vertex_slow_list", poll_interval=0.5, log_polling_interval=5
            )
            return await first_event(t)

        async def main() -> list[dict[str, Any]]:
            waits = [joins(j, rng.uniform(0.0, 2.0)) for j in jobs]
            return await asyncio.wait_for(asyncio.gather(*waits), 240)

        events = asyncio.run(main())
        assert r.count(r"customJobs\?") >= 2  # the triggers really went through the slow list
    assert [e.get("message") for e in events if e["status"] != "done"] == []
    assert [e["job"]["state"] for e in events] == ["JOB_STATE_SUCCEEDED"] * len(jobs)


def test_a_job_missing_from_the_poll_is_asked_for_directly_before_the_wait_fails(emu, monkeypatch) -> None:
    """A deleted job is confirmed by a get of its own; one that exists is waited on as usual."""
    job = submit("confirm", steps=5)
    gone = job.name.rsplit("/", 1)[0] + "/987654321"  # never created
    with relay(emu.vertex_endpoint) as r:
        conn_through(monkeypatch, "vertex_counted", r.url)

        async def main() -> list[dict[str, Any]]:
            both = asyncio.gather(
                first_event(trigger(job)), first_event(VertexJobTrigger(gone, conn_id="vertex_counted"))
            )
            return await asyncio.wait_for(both, 180)

        events = asyncio.run(main())
        gets = r.count(r"^GET /v1/projects/.*/customJobs/987654321")
    assert events[0]["status"] == "done" and events[0]["job"]["state"] == "JOB_STATE_SUCCEEDED"
    assert events[1] == {"status": "error", "message": f"Vertex AI job {gone} no longer exists"}
    assert gets == 2  # the poll's get, then the trigger's own

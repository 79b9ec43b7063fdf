"""Triggers serialize plain JSON and rebuild identically; the wait decisions are pure and total."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from airflow_cloudtrain.contract.runs import RunStatus
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.records import LaunchRecord
from airflow_cloudtrain.core.waiting import outcome
from airflow_cloudtrain.triggers.instances import InstanceStateTrigger, evaluate_states
from airflow_cloudtrain.triggers.run import RunTrigger

TRIGGERS = [
    InstanceStateTrigger(
        cloud="ec2",
        instance_ids=["i-1", "i-2"],
        target_state="running",
        conn_id="aws_default",
        region="us-east-1",
        poll_interval=3.0,
    ),
    InstanceStateTrigger(
        cloud="gcspot",
        instance_ids=["vm-1"],
        target_state="terminated",
        conn_id="gcp",
        region="us-central1",
        project_id="proj",
    ),
    RunTrigger(
        launch=LaunchRecord(
            run_id="ct-1",
            run_uri="s3://b/runs/d/t/r/-1",
            cloud="ec2spot",
            region="us-east-1",
            instance_id="i-1",
            hourly_usd=0.1,
            failover=[["t3.small", "us-east-1", "X"]],
        ).to_dict(),
        conn_id="aws_default",
        poll_interval=2.0,
        next_log_seq=7,
        deadline=1.5e9,
        startup_timeout=60.0,
        heartbeat_timeout=30.0,
    ),
]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=lambda t: type(t).__name__)
def test_serialize_round_trip(trigger) -> None:
    classpath, kwargs = trigger.serialize()
    json.dumps(kwargs)  # plain JSON only
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def inst(state: str, reason: str = "", preempted: bool = False) -> Instance:
    return Instance("i-1", state, "t3.small", "us-east-1a", True, state_reason=reason, preempted=preempted)


def test_evaluate_states() -> None:
    assert evaluate_states({"i-1": inst("pending")}, ["i-1"], "running") is None
    assert evaluate_states({"i-1": inst("running")}, ["i-1"], "running")["status"] == "success"
    failed = evaluate_states({"i-1": inst("terminated")}, ["i-1"], "running")
    assert failed["status"] == "error" and "can never reach 'running': i-1 is terminated" in failed["message"]
    assert evaluate_states({"i-1": inst("stopped")}, ["i-1"], "running") is None  # can be started again
    assert evaluate_states({"i-1": inst("running")}, ["i-1", "i-2"], "running") is None  # i-2 not seen yet


def test_an_instance_that_does_not_exist_is_its_own_answer() -> None:
    """Waiting for "terminated" on a typo must not succeed, nor say "is terminated" for "running"."""
    gone = Instance("i-typo", "terminated", "", None, False, state_reason="not found", missing=True)
    for target in ("terminated", "running"):
        event = evaluate_states({"i-typo": gone}, ["i-typo"], target)
        assert event["status"] == "error" and "not found: i-typo" in event["message"], target
        assert "is terminated" not in event["message"]
    ok = evaluate_states({"i-typo": gone}, ["i-typo"], "terminated", missing_as_terminated=True)
    assert ok["status"] == "success"


def test_outcome_final_status_wins() -> None:
    ok = RunStatus(state="succeeded", instance_id="i-1", exit_code=0)
    assert outcome(ok, inst("terminated"), False).status == "success"
    failed = outcome(RunStatus(state="failed", instance_id="i-1", exit_code=3), inst("running"), False)
    assert (failed.status, failed.exit_code, failed.interrupted) == ("error", 3, False)
    spot = outcome(
        RunStatus(state="interrupted", instance_id="i-1", interruption={"kind": "spot"}), None, False
    )
    assert spot.interrupted and spot.interruptions == 1


def test_outcome_instance_gone_without_status() -> None:
    running = RunStatus(state="running", instance_id="i-1")
    assert outcome(running, inst("running"), True) is None
    assert outcome(running, inst("terminated"), False) is None  # one more read for the agent's last write
    lost = outcome(running, inst("terminated", "Client.UserInitiatedShutdown"), True)
    assert lost.state == "lost" and not lost.interrupted
    spot = outcome(running, inst("terminated", "Server.SpotInstanceTermination", preempted=True), True)
    assert spot.interrupted and "spot interruption" in spot.message


def test_run_watch_gives_the_agent_a_grace_then_gives_up_at_the_deadline() -> None:
    from airflow_cloudtrain.core.waiting import ENDED_GRACE_S, RunWatch

    now = [100.0]
    watch = RunWatch(deadline=None, clock=lambda: now[0])
    running = RunStatus(state="running", instance_id="i-1")
    assert watch.decide(running, inst("terminated", "Client.UserInitiatedShutdown")) is None
    now[0] += ENDED_GRACE_S + 0.1
    assert watch.decide(running, inst("terminated", "Client.UserInitiatedShutdown")).state == "lost"
    assert RunWatch(deadline=0.0).decide(running, inst("running")).state == "timed_out"
    assert RunWatch(deadline=None).decide(running, inst("running")) is None


def test_run_watch_notices_a_silent_agent() -> None:
    from airflow_cloudtrain.core.waiting import RunWatch

    now = [1000.0]
    watch = RunWatch(None, launched_at=900.0, startup_timeout=60, heartbeat_timeout=30, wall=lambda: now[0])
    never = watch.decide(None, inst("running"))
    assert never.state == "lost" and "never reported" in never.message
    running = RunStatus(state="running", instance_id="i-1", started_at=950.0)
    assert watch.decide(running, inst("running"), heartbeat_at=990.0) is None
    now[0] = 1019.0
    assert watch.decide(running, inst("running")) is None  # the beat read at 990 is still known
    now[0] = 1021.0
    dead = watch.decide(running, inst("running"), heartbeat_at=990.0)  # the agent wrote none since
    assert dead.state == "lost" and "stopped beating" in dead.message and "31s ago" in dead.message
    done = RunStatus(state="succeeded", instance_id="i-1", exit_code=0)
    assert watch.decide(done, inst("running"), heartbeat_at=1.0).status == "success"  # final wins


def test_a_wait_reads_the_heartbeat_only_when_it_could_change_the_decision() -> None:
    """Every poll used to read the agent's heartbeat (one or two GETs); it matters only for a running
    status, with a heartbeat_timeout, once what the wait knows is older than half the timeout."""
    from airflow_cloudtrain.core.waiting import GangWatch, RunWatch

    now = [1000.0]
    running = RunStatus(state="running", instance_id="i-1", started_at=990.0)
    watch = RunWatch(None, heartbeat_timeout=30, wall=lambda: now[0])
    assert not watch.needs_heartbeat(None)  # not started: startup_timeout judges, not beats
    assert not watch.needs_heartbeat(running)  # started 10 s ago
    assert not RunWatch(None, wall=lambda: now[0]).needs_heartbeat(running)  # no heartbeat_timeout
    now[0] = 1006.0
    assert watch.needs_heartbeat(running)  # 16 s since anything was known: past half the timeout
    assert watch.decide(running, inst("running"), heartbeat_at=1005.0) is None
    assert not watch.needs_heartbeat(running)  # a beat 1 s old
    now[0] = 1021.0
    assert watch.needs_heartbeat(running)
    done = RunStatus(state="succeeded", instance_id="i-1", exit_code=0)
    assert not watch.needs_heartbeat(done)
    gang = GangWatch(["i-1", "i-2"], None, heartbeat_timeout=30, wall=lambda: now[0])
    assert [gang.needs_heartbeat(r, running) for r in (0, 1)] == [True, True]
    assert gang.decide([done, running], [inst("running"), inst("running")], [None, 1020.0]) is None
    assert [gang.needs_heartbeat(r, running) for r in (0, 1)] == [False, False]  # 0 finished, 1 fresh


def test_run_keys_of_two_deployments_never_match() -> None:
    """Same DAG, same scheduled run id, different buckets: adoption must never cross between them."""
    from airflow_cloudtrain.contract.runs import RunKey

    prod = RunKey("train", "fit", "scheduled__2026-11-22T00:00:00+00:00", -1, "s3://prod-bucket/runs")
    staging = RunKey("train", "fit", "scheduled__2026-11-22T00:00:00+00:00", -1, "s3://staging-bucket/runs")
    assert (
        prod.digest != staging.digest
        and prod.tags()["cloudtrain-run-key"] != staging.tags()["cloudtrain-run-key"]
    )


def test_end_markers_have_their_own_folder_and_old_ones_are_still_read() -> None:
    from airflow_cloudtrain.contract import runs

    assert runs.end_name("i-1") == "ended/i-1.json"
    assert runs.live_entry(runs.end_name("i-1")) == ("i-1", runs.END)
    assert runs.live_entry("i-1.end.json") == ("i-1", runs.END)  # an earlier agent's marker
    assert runs.live_entry("i-1.json") == ("i-1", runs.BEACON)
    assert runs.live_entry("i-1.beat") == ("i-1", runs.BEAT)
    assert runs.live_entry("other/i-1.json") is None


def test_a_quiet_watcher_is_woken_only_when_one_of_its_values_changed() -> None:
    """A thousand RunTriggers share a poll every 2 s; each is woken only when its own run's view
    is a new object (or its quiet period passed): the rest of the loop's time stays free."""
    import asyncio
    from contextlib import aclosing

    from airflow_cloudtrain.triggers import shared_poll

    polls = 0
    same = object()

    async def describe(ids: list[str]) -> dict[str, object]:
        nonlocal polls
        polls += 1
        return {"still": same, "moving": object()}

    async def main() -> tuple[int, int]:
        seen = {"still": 0, "moving": 0}

        async def follow(name: str) -> None:
            stream = shared_poll.watch(("quiet-test",), [name], describe, 0.01, quiet=3600.0)
            async with aclosing(stream):
                async for _ in stream:
                    seen[name] += 1

        tasks = [asyncio.ensure_future(follow(n)) for n in seen]
        while seen["moving"] < 5:
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen["still"], seen["moving"]

    still, moving = asyncio.run(main())
    assert polls >= 5 and moving >= 5
    assert still == 1  # its first snapshot only: its value never changed, its quiet period is long


# --- the triggerer's startup heap (triggers.heap) -------------------------------------------------
_FREEZE_PROBE = """
import asyncio, gc, json
from airflow_cloudtrain.triggers import heap
from airflow_cloudtrain.triggers.run import RunTrigger

before = gc.get_freeze_count()
try:  # a launch record it cannot read: the wait fails at once, after its first step
    asyncio.run(anext(RunTrigger(launch={}, conn_id=None).run()))
except Exception:
    pass
after_run = gc.get_freeze_count()
again = heap.freeze_long_lived()
print(json.dumps([before, after_run, again, gc.get_freeze_count() == after_run]))
"""


@pytest.mark.parametrize("setting", [None, "False"])
def test_the_first_run_wait_freezes_the_startup_heap_once_unless_configured_off(setting) -> None:
    """Full collections of what the triggerer imported stalled its loop 0.2-0.3 s at 1,000 runs."""
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__CLOUDTRAIN__FREEZE_TRIGGERER_HEAP"}
    if setting is not None:
        env["AIRFLOW__CLOUDTRAIN__FREEZE_TRIGGERER_HEAP"] = setting
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    before, after_run, again, unchanged = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == 0 and again is False and unchanged
    if setting is None:
        assert after_run > 50_000  # Airflow, this package and the SDKs' modules
    else:
        assert after_run == 0

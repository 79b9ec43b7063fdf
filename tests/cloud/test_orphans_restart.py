"""A triggerer restarted within ``orphan_timeout`` keeps every deferred run alive: no false orphan
(issue 26), at 100 runs (``make faults``) and at 10 (``make test``).

The runs' agents are the real agent parts that matter here, in threads of the test (as in
``test_run_trigger_scale``): the status and beacon writers, and each run's ``LeaseWatch`` (what the
agent on the instance reads every ``check_interval_s`` to decide the run is orphaned). The triggerer
is real ``RunTrigger``s on an event loop: stopped (every trigger cancelled, as a triggerer's shutdown
does), then re-created from their serialized kwargs on a new loop (a new triggerer process), after a
pause. No watch may ever find its lease lapsed, well past the moment an un-renewed lease would have:
then the jobs finish and every trigger reports success.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import boto3
import pytest
from test_run_trigger_scale import Agent, first_event, plain_instances
from waiting import wait_for

from airflow_cloudtrain.agent.lease import LeaseWatch
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, check_interval_s
from airflow_cloudtrain.storage import open_run_folder
from airflow_cloudtrain.triggers.run import RunTrigger

BUCKET = "s3://cloudtrain-emulated/orphans-restart"
# long enough that a loaded test machine's slowness (100 triggers starting, 100 PUTs) is not what is
# measured; the pause is what a triggerer restart takes, well inside the timeout
TIMEOUT_S = 30.0
PAUSE_S = 5.0


class Watches:
    """Every run's agent-side lease check, in one thread, each at its own interval: what lapsed."""

    def __init__(self, agents: list[Agent]) -> None:
        now = time.time()  # the leases exist already (written before the deferral)
        self.watches = [LeaseWatch(open_run_folder(a.run_uri), TIMEOUT_S, now) for a in agents]
        self.lapsed: list[tuple[str, str]] = []
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for watch in self.watches:
                message = watch.check()
                if message:
                    self.lapsed.append((watch.folder.uri, message))
            self.rounds += 1
            self._stop.wait(check_interval_s(TIMEOUT_S))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)


def _lease(agent: Agent) -> Lease | None:
    raw = open_run_folder(agent.run_uri).get_text(LEASE_KEY)
    return Lease.from_json(raw) if raw else None


def _trigger(agent: Agent) -> RunTrigger:
    kwargs = agent.launch(poll_interval=0.5).serialize()[1]
    return RunTrigger(**{**kwargs, "orphan_timeout": TIMEOUT_S})


def _renewed_by_triggerer_since(agents: list[Agent], since: float) -> bool:
    leases = [_lease(a) for a in agents]
    return all(x is not None and x.by == "triggerer" and x.renewed_at >= since for x in leases)


def restart_keeps_every_run_alive(n: int) -> None:
    ids = plain_instances(n)
    agents = [Agent(i, BUCKET) for i in ids]
    try:
        for agent in agents:  # what the task writes before it defers
            lease = Lease(renewed_at=time.time(), orphan_timeout_s=TIMEOUT_S, by="worker")
            open_run_folder(agent.run_uri).put_text(LEASE_KEY, lease.to_json())
        watches = Watches(agents)
        try:
            started = time.time()

            async def first_triggerer() -> None:
                tasks = [asyncio.ensure_future(first_event(_trigger(a))) for a in agents]
                await asyncio.to_thread(
                    wait_for,
                    lambda: _renewed_by_triggerer_since(agents, started),
                    timeout=900,  # 100 triggers' first rounds on a loaded machine
                    interval=1.0,  # each look reads every run's lease
                    message="every lease renewed by the first triggerer",
                )
                # the agents watch from here: a first pick-up slower than the timeout (a loaded test
                # machine starting 100 triggers) is not what this test is about
                watches.start()
                for task in tasks:  # the triggerer stops: its triggers are cancelled
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run(first_triggerer())
            last_renewal = min(x.renewed_at for x in map(_lease, agents) if x is not None)
            time.sleep(PAUSE_S)  # the restart itself: the fault under test lasts this long

            async def second_triggerer() -> list[dict[str, Any]]:  # a new event loop: a new process
                restarted = time.time()
                # what the test is about: a restart within the timeout (a slower one lets runs lapse)
                assert restarted - last_renewal < TIMEOUT_S, (restarted - last_renewal, TIMEOUT_S)
                tasks = [asyncio.ensure_future(first_event(_trigger(a))) for a in agents]
                await asyncio.to_thread(
                    wait_for,
                    lambda: _renewed_by_triggerer_since(agents, restarted),
                    timeout=900,
                    interval=1.0,
                    message="every lease renewed by the restarted triggerer",
                )
                # on until well past the moment the oldest lease of the first triggerer would have
                # lapsed, had nobody renewed it: every watch has checked since
                lapse = last_renewal + TIMEOUT_S + 2 * check_interval_s(TIMEOUT_S)
                rounds = watches.rounds
                await asyncio.to_thread(
                    wait_for,
                    lambda: time.time() > lapse and watches.rounds >= rounds + 2,
                    timeout=TIMEOUT_S + 900,
                    message="the first triggerer's leases past their lapse",
                )
                await asyncio.to_thread(lambda: [a.finish() for a in agents])
                return await asyncio.wait_for(asyncio.gather(*tasks), 300)

            events = asyncio.run(second_triggerer())
        finally:
            watches.stop()
        assert watches.lapsed == [], f"false orphans: {watches.lapsed[:5]}"
        assert [e["outcome"]["status"] for e in events] == ["success"] * n
        assert not [a for a in agents if open_run_folder(a.run_uri).get_text(ORPHANED_KEY) is not None]
    finally:
        boto3.client("ec2").terminate_instances(InstanceIds=ids)


def test_a_triggerer_restart_keeps_10_deferred_runs_alive(emu) -> None:
    restart_keeps_every_run_alive(10)


@pytest.mark.faults
@pytest.mark.timeout(3000)  # 100 runs' writers and triggers on a loaded machine; each wait has a deadline
def test_a_triggerer_restart_keeps_100_deferred_runs_alive(emu) -> None:
    restart_keeps_every_run_alive(100)

"""A deadline-policy run leaves on-demand for spot mid-run once spot capacity is back (issue 29).

``CheckpointResumeOperator(policy="deadline", probe_interval=2)`` on the emulated EC2, deferred, inside
real Airflow. The first (spot) attempt is preempted without notice and spot capacity goes with it
(the emulator's spot-only capacity fault): the relaunch finds none, and with a deadline too close to
wait the policy falls back to on-demand. While the on-demand attempt runs, its deferred wait stops
every probe interval to ask the policy; the probes launch nothing while it would stay, and find no
capacity while the fault holds (nothing is paid). Once capacity is back and the spell has lasted long
enough for the policy, a spot instance is launched beside the on-demand one; once it has booted the
on-demand job is stopped, uploads its last checkpoint, and only then does the spot agent (waiting for
the handover) restore it. The ledger shows the switch (``left_for_spot``), the spot attempt resumes
from exactly the on-demand attempt's last checkpoint, and nothing is left running.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dag_helpers import load_example, start_first_try, task_states, write_dag, xcom
from test_checkpoint_resume import JOBS, check_ledger, job_steps, resume_dag
from waiting import wait_for

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import open_run_folder

TYPE = "t3.medium"


class CapacityGoesAndComes:
    """Preempts the first spot instance (no notice) once it uploaded a checkpoint and takes spot
    capacity away with it; gives it back once an on-demand instance has uploaded one and a probe's
    spot launch found no capacity; touches ``flag``
    (the job's ``STEPS_FINISH_AFTER``) once a later instance resumed its job, so no job can finish
    before the switch it is waiting for (on a slow machine too)."""

    def __init__(self, emu: Any, flag: Path) -> None:
        self.emu, self.flag = emu, flag
        self.preempted: str | None = None
        self.on_demand: str | None = None
        self.back = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _logged(self, spot: bool, text: str, skip: set[str]) -> str | None:
        for inst in self.emu.running_instances():
            if inst["spot"] == spot and inst["id"] not in skip and text in self.emu.agent_log(inst["id"]):
                return str(inst["id"])
        return None

    def _run(self) -> None:
        launches = 0
        deadline = time.monotonic() + 480  # bounds a hang only (then the jobs are let finish)
        while time.monotonic() < deadline:
            if self.preempted is None:
                found = self._logged(True, "uploaded to", set())
                if found:
                    self.emu.fail_capacity(TYPE, spot_only=True)
                    self.emu.interrupt(found, notice_s=0)
                    self.preempted = found
            elif self.on_demand is None:
                self.on_demand = self._logged(False, "uploaded to", set())
                launches = self.emu.request_counts().get("RunInstances", 0)
            elif not self.back:  # a probe's launch found no capacity: now it comes back
                if self.emu.request_counts().get("RunInstances", 0) > launches:
                    self.emu.clear_faults()
                    self.back = True
            elif self._logged(True, "resumed from step", {self.preempted}):
                break
            time.sleep(0.1)
        self.flag.touch()

    def join(self) -> None:
        self.thread.join(10)


def test_an_on_demand_attempt_is_left_for_spot_once_spot_capacity_returns(
    emu, airflow_db, tmp_path: Path
) -> None:
    flag = tmp_path / "switched"
    events = CapacityGoesAndComes(emu, flag)
    extra = (
        f"policy='deadline', deadline=timedelta(minutes=30), expected_duration=60, "
        f"instance_type={TYPE!r}, probe_interval=2"
    )
    command = f"STEPS_FINISH_AFTER={flag} python3 steps.py 40 2 0.25"
    run = resume_dag("leave_on_demand", "aws", command, deferrable=True, extra=extra).test()
    events.join()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    rows = result["attempts"]
    assert [(r["ended"], r["spot"]) for r in rows] == [
        ("interrupted_no_notice", True),
        ("capacity_error", True),  # spot gone with the preemption: the policy fell back
        ("left_for_spot", False),  # the on-demand attempt, left mid-run for spot
        ("finished", True),
    ], rows
    preempted, _, on_demand, spot = rows
    assert preempted["instance_id"] == events.preempted and on_demand["instance_id"] == events.on_demand
    assert "left on-demand for spot" in on_demand["message"]
    # the spot instance ran beside the on-demand one: launched before that one was released
    assert spot["launched_at"] < on_demand["ended_at"]
    # the on-demand job was stopped with its checkpoint synced, and spot resumed from exactly that step
    od_log = emu.agent_log(on_demand["instance_id"])
    assert on_demand["checkpoint_step"] is not None
    assert on_demand["checkpoint_step"] >= max(job_steps(od_log)) - 1
    assert spot["restored_step"] == on_demand["checkpoint_step"] > on_demand["restored_step"]
    spot_log = emu.agent_log(spot["instance_id"])
    assert "handover received" in spot_log
    assert f"resumed from step {spot['restored_step']}" in spot_log
    # the ledger in the run folder says the same; its probes name the failed ones and the switch
    folder = open_run_folder(result["run_uri"])
    ledger = json.loads(folder.get_text(f"ledger/{result['run_id']}.json"))
    assert [r["ended"] for r in ledger["attempts"]] == [r["ended"] for r in rows]
    assert ledger["switch"] is None
    failed = [p for p in ledger["probes"] if not p["ok"]]  # launched nothing, cost nothing
    assert failed and all("no spot capacity" in p["message"] for p in failed), ledger["probes"]
    assert ledger["probes"][-1]["ok"] is True
    assert ledger["probes"][-1]["instance_id"] == spot["instance_id"]
    assert result["interruptions"] == 1  # leaving on-demand spends no budget
    check_ledger(result)
    assert not [i for i in emu.running_instances() if i["instance_type"] == TYPE]


DYING_DAG = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
from airflow_cloudtrain.operators import CheckpointResumeOperator


class DyingLoop(RecoveryLoop):
    def finish(self, attempt, launch, outcome):
        if outcome.state == "left_for_spot" and os.environ.get("CLOUDTRAIN_TEST_DIE_AT") == "switch":
            os.kill(os.getpid(), signal.SIGKILL)  # spot launched and booted, on-demand not yet stopped
        return super().finish(attempt, launch, outcome)


class DyingResume(CheckpointResumeOperator):
    def _loop(self, context):
        loop = super()._loop(context)
        loop.__class__ = DyingLoop
        return loop


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DyingResume(task_id="train", cloud="ec2spot", cpus=2, ram="4g", code={jobs!r}, bucket={bucket!r},
                region="us-east-1", poll_interval=0.5, live_prices=False, checkpoint_interval=1,
                policy="deadline", deadline="30m", expected_duration=60, instance_type={itype!r},
                probe_interval=2, command="STEPS_FINISH_AFTER={flag} python3 steps.py 40 2 0.25")
"""


def test_a_worker_killed_mid_switch_leaves_one_instance_and_the_retry_switches_again(
    emu, airflow_db, tmp_path: Path
) -> None:
    """Try 1 (a process of its own) goes as the test above: preempted, on-demand, a failed probe, spot
    launched beside it once capacity is back; and is SIGKILLed before it stops the on-demand attempt:
    two instances run. The retry releases that switch's spot instance (its job never
    started: it waits for the handover), adopts the on-demand one, and switches again."""
    dag_id = "leave_on_demand_killed"
    flag = tmp_path / "switched"
    bucket = "s3://cloudtrain-emulated/leave-killed"
    write_dag(DYING_DAG.format(dag_id=dag_id, jobs=JOBS, bucket=bucket, itype=TYPE, flag=flag), dag_id)
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    events = CapacityGoesAndComes(emu, flag)  # as above: touches flag once the retry's spot resumed
    proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE_AT": "switch"})
    try:
        assert proc.wait(timeout=300) == -9, proc.stderr.read()[-3000:] if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    on_demand = events.on_demand
    running = {i["id"]: i["spot"] for i in emu.running_instances()}
    assert on_demand in running and len(running) == 2, running  # killed mid-switch: both run
    first_spot = next(iid for iid, spot in running.items() if spot)
    # the switch's agent notes its wait soon after it starts, maybe after the try died (met under load)
    wait_for(lambda: "waiting for the handover" in emu.agent_log(first_spot), message="the handover wait")
    assert "resumed from step" not in emu.agent_log(first_spot)

    try:
        run = load_example(dag_id).test(logical_date=when, run_after=when)
    finally:
        flag.touch()
    events.join()
    assert task_states(run) == {"train": "success"}
    rows = xcom(run, "train")["attempts"]
    assert [(r["ended"], r["spot"]) for r in rows] == [
        ("interrupted_no_notice", True),
        ("capacity_error", True),
        ("left_for_spot", False),
        ("finished", True),
    ], rows
    assert rows[2]["instance_id"] == on_demand  # adopted, not launched twice
    assert first_spot not in {r["instance_id"] for r in rows}  # released by the retry, before its job
    # and marked released first: its agent's final status (written as it went) is never adopted as the
    # run's attempt ending, which would release the on-demand instance with it (seen at load 25)
    result = xcom(run, "train")
    delivered = open_run_folder(result["run_uri"]).get_text(runs.delivered_key(first_spot))
    assert delivered is not None and json.loads(delivered)["state"] == "released", delivered
    assert rows[3]["restored_step"] == rows[2]["checkpoint_step"]
    assert first_spot not in {i["id"] for i in emu.running_instances()}

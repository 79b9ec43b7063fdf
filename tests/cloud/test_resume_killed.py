"""The checkpoint-resume loop survives its own worker and triggerer: SIGKILLed, then run again.

Try 1 runs ``dag.test()`` in a subprocess that dies (SIGKILL: no cleanup code of ours runs) between
two attempts, in the middle of finishing one, or while the deferred attempt's trigger runs; the run
is then continued in this process. The loop must go on from its saved history: the interrupted
attempt counted once, the running instance adopted rather than launched twice, the job resumed from
its checkpoint, and nothing left in the cloud.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import load_example, start_first_try, task_states, write_dag, xcom
from waiting import wait_for

JOBS = str(Path(__file__).parent / "jobs")
BUCKET = {"aws": "s3://cloudtrain-emulated/resume-killed", "gcp": "gs://cloudtrain-emulated/resume-killed"}
CLOUD = {"aws": "ec2spot", "gcp": "gcspot"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
LAUNCH_CALL = {"aws": "RunInstances", "gcp": "instances.insert"}

DAG_SOURCE = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
from airflow_cloudtrain.operators import CheckpointResumeOperator

DIE_AT = os.environ.get("CLOUDTRAIN_TEST_DIE_AT")  # set only in the process that plays the dying worker


def die(step):
    if DIE_AT == step:
        os.kill(os.getpid(), signal.SIGKILL)


class DyingLoop(RecoveryLoop):
    def _finish(self, attempt, launch, outcome):
        die("finishing")  # the end is saved as pending; nothing released or accounted yet
        row = super()._finish(attempt, launch, outcome)
        die("between_attempts")  # the row is saved; the next attempt not launched
        return row


class DyingResume(CheckpointResumeOperator):
    def defer(self, **kwargs):
        mark = os.environ.get("CLOUDTRAIN_TEST_MARK")
        if mark:  # tells the test that the attempt's trigger is about to run
            with open(mark, "a") as out:
                out.write(type(kwargs["trigger"]).__name__ + "\\n")
        super().defer(**kwargs)

    def _loop(self, context):
        loop = super()._loop(context)
        loop.__class__ = DyingLoop
        return loop


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DyingResume(task_id="train", cloud="{cloud}", cpus=2, ram="4g", code={jobs!r}, bucket="{bucket}",
                region="{region}", poll_interval=0.5, live_prices=False, checkpoint_interval=1,
                deferrable={deferrable}, command="{hold}python3 steps.py 24 2 0.25")
"""


def first_try(
    dag_id: str, logical_date: datetime, die_at: str | None, mark: Path | None = None
) -> subprocess.Popen[str]:
    env = {"CLOUDTRAIN_TEST_DIE_AT": die_at or "", "CLOUDTRAIN_TEST_MARK": str(mark or "")}
    return start_first_try(dag_id, logical_date, env)


def write_dying_dag(
    dag_id: str, provider: str, deferrable: bool, hold_at: int | None = None, until: Path | None = None
) -> None:
    """``hold_at``: the first instance's job waits at that step until it is stopped or ``until``
    exists (jobs/steps.py)."""
    hold = f"STEPS_HOLD_AT={hold_at} " if hold_at else ""
    hold += f"STEPS_HOLD_UNTIL={until} " if until else ""
    source = DAG_SOURCE.format(
        hold=hold,
        dag_id=dag_id,
        cloud=CLOUD[provider],
        bucket=BUCKET[provider],
        region=REGION[provider],
        jobs=JOBS,
        deferrable=deferrable,
    )
    write_dag(source, dag_id)


def checkpointed(emu: Any, instance_id: str) -> bool:
    """The job is a few steps in and its agent has uploaded a checkpoint (a busy machine may be slow)."""
    return job_step(emu, instance_id) >= 4 and "uploaded to" in emu.agent_log(instance_id)


def job_step(emu: Any, instance_id: str) -> int:
    steps = re.findall(r"step (\d+) at", emu.agent_log(instance_id))
    return int(steps[-1]) if steps else 0


# The loop's kill points are in provider-neutral code (lifecycle/resume/loop.py): each stays in
# ``make test`` on one cloud, the two clouds between them; the other cloud runs in ``make faults``.
@pytest.mark.parametrize(
    ("provider", "die_at"),
    [
        pytest.param("aws", "finishing", id="aws-finishing"),
        pytest.param("aws", "between_attempts", id="aws-between_attempts", marks=pytest.mark.faults),
        pytest.param("gcp", "finishing", id="gcp-finishing", marks=pytest.mark.faults),
        pytest.param("gcp", "between_attempts", id="gcp-between_attempts"),
    ],
)
def test_worker_killed_around_a_relaunch_continues_the_loop(
    emu, airflow_db, provider: str, die_at: str
) -> None:
    dag_id = f"resume_killed_{provider}_{die_at}"
    # the first job holds at step 6 (after its checkpoint) until the interruption below: a job free to
    # finish its 24 steps could end before a slow machine got the interruption in
    write_dying_dag(dag_id, provider, deferrable=False, hold_at=6)
    when = datetime(2026, 2, 1, tzinfo=timezone.utc) + timedelta(
        hours=["finishing", "between_attempts"].index(die_at)
    )
    emu.reset_counts()
    proc = first_try(dag_id, when, die_at)
    try:  # deadlines for a machine at load 20+ (a full suite beside a benchmark took 180 s and 240 s)
        first = wait_for(
            lambda: next((i["id"] for i in emu.running_instances() if checkpointed(emu, i["id"])), None),
            timeout=300,
        )
        # what its agent has said it uploaded (the step's manifest is in the bucket) when it vanishes
        uploaded = max(int(n) for n in re.findall(r"checkpoint step (\d+) uploaded to", emu.agent_log(first)))
        emu.interrupt(first, notice_s=0)
        assert proc.wait(timeout=300) == -9, proc.stderr.read()[-3000:] if proc.stderr else ""
    finally:  # never left running: a try 1 that relaunches later would land in the next test
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert emu.request_counts().get(LAUNCH_CALL[provider]) == 1  # it died before relaunching

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    rows = result["attempts"]
    assert [r["ended"] for r in rows] == ["interrupted_no_notice", "finished"]  # counted once
    assert rows[0]["instance_id"] == first and rows[1]["instance_id"] != first
    # the row's checkpoint is the newest the attempt uploaded, though its agent may have been taken
    # before its status said so (``lifecycle.resume.loop.attempt_status``)
    assert rows[1]["restored_step"] >= rows[0]["checkpoint_step"] >= uploaded >= 2
    assert emu.request_counts().get(LAUNCH_CALL[provider]) == 2  # one relaunch, no duplicate
    assert result["totals"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))


# The adoption after a lost trigger is provider-neutral; adopting a GCE VM found by its labels is
# kept in ``make test`` by test_worker_killed[gcp-create_call-tags].
@pytest.mark.parametrize("provider", ["aws", pytest.param("gcp", marks=pytest.mark.faults)])
def test_triggerer_and_worker_killed_mid_attempt_adopt_the_running_instance(
    emu, airflow_db, tmp_path: Path, provider: str
) -> None:
    """The deferred attempt's trigger dies with its process; the task runs again and re-attaches to
    the same instance (its job goes on undisturbed) instead of launching a second one."""
    dag_id = f"resume_trigger_killed_{provider}"
    # the job holds at step 4 until the first try is dead: free to run its 24 steps, it could end
    # before a slow machine got the try deferred, and nothing would be left running to adopt
    release = tmp_path / "first-try-killed"
    write_dying_dag(dag_id, provider, deferrable=True, hold_at=4, until=release)
    when = datetime(2026, 3, 1, tzinfo=timezone.utc)
    emu.reset_counts()
    mark = tmp_path / "deferred"
    proc = first_try(dag_id, when, None, mark)

    def deferred_and_running() -> str | None:
        if not mark.exists() or "RunTrigger" not in mark.read_text():
            return None
        return next((i["id"] for i in emu.running_instances() if job_step(emu, i["id"]) >= 3), None)

    instance = wait_for(deferred_and_running, timeout=180)
    proc.kill()
    proc.wait(timeout=60)
    assert instance in [i["id"] for i in emu.running_instances()]  # the job runs on meanwhile
    release.touch()

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert [(r["ended"], r["instance_id"]) for r in result["attempts"]] == [("finished", instance)]
    assert emu.request_counts().get(LAUNCH_CALL[provider]) == 1


def test_an_attempt_taken_before_its_status_named_its_upload_still_counts_it(s3) -> None:
    """The race behind a flaky ``checkpoint_step`` of None: the agent writes a step's manifest, says
    "uploaded", then rewrites its status; an instance taken without notice in between leaves the
    status behind. The ledger row is built from the manifests this instance wrote, not from the
    status alone; another instance's manifest does not count."""
    import json

    from airflow_cloudtrain.contract.runs import Manifest, RunStatus, manifest_key, status_key
    from airflow_cloudtrain.lifecycle.resume.loop import attempt_status
    from airflow_cloudtrain.storage import open_run_folder

    folder = open_run_folder(f"s3://{s3.bucket}/runs/race")
    for step, by in [(2, "i-1"), (4, "i-1"), (6, "i-2")]:
        manifest = Manifest(step, files=[], created_at=100.0 + step, instance_id=by, saved_at=90.0 + step)
        folder.put_text(manifest_key(step), manifest.to_json())
    folder.put_text("checkpoints/8/model.pt", "a step whose manifest never came: not complete")
    folder.put_text(status_key("i-1"), RunStatus("running", "i-1", checkpoint=None).to_json())

    assert json.loads(folder.get_text(status_key("i-1")) or "{}")["checkpoint"] is None  # what it said
    status = attempt_status(folder, "i-1")
    assert status is not None and status.checkpoint == {"step": 4, "saved_at": 94.0, "uploaded_at": 104.0}

    reported = {"step": 4, "saved_at": 94.0, "uploaded_at": 105.0}  # a status that had caught up
    folder.put_text(status_key("i-1"), RunStatus("running", "i-1", checkpoint=reported).to_json())
    assert (attempt_status(folder, "i-1") or status).checkpoint == reported
    assert attempt_status(folder, "i-3") is None  # no status: the agent never reported


def killed_mid_wait(emu: Any, dag_id: str, when: datetime) -> str:
    """Try 1 runs until its instance's job has uploaded a checkpoint, then its worker is SIGKILLed
    while it waits: the instance it leaves, which nobody watches now."""
    proc = first_try(dag_id, when, None)
    try:
        return wait_for(
            lambda: next((i["id"] for i in emu.running_instances() if checkpointed(emu, i["id"])), None),
            timeout=300,
        )
    finally:
        proc.kill()
        proc.wait(timeout=60)


# a new cloud run: ``make faults``. Found by the fault campaign (seed 1's s014, GCE spot; the same code
# on both clouds): the retry released the dead try's instance and relaunched, with no ledger row for it
@pytest.mark.faults
def test_an_instance_taken_while_no_try_watched_keeps_its_ledger_row(emu, airflow_db, tmp_path: Path) -> None:
    """The worker dies mid-wait (SIGKILL), then the cloud takes its instance without notice (no final
    status). The retry relaunches, and its ledger still counts it: a row with its instance and cost,
    in ``cost_usd`` and in the totals; the relaunched job is told it is a restart
    (``CLOUDTRAIN_RESTARTS=1``: it was 0, as if nothing had run before)."""
    dag_id = "resume_unwatched_taken"
    released = tmp_path / "taken"  # the first job holds at step 6; one started after this does not
    write_dying_dag(dag_id, "gcp", deferrable=False, hold_at=6, until=released)
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    emu.reset_counts()
    first = killed_mid_wait(emu, dag_id, when)
    emu.interrupt(first, notice_s=0)  # nobody watches it now
    released.touch()

    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    rows = result["attempts"]
    assert [(r["ended"], r["instance_id"] == first) for r in rows] == [
        ("abandoned", True),  # released without a reported end: how it ended is not known
        ("finished", False),
    ]
    assert rows[0]["cost_usd"] > 0 and result["totals"]["launches"] == 2
    assert result["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert emu.request_counts().get(LAUNCH_CALL["gcp"]) == 2
    assert "restarts=1" in emu.agent_log(rows[1]["instance_id"])


# a new cloud run: ``make faults``. Found by replaying the fault campaign's s105 (GCE spot; the same
# code on both clouds): the retry's ledger write failed and the dead try's VM and firewall rule stayed
@pytest.mark.faults
def test_a_retry_that_fails_before_its_launch_releases_what_the_dead_try_left(emu, airflow_db) -> None:
    """The worker dies mid-wait (SIGKILL); the retry cannot write the run's ledger (access denied:
    not retried) and fails before any launch. It releases the VM the dead try left running and its
    firewall rule, instead of leaving them to the lease and ``cloudtrain gc``."""
    from google.cloud import compute_v1

    from airflow_cloudtrain.contract.runs import TAG_RUN_KEY, RunKey
    from airflow_cloudtrain.emulator import GCP_PROJECT
    from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

    dag_id = "resume_retry_fails_first"
    write_dying_dag(dag_id, "gcp", deferrable=False, hold_at=6)
    when = datetime(2026, 4, 2, tzinfo=timezone.utc)
    first = killed_mid_wait(emu, dag_id, when)
    key = RunKey(dag_id, "train", f"manual__{when.isoformat()}", -1, BUCKET["gcp"])
    emu.fail_writes(f"{BUCKET['gcp']}/{key.path()}/", 1.0, "airflow", 0, "denied")
    try:
        run = load_example(dag_id).test(logical_date=when, run_after=when)
    finally:
        emu.clear_faults()
    assert task_states(run) == {"train": "failed"}
    rules = compute_v1.FirewallsClient(**compute_client_kwargs(emu.gce_endpoint))
    assert [i["name"] for i in emu.gce.alive() if i["labels"].get(TAG_RUN_KEY) == key.digest] == []
    assert first not in [i["id"] for i in emu.running_instances()]
    assert [r.name for r in rules.list(project=GCP_PROJECT) if r.name.startswith(f"ct-{key.digest}-")] == []

"""CheckpointResumeOperator on the emulated EC2 and GCE, inside real Airflow.

The job (``jobs/steps.py``) counts steps, checkpoints every few steps and on SIGTERM, and resumes
from the newest complete checkpoint it finds. The tests interrupt its instances at random steps
(seeded, printed) and check what a user would: the task's state, the step each attempt restored
(it must be the newest complete checkpoint of the attempt before), the job's own "resumed from
step N" line, the ledger in the XCom and in the run folder, and that every instance is gone.
"""

from __future__ import annotations

import calendar
import json
import os
import random
import re
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom

from airflow_cloudtrain.contract.runs import RunKey, join, log_prefix
from airflow_cloudtrain.storage import open_run_folder

JOBS = str(Path(__file__).parent / "jobs")
SPOT = {"aws": "ec2spot", "gcp": "gcspot"}
BUCKET = {"aws": "s3://cloudtrain-emulated/resume", "gcp": "gs://cloudtrain-emulated/resume"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
LAUNCH_CALL = {"aws": "RunInstances", "gcp": "instances.insert"}


def resume_dag(dag_id: str, provider: str, command: str, deferrable: bool = False, extra: str = "") -> Any:
    source = textwrap.dedent(
        f"""
        from datetime import datetime, timedelta
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import CheckpointResumeOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CheckpointResumeOperator(
                task_id="train", cloud={SPOT[provider]!r}, cpus=2, ram="4g", code={JOBS!r},
                command={command!r}, bucket={BUCKET[provider]!r}, region={REGION[provider]!r},
                poll_interval=0.5, live_prices=False, checkpoint_interval=1, deferrable={deferrable},
                {extra})
        """
    )
    return write_dag(source, dag_id)


def job_steps(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"step (\d+) at", log)]


class Interrupter:
    """Interrupts each new instance once its job has reached the next step in ``at`` (a notice of
    ``notice_s[i]`` seconds, 0 = none); remembers the highest step each job printed before."""

    def __init__(
        self,
        emu: Any,
        at: list[int],
        notice_s: list[float],
        uploaded: bool = False,
        done_flag: Any = None,
        last: int | None = None,
    ) -> None:
        self.emu, self.at, self.notice_s = emu, at, notice_s
        self.uploaded = uploaded  # also wait until the agent uploaded a checkpoint
        self.done_flag = done_flag  # created after the last interruption (the job's STEPS_FINISH_AFTER)
        # the step a job holds at until ``done_flag`` (STEPS - 1): a job there (a notice seen late let
        # the one before run up to it) is interrupted at once, since it can go no further
        self.last = last
        self.done: list[tuple[str, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seen: set[str] = set()
        # bounds a hang only (then the job is let finish): at load 50-80 a worker's first test took 586 s,
        # and a 300 s deadline let the job finish uninterrupted
        deadline = time.monotonic() + 540
        while len(self.done) < len(self.at) and time.monotonic() < deadline:
            for inst in self.emu.running_instances():
                if inst["id"] in seen:
                    continue
                log = self.emu.agent_log(inst["id"])
                steps = job_steps(log)
                first = steps[0] - 1 if steps else 0
                ready = not self.uploaded or "uploaded to" in log
                resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", log)]
                holding = self.last is not None and max(steps + resumed, default=-1) >= self.last
                if (holding or steps and steps[-1] - first >= self.at[len(self.done)]) and ready:
                    seen.add(inst["id"])
                    self.done.append((inst["id"], steps[-1]))
                    self.emu.interrupt(inst["id"], notice_s=self.notice_s[len(self.done) - 1])
                    break
            time.sleep(0.1)
        if self.done_flag is not None:
            self.done_flag.touch()

    def join(self) -> None:
        self.thread.join(10)


def job_log(result: dict[str, Any], instance_id: str) -> str:
    folder = open_run_folder(result["run_uri"])
    return "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(instance_id)))


def check_ledger(result: dict[str, Any]) -> None:
    """The ledger's totals are its rows' sums, in the XCom and in the run folder."""
    rows, totals = result["attempts"], result["totals"]
    assert totals["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert result["cost_usd"] == totals["cost_usd"]
    assert totals["interruptions"] == sum(r["ended"].startswith("interrupted") for r in rows)
    assert result["interruptions"] == totals["interruptions"]
    assert all(r["cost_usd"] > 0 for r in rows if r["instance_id"])
    folder = open_run_folder(result["run_uri"])
    stored = json.loads(folder.get_text(f"ledger/{result['run_id']}.json"))
    assert [r["instance_id"] for r in stored["attempts"]] == [r["instance_id"] for r in rows]
    assert stored["state"] == "succeeded"


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_interruptions_resume_from_the_latest_complete_checkpoint(
    emu, airflow_db, tmp_path: Path, provider: str, deferrable: bool
) -> None:
    seed = int(os.environ.get("CLOUDTRAIN_TEST_SEED") or random.randrange(10_000))  # to replay one
    rng = random.Random(seed)
    at = [rng.randint(3, 9), rng.randint(3, 9)]
    print(f"seed {seed}: interrupting after {at} steps")
    dag_id = f"resume_{provider}_{int(deferrable)}"
    # first with a notice, then without; the agent polls the metadata every 5 s, so the notice (GCE's
    # own 30 s) leaves a loaded machine six polls to see it (15 s were too few beside another test run,
    # and a missed notice reads as no notice). No run takes its last step before both interruptions.
    done = tmp_path / "interrupted"
    interrupter = Interrupter(emu, at, notice_s=[30, 0], done_flag=done, last=39)
    command = f"STEPS_FINISH_AFTER={done} python3 steps.py 40 2 0.25"
    run = resume_dag(dag_id, provider, command, deferrable).test()
    interrupter.join()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    rows = result["attempts"]
    assert [r["ended"] for r in rows] == ["interrupted", "interrupted_no_notice", "finished"], rows
    assert [r["instance_id"] for r in rows[:2]] == [iid for iid, _ in interrupter.done]
    for before, after in zip(rows, rows[1:], strict=False):
        # the newest complete checkpoint of the attempt before, never beyond what that job reached
        # (the machine's own output: a job killed without notice may not have flushed its log)
        reached = max(job_steps(emu.agent_log(before["instance_id"])))
        assert after["restored_step"] is not None
        # an agent gone before its first upload completed nothing: the step it restored stands
        newest = (
            before["checkpoint_step"] if before["checkpoint_step"] is not None else before["restored_step"]
        )
        assert newest <= after["restored_step"] <= reached
        assert f"resumed from step {after['restored_step']}" in emu.agent_log(after["instance_id"])
    # with a notice the job saved on SIGTERM: the next attempt starts where it stopped
    assert rows[1]["restored_step"] == rows[0]["checkpoint_step"]
    assert rows[0]["work_lost_s"] < 3
    assert result["resumed_step"] == rows[2]["restored_step"]
    assert result["restarts"] == 2 and result["interruptions"] == 2
    folder = open_run_folder(result["run_uri"])
    assert folder.get_text(f"results/{rows[2]['instance_id']}/final.json") == '{"step": 40}'
    check_ledger(result)
    # the Cloud training page's timeline marks, from the ledger, where each relaunch restored from
    from airflow_cloudtrain.lifecycle.cost_index import read_records
    from airflow_cloudtrain.ui.run_timeline import timeline_of
    from airflow_cloudtrain.ui.runs import run_detail

    records = read_records(open_run_folder(BUCKET[provider]), time.time() - 86_400)
    svg = timeline_of(run_detail(records, result["run_id"]))
    assert re.findall(r'class="ct-mark ct-restore" data-index="(\d)"', svg) == ["1", "2"], svg
    assert f"restore: step {rows[2]['restored_step']}" in svg
    # and every checkpoint each attempt took (its agent's log names them); one killed without notice
    # may have put one more in its status.json before the line
    for i, row in enumerate(rows):
        logged = set(re.findall(r"checkpoint step (\d+) uploaded to ", emu.agent_log(row["instance_id"])))
        marked = re.findall(
            rf'ct-checkpoint" data-index="{i}"><circle [^>]*><title>checkpoint: step (\d+)<', svg
        )
        extra = int(row["ended"] == "interrupted_no_notice")
        assert len(set(marked)) == len(marked), marked  # once each
        assert logged <= set(marked) and len(marked) <= len(logged) + extra, (i, logged, marked)


def test_max_restarts_spent_fails_the_task_and_says_why(emu, airflow_db, capfd) -> None:
    interrupter = Interrupter(emu, [2, 2], notice_s=[0, 0])
    run = resume_dag("resume_budget", "aws", "python3 steps.py 200 2 0.25", extra="max_restarts=1").test()
    interrupter.join()
    assert task_states(run) == {"train": "failed"}
    assert "2 interruptions, more than max_restarts=1" in capfd.readouterr().out
    key = RunKey("resume_budget", "train", run.run_id, -1, BUCKET["aws"])
    folder = open_run_folder(join(BUCKET["aws"], key.path()))
    ledger = json.loads(folder.get_text(f"ledger/{key.short_id}.json"))
    assert ledger["state"] == "failed" and len(ledger["attempts"]) == 2


@pytest.mark.parametrize("budget", [0, 1])
def test_a_failed_job_is_relaunched_only_within_max_restarts_on_errors(
    emu, airflow_db, capfd, budget: int
) -> None:
    dag_id = f"resume_errors_{budget}"
    run = resume_dag(
        dag_id, "gcp", "python3 steps.py 8 2 0.2 5", extra=f"max_restarts_on_errors={budget}"
    ).test()
    if budget == 0:
        assert task_states(run) == {"train": "failed"}
        assert "more than max_restarts_on_errors=0" in capfd.readouterr().out
        return
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert [r["ended"] for r in result["attempts"]] == ["job_error", "finished"]
    assert result["attempts"][0]["exit_code"] == 3
    assert result["attempts"][1]["restored_step"] == 4  # the checkpoint before the failure
    assert "restarts=1" in job_log(result, result["attempts"][1]["instance_id"])


def test_on_demand_after_relaunches_on_demand(emu, airflow_db) -> None:
    interrupter = Interrupter(emu, [3], notice_s=[0])
    run = resume_dag("resume_od", "aws", "python3 steps.py 16 2 0.25", extra="on_demand_after=1").test()
    interrupter.join()
    assert task_states(run) == {"train": "success"}
    rows = xcom(run, "train")["attempts"]
    assert [(r["cloud"], r["spot"]) for r in rows] == [("ec2spot", True), ("ec2", False)]


def test_resume_from_continues_an_earlier_runs_checkpoints(emu, airflow_db) -> None:
    interrupter = Interrupter(emu, [5], notice_s=[0], uploaded=True)
    first = resume_dag("resume_first", "aws", "python3 steps.py 30 2 0.25", extra="max_restarts=0").test()
    interrupter.join()
    assert task_states(first) == {"train": "failed"}
    key = RunKey("resume_first", "train", first.run_id, -1, BUCKET["aws"])
    first_uri = join(BUCKET["aws"], key.path())
    ledger = json.loads(open_run_folder(first_uri).get_text(f"ledger/{key.short_id}.json"))
    saved = ledger["attempts"][0]["checkpoint_step"]
    assert saved is not None

    run = resume_dag(
        "resume_second", "aws", "python3 steps.py 30 2 0.25", extra=f"resume_from={key.short_id!r}"
    ).test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["run_uri"] == first_uri and result["resumed_from"] == first_uri
    assert result["attempts"][0]["restored_step"] >= saved
    assert (
        open_run_folder(first_uri).get_text(f"results/{result['instance_id']}/final.json") == '{"step": 30}'
    )

    missing = resume_dag("resume_missing", "aws", "true", extra="resume_from='ct-0123456789ab'").test()
    assert task_states(missing) == {"train": "failed"}


@pytest.mark.parametrize(
    ("deadline", "spot"),
    [("timedelta(seconds=90)", False), ("timedelta(hours=6)", True)],
    ids=["short-slack-on-demand", "ample-slack-spot"],
)
def test_the_deadline_policy_chooses_by_slack(emu, airflow_db, deadline: str, spot: bool) -> None:
    dag_id = f"resume_deadline_{int(spot)}"
    extra = f"policy='deadline', deadline={deadline}, expected_duration=30"
    run = resume_dag(dag_id, "gcp", "python3 steps.py 4 2 0.2", extra=extra).test()
    assert task_states(run) == {"train": "success"}
    (row,) = xcom(run, "train")["attempts"]
    assert row["spot"] is spot and row["cloud"] == ("gcspot" if spot else "gcloud")


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_the_deadline_policy_waits_out_a_spot_capacity_gap(emu, airflow_db, deferrable: bool) -> None:
    """No spot capacity and hours of slack: the policy waits (a timer deferral when deferrable)
    instead of paying for on-demand, and launches spot once capacity is back."""
    import boto3

    emu.fail_capacity("t3.medium")
    s3 = boto3.client("s3")

    def capacity_error_in_ledger() -> bool:
        prefix = f"resume/runs/resume_gap_{int(deferrable)}/"
        listing = s3.list_objects_v2(Bucket="cloudtrain-emulated", Prefix=prefix)
        for obj in listing.get("Contents", []):
            if "/ledger/" in obj["Key"]:
                body = s3.get_object(Bucket="cloudtrain-emulated", Key=obj["Key"])["Body"].read()
                if b"capacity_error" in body:
                    return True
        return False

    def clear_when(cond: Callable[[], bool]) -> None:
        # bounds a hang only: on a loaded machine the worker's first test can take minutes to reach its
        # first launch, and clearing the fault before it tried would let the first attempt find capacity
        deadline = time.monotonic() + 500
        while time.monotonic() < deadline and not cond():
            time.sleep(0.2)
        emu.clear_faults()

    gap = threading.Thread(target=clear_when, args=(capacity_error_in_ledger,), daemon=True)
    gap.start()
    extra = (
        "policy='deadline', deadline=timedelta(hours=6), expected_duration=60, "
        "instance_type='t3.medium', max_launch_attempts=1"
    )
    dag_id = f"resume_gap_{int(deferrable)}"
    run = resume_dag(dag_id, "aws", "python3 steps.py 4 2 0.2", deferrable, extra=extra).test()
    gap.join(5)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert [r["ended"] for r in result["attempts"]] == ["capacity_error", "finished"]
    assert result["attempts"][1]["spot"] is True  # it waited for spot instead of paying on-demand
    assert result["totals"]["waited_s"] > 0
    # the Cloud training page's timeline draws the policy's deadline, 6 h after the run began
    from airflow_cloudtrain.lifecycle.cost_index import read_records
    from airflow_cloudtrain.ui.run_timeline import timeline_of
    from airflow_cloudtrain.ui.runs import run_detail

    records = read_records(open_run_folder(BUCKET["aws"]), time.time() - 86_400)
    svg = timeline_of(run_detail(records, result["run_id"]))
    (stamp,) = re.findall(r'<line class="ct-deadline"[^>]*><title>deadline ([^<]+)</title>', svg)
    deadline = calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S UTC"))
    ledger = json.loads(open_run_folder(result["run_uri"]).get_text(f"ledger/{result['run_id']}.json"))
    assert abs(deadline - (ledger["started_at"] + 6 * 3600)) < 600, (stamp, ledger["started_at"])


def test_a_hung_job_is_stopped_as_idle_with_the_reason_in_the_task_log(emu, airflow_db, capfd) -> None:
    run = resume_dag("resume_idle", "gcp", "echo started; sleep 600", extra="idle_timeout=3").test()
    assert task_states(run) == {"train": "failed"}
    out = capfd.readouterr().out
    assert "no CPU or GPU use for 3 s (idle_timeout)" in out
    assert "more than max_restarts_on_errors=0" in out
    key = RunKey("resume_idle", "train", run.run_id, -1, BUCKET["gcp"])
    folder = open_run_folder(join(BUCKET["gcp"], key.path()))
    ledger = json.loads(folder.get_text(f"ledger/{key.short_id}.json"))
    assert [r["ended"] for r in ledger["attempts"]] == ["idle"]


def test_runs_show_prints_the_ledger_without_airflow(emu, airflow_db, capsys) -> None:
    from airflow_cloudtrain.cli import main

    run = resume_dag("resume_show", "aws", "python3 steps.py 4 2 0.2").test()
    result = xcom(run, "train")
    capsys.readouterr()
    assert main(["runs", "show", result["run_id"], "--bucket", BUCKET["aws"]]) == 0
    out = capsys.readouterr().out
    assert result["run_id"] in out and "finished" in out and result["instance_type"] in out
    assert f"${result['cost_usd']:.6f}" in out
    assert main(["runs", "show", result["run_uri"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempts"][0]["ended"] == "finished"
    assert main(["runs", "show", "ct-000000000000", "--bucket", BUCKET["aws"]]) == 1


def test_a_killed_task_stops_the_loop_and_the_ledger_keeps_what_it_cost(emu, airflow_db) -> None:
    """SIGTERM is how Airflow kills a running task: on_kill releases the attempt and the loop launches
    nothing more; the released attempt is a row of the ledger."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    emu.reset_counts()

    def kill_when_running() -> None:
        deadline = time.monotonic() + 400  # a loaded machine's first test: parse, launch, agent start
        while time.monotonic() < deadline:
            if any(job_steps(emu.agent_log(i["id"])) for i in emu.running_instances()):
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    try:
        killer.start()
        run = resume_dag("resume_killed_task", "aws", "python3 steps.py 400 2 0.25").test()
        killer.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert task_states(run) == {"train": "failed"}
    assert emu.request_counts().get("RunInstances") == 1  # no relaunch after the kill
    key = RunKey("resume_killed_task", "train", run.run_id, -1, BUCKET["aws"])
    folder = open_run_folder(join(BUCKET["aws"], key.path()))
    ledger = json.loads(folder.get_text(f"ledger/{key.short_id}.json"))
    (row,) = ledger["attempts"]
    assert row["ended"] == "abandoned" and row["cost_usd"] > 0

"""Runs nobody watches end themselves: ``orphan_timeout`` (issue 26).

Try 1 of each DAG runs in a subprocess that SIGKILLs itself once the job runs (no ``on_kill``,
no trigger, no retry: what a task marked failed before any triggerer ran its trigger, a lost worker,
or a dropped Airflow database leave behind). Nothing renews the run's lease after that, so the agent
must end the run by itself: ``orphaned.json`` in the run folder, the job's checkpoint synced, a final
status naming the lapsed lease, the instance terminated. A watcher that keeps renewing (and one that
stops for less than the timeout) keeps the run alive. Timeouts are short (6 s with 1 s polls); every
wait is on a condition, with a generous deadline.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import load_example, start_first_try, task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.cli import main
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned, check_interval_s
from airflow_cloudtrain.contract.runs import RunKey, RunStatus, join, status_key
from airflow_cloudtrain.storage import open_run_folder

BUCKET = "s3://cloudtrain-emulated/orphans"
TIMEOUT_S = 6.0

DAG_SOURCE = """
import os
import signal
import threading
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import CloudTrainOperator

DIE = os.environ.get("CLOUDTRAIN_TEST_DIE")  # set only in the process that plays the lost task
PAUSE = float(os.environ.get("CLOUDTRAIN_TEST_PAUSE", "0"))
RENEWALS = os.environ.get("CLOUDTRAIN_TEST_RENEWALS")  # each lease this task writes, its renewed_at


def die():
    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no on_kill, no trigger


def until_running(attempt):
    # the lost task goes only once the job runs (it checkpoints first thing): an instance's boot on a
    # loaded test machine can take longer than the 6 s timeout, which a real one (30 min) never does
    from airflow_cloudtrain.contract.runs import RunStatus

    started = time.monotonic()
    seen = {{}}
    while time.monotonic() < started + 180:  # before the test's own 240 s: the try says what it saw
        attempt.lease.renew()
        for key in attempt.folder.list("instances/"):
            raw = attempt.folder.get_text(key) if key.endswith("/status.json") else None
            if raw:
                seen[key] = (RunStatus.from_json(raw).state, round(time.monotonic() - started, 1))
            if raw and RunStatus.from_json(raw).state == "running":
                return
        time.sleep(0.2)
    raise RuntimeError(f"the job was not running after 180 s; statuses seen (state, s): {{seen}}")


class LostTaskOperator(CloudTrainOperator):
    def defer(self, *args, **kwargs):  # deferred: lost before any triggerer ran its trigger
        if DIE == "defer":
            until_running(self._engine.attempt)
            die()
        return super().defer(*args, **kwargs)

    def _new_attempt(self, context):
        attempt = super()._new_attempt(context)
        wait = attempt.wait
        renew = attempt.lease.renew

        def logged(force=False):
            written = renew(force=force)
            if written and RENEWALS:
                with open(RENEWALS, "a") as out:
                    out.write(repr(attempt.lease.renewed_at) + "\\n")
            return written

        attempt.lease.renew = logged

        def wait_then_die(launch):
            if DIE == "wait":  # blocking: the worker is lost once the job runs
                threading.Thread(target=lambda: (until_running(attempt), die()), daemon=True).start()
            if PAUSE:  # a watcher that renewed, stops for a while (a triggerer restart), then resumes
                attempt.lease.renew(force=True)
                time.sleep(PAUSE)
            return wait(launch)

        attempt.wait = wait_then_die
        return attempt


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    LostTaskOperator(task_id="train", cloud="ec2", cpus=2, ram="4g", bucket="{bucket}",
                     region="us-east-1", poll_interval=1, live_prices=False, deferrable={deferrable},
                     orphan_timeout={timeout}, command={command!r})
"""

# a job that checkpoints once, then runs far longer than the test: only the lease can end it
LONG_JOB = 'echo step-7 > "$CLOUDTRAIN_CHECKPOINT_DIR/state.json"; echo started; sleep 600'


def _dag(dag_id: str, deferrable: bool, command: str, timeout: float | None = TIMEOUT_S) -> None:
    source = DAG_SOURCE.format(
        dag_id=dag_id, bucket=BUCKET, deferrable=deferrable, timeout=timeout, command=command
    )
    write_dag(source, dag_id)


def _folder(dag_id: str, when: datetime) -> Any:
    run_id = f"manual__{when.isoformat()}"
    return open_run_folder(join(BUCKET, RunKey(dag_id, "train", run_id, -1, BUCKET).path()))


def _alive(emu: Any, folder: Any) -> list[dict[str, Any]]:
    ids = {k.split("/")[1] for k in folder.list("instances/") if k.count("/") >= 2}
    return [i for i in emu.running_instances() if i["id"] in ids]


def _status(folder: Any) -> RunStatus | None:
    keys = [k for k in folder.list("instances/") if k.endswith("/status.json")]
    raw = folder.get_text(keys[0]) if keys else None
    return RunStatus.from_json(raw) if raw else None


@pytest.mark.parametrize("mode", ["deferred", "blocking"])
def test_a_run_nobody_watches_ends_itself(emu, airflow_db, capsys, tmp_path: Path, mode: str) -> None:
    """(a) deferred, lost before any triggerer ran its trigger; (b) blocking, its worker SIGKILLed
    and never retried: the agent ends the run within orphan_timeout + one check of its lease."""
    dag_id = f"orphan_{mode}"
    _dag(dag_id, deferrable=mode == "deferred", command=LONG_JOB)
    when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(hours=1 if mode == "deferred" else 2)
    renewals = tmp_path / "renewals"
    die = {"CLOUDTRAIN_TEST_DIE": "defer" if mode == "deferred" else "wait"}
    proc = start_first_try(dag_id, when, {**die, "CLOUDTRAIN_TEST_RENEWALS": str(renewals)})
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"
    folder = _folder(dag_id, when)
    lease = Lease.from_json(folder.get_text(LEASE_KEY) or "")  # written before the launch
    assert lease.orphan_timeout_s == TIMEOUT_S and lease.by == "worker"
    # the job runs on: nobody will renew its lease (on a loaded machine the agent may have ended it
    # already: the lease was renewed last up to a third of the 6 s timeout before the task died)
    first = _status(folder)
    assert first is not None and (
        first.state == "running" or (first.message or "").startswith("orphaned: ")
    ), first

    record = Orphaned.from_json(wait_for(lambda: folder.get_text(ORPHANED_KEY), message="orphaned.json"))
    assert record.ended_by == "agent"
    # the lease the agent went by (lapsed_at is its renewed_at + the timeout): the lost task wrote its
    # next one (if any: under load a lost task can still be renewing late, after the run ended) a full
    # timeout or more later, so the agent ended a run whose watcher had really stopped renewing
    seen = record.lapsed_at - TIMEOUT_S
    written = sorted(float(line) for line in renewals.read_text().split()) if renewals.exists() else []
    assert written, "the lost task logged no lease it wrote"
    later = [at for at in written if at > seen + 0.001]
    assert not later or later[0] >= seen + TIMEOUT_S - 0.01, (seen, written)
    # noticed within one check of the lapse (plus what a loaded machine adds to a 1 s timer)
    assert 0 <= record.noticed_at - record.lapsed_at <= check_interval_s(TIMEOUT_S) + 15.0
    status = wait_for(lambda: (s := _status(folder)) and s.final and s, message="the final status")
    assert status.state == "failed"
    assert status.message.startswith("orphaned: no watcher renewed the lease since ")
    assert status.checkpoint is not None  # the job's checkpoint went up before the power-off
    manifests = [k for k in folder.list("checkpoints/") if k.endswith("/MANIFEST.json")]
    assert manifests, "no checkpoint synced"
    wait_for(lambda: not _alive(emu, folder), message="the instance terminated")
    lapsed = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.lapsed_at))
    assert main(["runs", "show", folder.uri]) == 0  # the operator of the deployment sees it
    assert f"lease: orphaned: its lease lapsed at {lapsed}; ended by agent" in capsys.readouterr().out
    assert main(["runs", "list", "--bucket", BUCKET, "--orphaned", "--json"]) == 0
    listed = {row["run_uri"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed[folder.uri]["state"] == "orphaned"
    assert listed[folder.uri]["lapsed_at"] == record.lapsed_at


def test_a_renewing_watcher_keeps_the_run_alive_past_several_timeouts(emu, airflow_db, monkeypatch) -> None:
    """(c) A blocking wait renews the lease: a 20 s job outlives three 6 s timeouts; the watcher
    first stops renewing for 4 s (less than the timeout: a triggerer restart at small scale)."""
    dag_id = "orphan_renewed"
    _dag(dag_id, deferrable=False, command="echo started; sleep 20; echo done")
    when = datetime(2026, 1, 1, 3, tzinfo=timezone.utc)
    monkeypatch.setenv("CLOUDTRAIN_TEST_PAUSE", "4")
    run = load_example(dag_id).test(logical_date=when, run_after=when)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["state"] == "succeeded" and result["duration_s"] > 3 * TIMEOUT_S
    folder = _folder(dag_id, when)
    assert folder.get_text(ORPHANED_KEY) is None
    assert Lease.from_json(folder.get_text(LEASE_KEY) or "").by == "worker"
    assert json.loads(folder.get_text(status_key(result["instance_id"])) or "{}")["state"] == "succeeded"


FLEET_BUCKET = "s3://cloudtrain-emulated/orphan-fleet"
JOBS = str(Path(__file__).parent / "jobs")
FLEET_DAG = """
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import SpotFleetOperator


class LostFleetOperator(SpotFleetOperator):
    def new_engine(self, context):
        engine = super().new_engine(context)
        watch_of = engine.watch

        def watch(handle):  # the operator is lost once a worker runs an item: nobody watches the fleet
            found = watch_of(handle)
            poll = found.poll

            def poll_then_die():
                done = poll()
                if any(k.endswith("/status.json") for k in found.folder.list("items/")):
                    os.kill(os.getpid(), signal.SIGKILL)
                return done

            found.poll = poll_then_die
            return found

        engine.watch = watch
        return engine


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    LostFleetOperator(
        task_id="sweep", cloud="ec2spot", cpus=2, ram="4g", code="{jobs}", command="python3 item.py",
        bucket="{bucket}", region="us-east-1", poll_interval=1, live_prices=False, lease_timeout=10,
        orphan_timeout={timeout}, num_workers=2, max_workers=2,
        work_items=[{{"steps": 600, "step_s": 0.5, "n": n}} for n in range(4)])
"""


def _sweep_gc(digest: str) -> None:
    """What ``cloudtrain gc`` deletes of a drained fleet (its helper builds it): the group at 0, the
    queues and the template, so that nothing of the test stays in the emulator."""
    import boto3

    asg, sqs, ec2 = boto3.client("autoscaling"), boto3.client("sqs"), boto3.client("ec2")
    asg.delete_auto_scaling_group(AutoScalingGroupName=f"ct-{digest}", ForceDelete=True)
    for url in sqs.list_queues(QueueNamePrefix=f"ct-{digest}").get("QueueUrls", []):
        sqs.delete_queue(QueueUrl=url)
    for template in ec2.describe_launch_templates(
        Filters=[{"Name": "launch-template-name", "Values": [f"ct-{digest}"]}]
    )["LaunchTemplates"]:
        ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])


def test_a_fleet_whose_operator_is_gone_drains(emu, airflow_db) -> None:
    """(d) The workers see the fleet's lease lapse, stop their items (checkpoint synced, the items
    back in the queue), and leave the group with its desired capacity decremented: it goes to 0."""
    import boto3

    dag_id = "orphan_fleet"
    write_dag(FLEET_DAG.format(dag_id=dag_id, jobs=JOBS, bucket=FLEET_BUCKET, timeout=TIMEOUT_S), dag_id)
    when = datetime(2026, 1, 1, 5, tzinfo=timezone.utc)
    proc = start_first_try(dag_id, when, {})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"
    key = RunKey(dag_id, "sweep", f"manual__{when.isoformat()}", -1, FLEET_BUCKET)
    folder = open_run_folder(join(FLEET_BUCKET, key.path()))
    asg = boto3.client("autoscaling")
    try:
        record = Orphaned.from_json(wait_for(lambda: folder.get_text(ORPHANED_KEY), message="orphaned.json"))
        assert record.ended_by == "worker"

        def drained() -> bool:
            groups = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"ct-{key.digest}"])
            group = groups["AutoScalingGroups"][0]
            members = [i for i in emu.running_instances() if i.get("group") == f"ct-{key.digest}"]
            return group["DesiredCapacity"] == 0 and not members

        wait_for(drained, timeout=180, message="the group drained to 0")
        records = [
            json.loads(folder.get_text(k) or "{}") for k in folder.list("workers/") if k.endswith(".json")
        ]
        assert records and all(r["state"] == "left" for r in records)
        assert not [k for k in folder.list("outcomes/")]  # no item ran to its end: they wait for a rerun
    finally:
        _sweep_gc(key.digest)

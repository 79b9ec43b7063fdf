"""Runs nobody watches end themselves on GCE too, and a run whose Airflow database is deleted (issue 26).

Try 1 of each DAG runs ``dag.test()`` in a subprocess and is lost once the job runs (no ``on_kill``,
no trigger, no retry). Nothing renews the run's lease after that, so the agent on the VM must end the
run: ``orphaned.json``, the checkpoint synced, a final status naming the lapsed lease, the VM powered
off. A powered-off GCE VM still bills for its disk, and its run's firewall rule stays: ``cloudtrain gc``
deletes both, and then nothing of the run is left (the ``emu`` fixture also fails on any live VM or
firewall rule of a run).

The database case: try 1 runs against its own copy of the metadata database; once the task has
deferred (the triggerer, in dag.test()'s own process, renews the lease), the test deletes that
database file and the process with it (a deployment torn down, its database dropped): the only thing
left that can end the run is its lease.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import start_first_try, write_dag
from waiting import wait_for

from airflow_cloudtrain.cli import main
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned
from airflow_cloudtrain.contract.runs import RunKey, RunStatus, join
from airflow_cloudtrain.storage import open_run_folder

# Both tests need the watcher to renew the lease until the test itself removes the watcher: the run may
# end by itself only after that. The product renews every timeout / 3; at 6 s, a watcher starved for
# 6 s on a machine running two suites (load 20-30) let the lease lapse before the kill, and the run
# ended itself first, as the product should ("try 1 did not die: rc=0", twice in four such suites).
# 20 s keeps a renewal every 6.7 s: the price is 14 s more of waiting per test, no CPU.
TIMEOUT_S = 20.0
GCS_BUCKET = "gs://cloudtrain-emulated/orphans-gce"
S3_BUCKET = "s3://cloudtrain-emulated/orphans-db"

DAG_SOURCE = """
import os
import signal
import threading
import time
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import CloudTrainOperator

DIE = os.environ.get("CLOUDTRAIN_TEST_DIE")  # set only in the process that plays the lost watcher


def until_running(attempt):
    # the watcher goes only once the job runs: a VM's boot on a loaded test machine can take longer
    # than the 20 s timeout, which a real one (30 min) never does
    from airflow_cloudtrain.contract.runs import RunStatus

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        attempt.lease.renew()
        for key in attempt.folder.list("instances/"):
            raw = attempt.folder.get_text(key) if key.endswith("/status.json") else None
            if raw and RunStatus.from_json(raw).state == "running":
                return
        time.sleep(0.2)


class LostWatcherOperator(CloudTrainOperator):
    def _new_attempt(self, context):
        attempt = super()._new_attempt(context)
        wait = attempt.wait

        def wait_then_die(launch):
            if DIE == "wait":  # blocking: the worker is lost once the job runs
                def lost():
                    until_running(attempt)
                    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no on_kill, no retry

                threading.Thread(target=lost, daemon=True).start()
            return wait(launch)

        attempt.wait = wait_then_die
        return attempt


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    LostWatcherOperator(task_id="train", cloud="{cloud}", cpus=2, ram="4g", bucket="{bucket}",
                        region="{region}", poll_interval=1, live_prices=False, deferrable={deferrable},
                        orphan_timeout={timeout}, command={command!r})
"""

# a job that checkpoints once, then runs far longer than the test: only the lease can end it
LONG_JOB = 'echo step-7 > "$CLOUDTRAIN_CHECKPOINT_DIR/state.json"; echo started; sleep 600'


def _write(dag_id: str, cloud: str, region: str, bucket: str, deferrable: bool) -> None:
    source = DAG_SOURCE.format(
        dag_id=dag_id,
        cloud=cloud,
        region=region,
        bucket=bucket,
        deferrable=deferrable,
        timeout=TIMEOUT_S,
        command=LONG_JOB,
    )
    write_dag(source, dag_id)


def _folder(bucket: str, dag_id: str, when: datetime) -> Any:
    return open_run_folder(
        join(bucket, RunKey(dag_id, "train", f"manual__{when.isoformat()}", -1, bucket).path())
    )


def _status(folder: Any) -> RunStatus | None:
    keys = [k for k in folder.list("instances/") if k.endswith("/status.json")]
    raw = folder.get_text(keys[0]) if keys else None
    return RunStatus.from_json(raw) if raw else None


def _ends_by_itself(folder: Any) -> Orphaned:
    """orphaned.json by the agent, a final 'orphaned' status with the checkpoint synced."""
    record = Orphaned.from_json(wait_for(lambda: folder.get_text(ORPHANED_KEY), message="orphaned.json"))
    assert record.ended_by == "agent"
    status = wait_for(lambda: (s := _status(folder)) and s.final and s, message="the final status")
    assert status.state == "failed"
    assert status.message.startswith("orphaned: no watcher renewed the lease since ")
    assert status.checkpoint is not None
    assert [k for k in folder.list("checkpoints/") if k.endswith("/MANIFEST.json")], "no checkpoint synced"
    return record


# a VM's boot, the lease's lapse and gc, on a loaded machine; each wait has its own deadline
@pytest.mark.timeout(1800)
def test_a_gcspot_run_whose_watcher_is_gone_powers_off_and_gc_deletes_it(emu, airflow_db, capsys) -> None:
    """Within orphan_timeout + one check the VM is TERMINATED (not deleted: GCE keeps a powered-off VM
    and its disk); ``cloudtrain gc`` then deletes the VM and the run's firewall rule, nothing else."""
    from airflow_cloudtrain.clouds.registry import backend_for

    dag_id = "orphan_gce_blocking"
    _write(dag_id, "gcspot", "us-central1", GCS_BUCKET, deferrable=False)
    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    key = RunKey(dag_id, "train", f"manual__{when.isoformat()}", -1, GCS_BUCKET)
    proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_DIE": "wait"})
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()  # never left running: it would launch after the test gave up
        _, err = proc.communicate()
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"
    folder = _folder(GCS_BUCKET, dag_id, when)
    lease = Lease.from_json(folder.get_text(LEASE_KEY) or "")
    assert lease.orphan_timeout_s == TIMEOUT_S

    record = _ends_by_itself(folder)
    assert record.lapsed_at >= lease.renewed_at + TIMEOUT_S - 0.01
    cloud = backend_for("gcspot", region="us-central1").cloud

    def powered_off() -> list[Any]:
        found = cloud.find(key.digest, ended=True)
        return found if found and all(i.state == "terminated" for i in found) else []

    vms = wait_for(powered_off, message="the VM powered off (TERMINATED)")
    assert len(vms) == 1
    rules = [r["name"] for r in emu.gce.firewalls(emu.gce.projects()[0]) if key.digest in r["name"]]
    assert rules, "the run's firewall rule is expected to stay until gc (the VM is not deleted yet)"

    assert main(["gc", "--cloud", "gcspot", "--region", "us-central1", "--bucket", GCS_BUCKET,
                 "--older-than", "0", "--dry-run"]) == 0  # fmt: skip
    listed = capsys.readouterr().out
    assert vms[0].id in listed and "would be deleted" in listed
    assert cloud.find(key.digest, ended=True), "--dry-run deleted something"

    assert main(["gc", "--cloud", "gcspot", "--region", "us-central1", "--bucket", GCS_BUCKET,
                 "--older-than", "0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert vms[0].id in out
    wait_for(lambda: not cloud.find(key.digest, ended=True), message="the VM deleted by gc")
    left = [r["name"] for p in emu.gce.projects() for r in emu.gce.firewalls(p) if key.digest in r["name"]]
    assert left == [], f"firewall rules left after gc: {left}"


DB_CHILD = """
import sys
from datetime import datetime
sys.path.insert(0, {tests!r})
from dag_helpers import load_example
when = datetime.fromisoformat({when!r})
load_example({dag_id!r}).test(logical_date=when, run_after=when)
"""


def _db_path() -> Path:
    from airflow.configuration import conf

    url = conf.get("database", "sql_alchemy_conn")
    assert url.startswith("sqlite:///"), f"this test copies a sqlite metadata database; got {url}"
    return Path(url.removeprefix("sqlite:///"))


@pytest.mark.timeout(1800)  # a try's start and the lease's lapse, on a loaded machine
def test_a_run_whose_airflow_database_is_deleted_ends_itself(emu, airflow_db, tmp_path) -> None:
    """A deferred run; its Airflow deployment (the process running the task and its triggerer) and its
    metadata database are deleted mid-run. Its lease lapses; the agent ends it; nothing left."""
    dag_id = "orphan_db_deleted"
    _write(dag_id, "ec2spot", "us-east-1", S3_BUCKET, deferrable=True)
    when = datetime(2026, 1, 3, tzinfo=timezone.utc)
    database = tmp_path / "airflow.db"
    with sqlite3.connect(_db_path()) as source, sqlite3.connect(database) as copy:
        source.backup(copy)  # migrated already (WAL included): the try starts at once
    tests = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(DB_CHILD.format(tests=tests, when=when.isoformat(), dag_id=dag_id)),
        ],
        env={**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = _folder(S3_BUCKET, dag_id, when)

    def deferred_and_running() -> bool:
        raw = folder.get_text(LEASE_KEY)
        status = _status(folder)
        return bool(raw and Lease.from_json(raw).by == "triggerer" and status and status.state == "running")

    try:
        wait_for(
            lambda: deferred_and_running() or proc.poll() is not None,
            timeout=900,
            message="the task deferred, its trigger renewing, the job running",
        )
    finally:
        # the deployment is torn down with its database: no on_kill, no trigger cleanup
        database.unlink(missing_ok=True)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, f"the try ended before its deployment was torn down:\n{err[-3000:]}"
    assert not database.exists()
    record = _ends_by_itself(folder)
    renewed = Lease.from_json(folder.get_text(LEASE_KEY) or "")
    assert renewed.by == "triggerer" and record.lapsed_at >= renewed.renewed_at + TIMEOUT_S - 0.01
    ids = {k.split("/")[1] for k in folder.list("instances/") if k.count("/") >= 2}
    wait_for(
        lambda: not [i for i in emu.running_instances() if i["id"] in ids], message="the instance terminated"
    )

"""The agent's worker mode for real: agent subprocesses (``python -m airflow_cloudtrain.agent``) taking
items from an SQS queue (moto server) and writing to S3 (moto server), with the emulator's metadata
server as their IMDS.

What a user checks: every item has exactly one ``outcomes/<id>.json`` and its job saw its item; a
failing item is retried up to ``max_item_attempts``, then its outcome is ``failed`` and its message is
in the dead-letter queue; two workers split a queue without running an item twice; an item that
already has its outcome is not run again; an interrupted item is sent again and resumes from its
checkpoint on the next worker; heartbeats keep a long item's lease; a worker in an Auto Scaling group
leaves it (protection off, desired capacity down) instead of powering off. Every wait is on a
condition with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from airflow_cloudtrain.agent.queue_sqs import Lease
from airflow_cloudtrain.agent.worker import Worker as InProcessWorker
from airflow_cloudtrain.contract import runs, workqueue
from airflow_cloudtrain.contract.workqueue import ItemOutcome, WorkerRecord, WorkerSettings
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.storage import RunFolder, open_run_folder

REPO = Path(__file__).resolve().parents[2]
STEPS_JOB = Path(__file__).resolve().parent / "jobs" / "steps.py"
FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.5, "metadata_poll_s": 0.3}

# The job: says which item it got (log and output files); an item with "fail" in it exits 3.
ITEM_JOB = r"""echo "item $CLOUDTRAIN_ITEM_ID: $CLOUDTRAIN_WORK_ITEM"
printf '%s' "$CLOUDTRAIN_WORK_ITEM" > "$CLOUDTRAIN_OUTPUT_DIR/item.txt"
printf '%s' "$CLOUDTRAIN_ITEM_ID" > "$CLOUDTRAIN_OUTPUT_DIR/id.txt"
case "$CLOUDTRAIN_WORK_ITEM" in *fail*) echo failing; exit 3;; esac
sleep "${ITEM_SLEEP:-0}"
"""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Worker:
    """One worker: an agent process on the fleet's run folder, as its own instance."""

    def __init__(self, fleet: Fleet, iid: str | None, poweroff: Path | None) -> None:
        self.fleet = fleet
        self.iid = iid or f"i-{uuid.uuid4().hex[:12]}"
        self.poweroff = poweroff
        env = {
            **os.environ,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": fleet.md.endpoint_for(self.iid),
            "GCE_METADATA_HOST": fleet.md.gce_host_for(self.iid),
        }
        argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", fleet.uri]
        argv += ["--instance-id", self.iid, "--workdir", str(fleet.tmp / self.iid)]
        if poweroff is not None:
            argv += ["--poweroff", f"touch '{poweroff}'"]
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr = ""

    def wait(self, timeout: float = 120.0) -> WorkerRecord:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"worker {self.iid} did not end in {timeout} s: {err.decode()[-3000:]}")
        self.stderr = err.decode()
        assert self.proc.returncode == 0, self.stderr[-3000:]
        record = self.record()
        assert record is not None, "no worker record"
        return record

    def record(self) -> WorkerRecord | None:
        text = self.fleet.folder.get_text(workqueue.worker_key(self.iid))
        return WorkerRecord.from_json(text) if text else None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class Fleet:
    """A fleet's run folder (spec with ``worker``), its queue and dead-letter queue."""

    def __init__(
        self, s3: Any, md: MetadataServer, tmp: Path, command: str = ITEM_JOB, **settings: Any
    ) -> None:
        self.sqs = boto3.client("sqs")
        name = uuid.uuid4().hex[:10]
        self.queue = self.sqs.create_queue(QueueName=f"ct-{name}")["QueueUrl"]
        self.dlq = self.sqs.create_queue(QueueName=f"ct-{name}-dlq")["QueueUrl"]
        self.uri = f"s3://{s3.bucket}/runs/fleet/{name}/-1"
        self.folder = open_run_folder(self.uri)
        spec_fields = {k: settings.pop(k) for k in list(settings) if k in runs.RunSpec.__dataclass_fields__}
        self.settings = WorkerSettings(
            provider="aws",
            queue=self.queue,
            dead_letter=self.dlq,
            region="us-east-1",
            **{"lease_s": 30, "heartbeat_s": 1.0, "wait_s": 1, "empty_polls": 2, **settings},
        )
        self.spec = runs.RunSpec(
            run_id="ct-fleet",
            run_uri=self.uri,
            cloud="ec2spot",
            command=command,
            worker=self.settings.to_dict(),
            **{**FAST, **spec_fields},
        )
        self.folder.put_text(runs.SPEC_KEY, self.spec.to_json())
        self.md, self.tmp = md, tmp
        self.workers: list[Worker] = []

    def send(self, items: list[Any]) -> list[str]:
        ids = workqueue.item_ids(len(items))
        for item_id, item in zip(ids, items, strict=True):
            body = workqueue.encode_message(item_id, workqueue.item_text(item))
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=body)
        return ids

    def worker(self, iid: str | None = None, poweroff: Path | None = None) -> Worker:
        worker = Worker(self, iid, poweroff)
        self.workers.append(worker)
        return worker

    def item(self, item_id: str) -> RunFolder:
        return open_run_folder(runs.join(self.uri, workqueue.item_prefix(item_id)))

    def outcome(self, item_id: str) -> ItemOutcome | None:
        text = self.folder.get_text(workqueue.outcome_key(item_id))
        return ItemOutcome.from_json(text) if text else None

    def attempts(self, item_id: str) -> list[str]:
        """The attempts that reported a status for the item."""
        keys = self.item(item_id).list("instances/")
        return sorted(k.split("/")[1] for k in keys if k.endswith("/status.json"))

    def status(self, item_id: str, attempt: str) -> runs.RunStatus | None:
        text = self.item(item_id).get_text(runs.status_key(attempt))
        return runs.RunStatus.from_json(text) if text else None

    def log(self, item_id: str, attempt: str) -> str:
        folder = self.item(item_id)
        return b"".join(folder.get_bytes(k) or b"" for k in folder.list(runs.log_prefix(attempt))).decode()

    def result(self, item_id: str, attempt: str, name: str) -> str | None:
        return self.item(item_id).get_text(runs.join(runs.results_prefix(attempt), name))

    def counts(self, url: str | None = None) -> tuple[int, int]:
        """(visible, in flight) messages of the queue (the work queue by default)."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=url or self.queue,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )

    def dead_letters(self) -> list[str]:
        got = self.sqs.receive_message(QueueUrl=self.dlq, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        return [m["Body"] for m in got.get("Messages", [])]


@pytest.fixture
def fleets(s3: Any, metadata: MetadataServer, tmp_path: Path) -> Any:
    """Makes fleets; any worker still running at the end is killed."""
    made: list[Fleet] = []

    def make(**kwargs: Any) -> Fleet:
        fleet = Fleet(s3, metadata, tmp_path, **kwargs)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        for worker in fleet.workers:
            worker.kill()


def test_worker_runs_each_item_once_retries_failures_then_powers_off(fleets: Any, tmp_path: Path) -> None:
    fleet = fleets(max_item_attempts=2)
    items = ["alpha", {"n": 2, "name": "beta"}, "please fail"]
    ids = fleet.send(items)
    poweroff = tmp_path / "powered-off"
    worker = fleet.worker(poweroff=poweroff)
    record = worker.wait()
    assert record.state == "left" and record.ended_at is not None and poweroff.exists()
    for item_id, item in zip(ids[:2], items[:2], strict=True):
        outcome = fleet.outcome(item_id)
        attempt = workqueue.attempt_name(worker.iid, 1)
        assert outcome is not None and outcome.state == workqueue.SUCCEEDED, outcome
        assert (outcome.attempt, outcome.instance_id, outcome.exit_code) == (attempt, worker.iid, 0)
        assert (outcome.attempts, outcome.interruptions) == (1, 0)
        assert outcome.results_uri == runs.join(fleet.uri, "items", item_id, "results", attempt)
        assert outcome.started_at <= outcome.ended_at  # type: ignore[operator]
        # the job saw its item (JSON for a dict) and id, in its own item folder
        assert fleet.result(item_id, attempt, "item.txt") == workqueue.item_text(item)
        assert fleet.result(item_id, attempt, "id.txt") == item_id
        assert fleet.attempts(item_id) == [attempt]
        status = fleet.status(item_id, attempt)
        assert status is not None and status.state == runs.SUCCEEDED and status.instance_id == attempt
        assert f"item {item_id}: {workqueue.item_text(item)}" in fleet.log(item_id, attempt)
    # the failing item: two attempts (its message delivered twice), then failed for good, dead-lettered
    bad = ids[2]
    failed = fleet.outcome(bad)
    assert failed is not None and failed.state == workqueue.FAILED and failed.exit_code == 3, failed
    assert failed.attempts == 2 and failed.attempt == workqueue.attempt_name(worker.iid, 2)
    tries = [workqueue.attempt_name(worker.iid, n) for n in (1, 2)]
    assert fleet.attempts(bad) == tries
    assert all((fleet.status(bad, t) or runs.RunStatus("?", t)).state == runs.FAILED for t in tries)
    assert [workqueue.decode_message(b)[0] for b in fleet.dead_letters()] == [bad]
    assert fleet.counts() == (0, 0)  # nothing left in the queue
    assert sorted(record.items) == sorted([*(workqueue.attempt_name(worker.iid, 1) for _ in ids), tries[1]])
    assert fleet.folder.list(workqueue.DUPLICATES_PREFIX + "/") == []


def test_two_workers_split_the_queue_without_running_an_item_twice(fleets: Any) -> None:
    fleet = fleets(empty_polls=5, env={"ITEM_SLEEP": "0.5"})
    first, second = fleet.worker(), fleet.worker()
    # both are polling before there is work, so both get some
    wait_for("both workers to start", lambda: first.record() and second.record())
    ids = fleet.send([f"item-{n}" for n in range(6)])
    records = [first.wait(), second.wait()]
    by_worker: dict[str, list[str]] = {first.iid: [], second.iid: []}
    for item_id in ids:
        outcome = fleet.outcome(item_id)
        assert outcome is not None and outcome.state == workqueue.SUCCEEDED and outcome.attempts == 1
        assert fleet.attempts(item_id) == [outcome.attempt]  # run once, by one worker
        by_worker[outcome.instance_id].append(item_id)
    for worker, record in zip((first, second), records, strict=True):
        assert record.state == "left" and by_worker[worker.iid], f"{worker.iid} did no work"
        # a worker's record lists the attempts it ran: one per item it got
        assert record.items == [workqueue.attempt_name(worker.iid, 1)] * len(by_worker[worker.iid])
    assert fleet.folder.list(workqueue.DUPLICATES_PREFIX + "/") == []
    assert fleet.counts() == (0, 0)


def test_item_with_an_outcome_is_not_run_again(fleets: Any) -> None:
    fleet = fleets()
    earlier = ItemOutcome("0000", workqueue.SUCCEEDED, "i-earlier.1", "i-earlier", exit_code=0)
    fleet.folder.put_text(workqueue.outcome_key("0000"), earlier.to_json())
    ids = fleet.send(["done before", "new"])
    worker = fleet.worker()
    record = worker.wait()
    assert fleet.outcome(ids[0]) == earlier  # untouched
    assert fleet.item(ids[0]).list() == []  # never run
    assert record.items == [workqueue.attempt_name(worker.iid, 1)]
    new = fleet.outcome(ids[1])
    assert new is not None and new.state == workqueue.SUCCEEDED
    assert fleet.counts() == (0, 0) and fleet.dead_letters() == []  # its message deleted


def test_interrupted_item_is_sent_again_and_resumes_from_its_checkpoint(
    fleets: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    """A spot notice stops the item (its checkpoint synced); the item goes back to the queue as a new
    message (``interruptions`` 1, not a used-up attempt) and the worker stops without powering off.
    The next worker restores the checkpoint: the job goes on from the step it had reached."""
    command = f"{sys.executable} {STEPS_JOB} 10 1 0.3"
    fleet = fleets(command=command, checkpoint_interval_s=0.5, max_item_attempts=1)
    (item_id,) = fleet.send(["train"])
    poweroff = tmp_path / "powered-off"
    first = fleet.worker(poweroff=poweroff)
    attempt = workqueue.attempt_name(first.iid, 1)
    wait_for("step 2", lambda: "step 2 at" in fleet.log(item_id, attempt), timeout=90)
    metadata.set_spot_action(first.iid, "terminate", at=time.time() + 60)
    record = first.wait()
    assert record.state == "interrupted" and record.items == [attempt] and not poweroff.exists()
    stopped = fleet.status(item_id, attempt)
    assert stopped is not None and stopped.state == runs.INTERRUPTED, stopped
    assert stopped.interruption and stopped.interruption["kind"] == "spot"
    saved = stopped.interruption["checkpoint_step"]
    assert fleet.outcome(item_id) is None and fleet.dead_letters() == []
    assert fleet.counts() == (1, 0)  # sent again
    second = fleet.worker()
    assert second.wait().state == "left"
    outcome = fleet.outcome(item_id)
    resumed = workqueue.attempt_name(second.iid, 1)
    assert outcome is not None and outcome.state == workqueue.SUCCEEDED, outcome
    # a fresh delivery: the interruption did not use up the single attempt allowed
    assert (outcome.attempt, outcome.attempts, outcome.interruptions) == (resumed, 1, 1)
    log = fleet.log(item_id, resumed)
    assert f"resumed from step {saved} restarts=1" in log, log
    assert f"step {saved + 1} at" in log and f"step {saved} at" not in log
    assert json.loads(fleet.result(item_id, resumed, "final.json") or "{}") == {"step": 10}
    status = fleet.status(item_id, resumed)
    assert status is not None and status.restored_step == saved


def test_heartbeats_keep_a_long_item_leased(fleets: Any) -> None:
    """Lease 2 s, renewed every 0.5 s; the item runs ~5 s. A second worker polling all the while
    never gets it (without the renewals it would reappear after 2 s)."""
    fleet = fleets(lease_s=2, heartbeat_s=0.5, empty_polls=3, env={"ITEM_SLEEP": "5"})
    (item_id,) = fleet.send(["long"])
    first = fleet.worker()
    attempt = workqueue.attempt_name(first.iid, 1)

    def running() -> bool:
        status = fleet.status(item_id, attempt)
        return status is not None and status.state == runs.RUNNING

    wait_for("the item to run", running)
    second = fleet.worker()
    wait_for("the second worker to poll", second.record)
    assert second.wait().items == []
    assert first.wait().items == [attempt]
    outcome = fleet.outcome(item_id)
    assert outcome is not None and outcome.state == workqueue.SUCCEEDED and outcome.attempts == 1
    assert fleet.attempts(item_id) == [attempt]
    assert fleet.folder.list(workqueue.DUPLICATES_PREFIX + "/") == []


def test_worker_in_an_auto_scaling_group_leaves_it(fleets: Any, tmp_path: Path) -> None:
    """Protected from scale-in while it has work; once the queue is empty it takes the protection off
    and terminates itself through the group with the desired capacity decremented (no power-off)."""
    ec2, autoscaling = boto3.client("ec2"), boto3.client("autoscaling")
    name = f"ct-group-{uuid.uuid4().hex[:8]}"
    ec2.create_launch_template(  # any image id: nothing boots (describe_images takes moto 5 s)
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": name},
        MinSize=0,
        MaxSize=3,
        DesiredCapacity=1,
        AvailabilityZones=["us-east-1a"],
    )

    def group() -> dict[str, Any]:
        return autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]

    (member,) = [i["InstanceId"] for i in group()["Instances"]]
    fleet = fleets(group=name, env={"ITEM_SLEEP": "2"})
    (item_id,) = fleet.send(["in a group"])
    poweroff = tmp_path / "powered-off"
    worker = fleet.worker(iid=member, poweroff=poweroff)

    def protected() -> bool:
        found = autoscaling.describe_auto_scaling_instances(InstanceIds=[member])["AutoScalingInstances"]
        return bool(found) and found[0]["ProtectedFromScaleIn"]

    wait_for("scale-in protection while busy", protected)
    record = worker.wait()
    assert record.state == "left" and not poweroff.exists()  # the group ends it, not a power-off
    outcome = fleet.outcome(item_id)
    assert outcome is not None and outcome.state == workqueue.SUCCEEDED and outcome.instance_id == member
    assert group()["DesiredCapacity"] == 0 and group()["Instances"] == []  # left, not replaced
    assert autoscaling.describe_auto_scaling_instances(InstanceIds=[member])["AutoScalingInstances"] == []
    reservations = ec2.describe_instances(InstanceIds=[member])["Reservations"]
    assert reservations[0]["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")


class _FakeQueue:
    """A queue backend with the worker's methods, recording the calls (no SQS)."""

    def __init__(self, leases: list[Lease]) -> None:
        self.leases, self.calls = leases, []

    def receive(self) -> Lease | None:
        return self.leases.pop(0) if self.leases else None

    def extend(self, lease: Lease) -> None:
        pass

    def done(self, lease: Lease) -> None:
        self.calls.append(("done", lease.handle))

    def release_now(self, lease: Lease) -> None:
        self.calls.append(("release_now", lease.handle))

    def requeue(self, lease: Lease, body: str) -> None:
        self.calls.append(("requeue", lease.handle, workqueue.decode_message(body)))

    def to_dead_letter(self, lease: Lease) -> None:
        self.calls.append(("to_dead_letter", lease.handle))


class _FakeGroup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def protect(self) -> None:
        self.calls.append("protect")

    def unprotect_and_leave(self) -> None:
        self.calls.append("leave")


def test_sigterm_stops_the_running_item_and_the_worker(
    fleets: Any, metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (``stop_for_signal``, what the cli's handler calls) stops the item's job like a notice;
    the item goes back with ``interruptions`` 1, no further item is taken, and the worker neither
    leaves its group nor powers off. The queue and group are stand-ins with the backends' methods."""
    fleet = fleets(env={"ITEM_SLEEP": "120"})
    iid = f"i-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata.endpoint_for(iid))
    bodies = [workqueue.encode_message(n, f"item {n}") for n in ("0000", "0001")]
    queue, group = _FakeQueue([Lease(b, 1, f"h{n}") for n, b in enumerate(bodies)]), _FakeGroup()
    poweroff = tmp_path / "powered-off"
    worker = InProcessWorker(
        fleet.folder, fleet.spec, iid, str(tmp_path / "work"), f"touch '{poweroff}'", queue, group
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    attempt = workqueue.attempt_name(iid, 1)

    def running() -> bool:
        status = fleet.status("0000", attempt)
        return status is not None and status.state == runs.RUNNING

    wait_for("the item to run", running)
    worker.stop_for_signal("SIGTERM")
    thread.join(60)
    assert not thread.is_alive(), "the worker did not stop"
    status = fleet.status("0000", attempt)
    assert status is not None and status.state == runs.INTERRUPTED and "SIGTERM" in status.message
    assert queue.calls == [("requeue", "h0", ("0000", "item 0000", 1))]
    assert len(queue.leases) == 1  # the next item was never taken
    assert group.calls == ["protect"] and not poweroff.exists()
    record = WorkerRecord.from_json(fleet.folder.get_text(workqueue.worker_key(iid)) or "{}")
    assert record.state == "interrupted" and record.items == [attempt]
    assert fleet.outcome("0000") is None

"""The agent's worker mode for real, on both clouds: agent subprocesses (``python -m
airflow_cloudtrain.agent``) taking items from an SQS queue (moto server) or a Pub/Sub subscription (the
emulator's ``PubSubServer``, through the real GAPIC clients over REST) and writing to an S3 or GCS run
folder, with the emulator's metadata server as their IMDS / GCE metadata server.

What a user checks, on each provider (the ``provider`` parameter): every item has exactly one
``outcomes/<id>.json`` and its job saw its item; a failing item is retried up to
``max_item_attempts``, then its outcome is ``failed`` and its message is dead-lettered; an interrupted
(spot notice / preemption) item is sent again and resumes from its checkpoint on the next worker;
heartbeats keep a long item's lease. Then per provider: two workers split a queue without running an
item twice and an item that already has its outcome is not run again (SQS); a worker in an Auto Scaling
group / a managed instance group leaves it instead of powering off; a deleted subscription ends the
worker; ``PubSubQueue`` / ``ManagedInstanceGroup`` alone, in process. Every wait is on a condition with
a deadline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from agent_processes import start_agent
from waiting import wait_for

from airflow_cloudtrain.agent.queue_pubsub import (
    COMPUTE_ENDPOINT_ENV,
    PUBSUB_ENDPOINT_ENV,
    PubSubQueue,
)
from airflow_cloudtrain.agent.queue_sqs import Lease, QueueGone
from airflow_cloudtrain.agent.worker import Worker as InProcessWorker
from airflow_cloudtrain.contract import runs, workqueue
from airflow_cloudtrain.contract.workqueue import ItemOutcome, WorkerRecord, WorkerSettings
from airflow_cloudtrain.emulator.gcp.gcs import GcsServer
from airflow_cloudtrain.emulator.gcp.pubsub import PubSubServer
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.storage import RunFolder, open_run_folder

REPO = Path(__file__).resolve().parents[2]
STEPS_JOB = Path(__file__).resolve().parent / "jobs" / "steps.py"
LAYOUTS_JOB = STEPS_JOB.with_name("layouts.py")
PROJECT = "cloudtrain-emulated"
GCS_BUCKET = "cloudtrain-worker-gcp"
FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.5, "metadata_poll_s": 0.3}
PROVIDERS = ["aws", "gcp"]

# The job: says which item it got (log and output files); an item with "fail" in it exits 3. With
# ITEM_HOLD_UNTIL=<path> it then waits for that file: a test that looks at a busy worker cannot lose
# the race to the item ending first on a loaded machine.
ITEM_JOB = r"""echo "item $CLOUDTRAIN_ITEM_ID: $CLOUDTRAIN_WORK_ITEM"
printf '%s' "$CLOUDTRAIN_WORK_ITEM" > "$CLOUDTRAIN_OUTPUT_DIR/item.txt"
printf '%s' "$CLOUDTRAIN_ITEM_ID" > "$CLOUDTRAIN_OUTPUT_DIR/id.txt"
case "$CLOUDTRAIN_WORK_ITEM" in *fail*) echo failing; exit 3;; esac
sleep "${ITEM_SLEEP:-0}"
if [ -n "$ITEM_HOLD_UNTIL" ]; then while [ ! -e "$ITEM_HOLD_UNTIL" ]; do sleep 0.1; done; fi
"""


def _pubsub_kwargs(endpoint: str) -> dict[str, Any]:
    from google.auth.credentials import AnonymousCredentials

    return {
        "transport": "rest",
        "credentials": AnonymousCredentials(),
        "client_options": {"api_endpoint": endpoint},
    }


class PubSub:
    """A PubSubServer and the real clients pointed at it."""

    def __init__(self, deadline_scale: float = 1.0) -> None:
        from google import pubsub_v1

        self.server = PubSubServer(project=PROJECT, deadline_scale=deadline_scale)
        self.endpoint = self.server.start()
        self.publisher = pubsub_v1.PublisherClient(**_pubsub_kwargs(self.endpoint))
        self.subscriber = pubsub_v1.SubscriberClient(**_pubsub_kwargs(self.endpoint))

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsServer]:
    """The run folders' storage; the test process and the agents reach it by STORAGE_EMULATOR_HOST."""
    server = GcsServer()
    server.start()
    server.create_bucket(GCS_BUCKET)
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ.update(server.env())
    yield server
    if saved is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = saved
    server.stop()


@pytest.fixture(scope="module")
def pubsub() -> Iterator[PubSub]:
    emulated = PubSub()
    yield emulated
    emulated.stop()


class Worker:
    """One worker: an agent process on the fleet's run folder, as its own instance (EC2 id / VM name)."""

    def __init__(self, fleet: Fleet, iid: str | None, poweroff: Path | None, env: dict[str, str]) -> None:
        self.fleet = fleet
        self.iid = iid or fleet.new_instance_id()
        self.poweroff = poweroff
        env = {
            **os.environ,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": fleet.md.endpoint_for(self.iid),
            "GCE_METADATA_HOST": fleet.md.gce_host_for(self.iid),
            **fleet.agent_env(),
            **env,
        }
        argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", fleet.uri]
        argv += ["--instance-id", self.iid, "--workdir", str(fleet.tmp / self.iid)]
        if poweroff is not None:
            argv += ["--poweroff", f"touch '{poweroff}'"]
        self.proc = start_agent(argv, REPO, env)
        self.stderr = ""

    def wait(self, timeout: float = 120.0) -> WorkerRecord:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
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
    """A fleet's run folder (spec with ``worker``) and what a user reads in it; the queue is the
    provider's (``SqsFleet``, ``PubSubFleet``)."""

    provider = ""
    cloud = ""
    interruption_kind = ""  # what the status of an interrupted item says

    def __init__(
        self, uri: str, md: MetadataServer, tmp: Path, command: str, queue: dict[str, Any], **settings: Any
    ) -> None:
        self.uri, self.md, self.tmp = uri, md, tmp
        self.folder = open_run_folder(self.uri)
        spec_fields = {k: settings.pop(k) for k in list(settings) if k in runs.RunSpec.__dataclass_fields__}
        self.settings = WorkerSettings(
            provider=self.provider,
            **queue,
            **{"lease_s": 30, "heartbeat_s": 1.0, "wait_s": 1, "empty_polls": 2, **settings},
        )
        self.spec = runs.RunSpec(
            run_id="ct-fleet",
            run_uri=self.uri,
            cloud=self.cloud,
            command=command,
            worker=self.settings.to_dict(),
            **{**FAST, **spec_fields},
        )
        self.folder.put_text(runs.SPEC_KEY, self.spec.to_json())
        self.workers: list[Worker] = []

    # -- the provider's side
    def new_instance_id(self) -> str:
        raise NotImplementedError

    def agent_env(self) -> dict[str, str]:
        return {}

    def send(self, items: list[Any]) -> list[str]:
        raise NotImplementedError

    def unfinished(self) -> int:
        """Messages of the work queue not yet done with (waiting or leased)."""
        raise NotImplementedError

    def dead_letters(self) -> list[str]:
        raise NotImplementedError

    def interrupt(self, iid: str) -> None:
        """The cloud's notice that it takes this worker's instance (spot / preemption)."""
        raise NotImplementedError

    # -- the run folder
    def worker(
        self, iid: str | None = None, poweroff: Path | None = None, env: dict[str, str] | None = None
    ) -> Worker:
        worker = Worker(self, iid, poweroff, env or {})
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


class SqsFleet(Fleet):
    """An SQS work queue and dead-letter queue, an S3 run folder."""

    provider, cloud, interruption_kind = "aws", "ec2spot", "spot"

    def __init__(
        self, s3: Any, md: MetadataServer, tmp: Path, command: str = ITEM_JOB, **settings: Any
    ) -> None:
        self.sqs = boto3.client("sqs")
        name = uuid.uuid4().hex[:10]
        self.queue = self.sqs.create_queue(QueueName=f"ct-{name}")["QueueUrl"]
        self.dlq = self.sqs.create_queue(QueueName=f"ct-{name}-dlq")["QueueUrl"]
        queue = {"queue": self.queue, "dead_letter": self.dlq, "region": "us-east-1"}
        super().__init__(f"s3://{s3.bucket}/runs/fleet/{name}/-1", md, tmp, command, queue, **settings)

    def new_instance_id(self) -> str:
        return f"i-{uuid.uuid4().hex[:12]}"

    def send(self, items: list[Any]) -> list[str]:
        ids = workqueue.item_ids(len(items))
        for item_id, item in zip(ids, items, strict=True):
            body = workqueue.encode_message(item_id, workqueue.item_text(item))
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=body)
        return ids

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

    def unfinished(self) -> int:
        return sum(self.counts())

    def dead_letters(self) -> list[str]:
        got = self.sqs.receive_message(QueueUrl=self.dlq, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        return [m["Body"] for m in got.get("Messages", [])]

    def interrupt(self, iid: str) -> None:
        self.md.set_spot_action(iid, "terminate", at=time.time() + 60)


class PubSubFleet(Fleet):
    """A Pub/Sub topic + subscription and dead-letter topic (with a subscription of its own, to read
    what was dead-lettered), a GCS run folder."""

    provider, cloud, interruption_kind = "gcp", "gcspot", "preemption"

    def __init__(
        self,
        pubsub: PubSub,
        md: MetadataServer,
        tmp: Path,
        command: str = ITEM_JOB,
        dead_letter_policy: bool = True,
        **settings: Any,
    ) -> None:
        self.pubsub = pubsub
        name = f"ct-{uuid.uuid4().hex[:10]}"
        self.topic = f"projects/{PROJECT}/topics/{name}"
        self.dlq_topic = f"{self.topic}-dlq"
        self.subscription = f"projects/{PROJECT}/subscriptions/{name}"
        self.dlq_subscription = f"{self.subscription}-dlq"
        publisher, subscriber = pubsub.publisher, pubsub.subscriber
        publisher.create_topic(name=self.topic)
        publisher.create_topic(name=self.dlq_topic)
        subscriber.create_subscription(name=self.dlq_subscription, topic=self.dlq_topic)
        request: dict[str, Any] = {"name": self.subscription, "topic": self.topic, "ack_deadline_seconds": 30}
        if dead_letter_policy:  # as the operator creates it: deliveryAttempt is counted only with one
            request["dead_letter_policy"] = {"dead_letter_topic": self.dlq_topic, "max_delivery_attempts": 5}
        subscriber.create_subscription(request=request)
        queue = {
            "queue": self.subscription,
            "dead_letter": self.dlq_topic,
            "topic": self.topic,
            "project": PROJECT,
        }
        super().__init__(f"gs://{GCS_BUCKET}/runs/fleet/{name}/-1", md, tmp, command, queue, **settings)

    def new_instance_id(self) -> str:
        return f"ct-w-{uuid.uuid4().hex[:10]}"

    def agent_env(self) -> dict[str, str]:
        return {PUBSUB_ENDPOINT_ENV: self.pubsub.endpoint}

    def send(self, items: list[Any]) -> list[str]:
        from google.pubsub_v1 import PubsubMessage

        ids = workqueue.item_ids(len(items))
        messages = [
            PubsubMessage(data=workqueue.encode_message(item_id, workqueue.item_text(item)).encode())
            for item_id, item in zip(ids, items, strict=True)
        ]
        self.pubsub.publisher.publish(topic=self.topic, messages=messages)
        return ids

    def unfinished(self) -> int:
        backlog = self.pubsub.server.subscription_backlog(self.subscription)
        assert backlog is not None
        return backlog

    def dead_letters(self) -> list[str]:
        got = self.pubsub.subscriber.pull(subscription=self.dlq_subscription, max_messages=10)
        return [bytes(m.message.data).decode() for m in got.received_messages]

    def interrupt(self, iid: str) -> None:
        self.md.set_preempted(iid)


@pytest.fixture
def fleets(request: pytest.FixtureRequest, metadata: MetadataServer, tmp_path: Path) -> Iterator[Any]:
    """Makes fleets: ``fleets("aws", ...)`` on SQS/S3, ``fleets("gcp", on=None, ...)`` on the module's
    Pub/Sub (unless given another) and GCS. Workers still running at the end are killed."""
    made: list[Fleet] = []

    def make(provider: str = "aws", on: PubSub | None = None, **kwargs: Any) -> Fleet:
        fleet: Fleet
        if provider == "aws":
            fleet = SqsFleet(request.getfixturevalue("s3"), metadata, tmp_path, **kwargs)
        else:
            request.getfixturevalue("gcs")
            fleet = PubSubFleet(on or request.getfixturevalue("pubsub"), metadata, tmp_path, **kwargs)
        made.append(fleet)
        return fleet

    yield make
    for fleet in made:
        for worker in fleet.workers:
            worker.kill()


# -- the worker process, on both clouds ------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_worker_runs_each_item_once_retries_failures_then_powers_off(
    fleets: Any, tmp_path: Path, provider: str
) -> None:
    fleet = fleets(provider, max_item_attempts=2)
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
    # the failing item: two attempts (delivered twice: SQS's receive count, Pub/Sub's deliveryAttempt),
    # then failed for good, dead-lettered
    bad = ids[2]
    failed = fleet.outcome(bad)
    assert failed is not None and failed.state == workqueue.FAILED and failed.exit_code == 3, failed
    assert failed.attempts == 2 and failed.attempt == workqueue.attempt_name(worker.iid, 2)
    tries = [workqueue.attempt_name(worker.iid, n) for n in (1, 2)]
    assert fleet.attempts(bad) == tries
    assert all((fleet.status(bad, t) or runs.RunStatus("?", t)).state == runs.FAILED for t in tries)
    assert [workqueue.decode_message(b)[0] for b in fleet.dead_letters()] == [bad]
    assert fleet.unfinished() == 0  # every message done with
    assert sorted(record.items) == sorted([*(workqueue.attempt_name(worker.iid, 1) for _ in ids), tries[1]])
    assert fleet.folder.list(workqueue.DUPLICATES_PREFIX + "/") == []
    assert "the queue is done" in worker.stderr


@pytest.mark.parametrize("provider", PROVIDERS)
def test_interrupted_item_is_sent_again_and_resumes_from_its_checkpoint(
    fleets: Any, tmp_path: Path, provider: str
) -> None:
    """A spot notice / preemption stops the item (its checkpoint synced); the item goes back to the
    queue as a new message (``interruptions`` 1, not a used-up attempt) and the worker stops without
    powering off. The next worker restores the checkpoint: the job goes on from the step it had reached."""
    command = f"{sys.executable} {STEPS_JOB} 10 1 0.3"
    fleet = fleets(provider, command=command, checkpoint_interval_s=0.5, max_item_attempts=1)
    (item_id,) = fleet.send(["train"])
    poweroff = tmp_path / "powered-off"
    # the first delivery holds after step 5 until it is stopped: on a busy machine the notice must not
    # lose the race to the item finishing first (steps.py's STEPS_HOLD_AT, first delivery only)
    first = fleet.worker(poweroff=poweroff, env={"STEPS_HOLD_AT": "5"})
    attempt = workqueue.attempt_name(first.iid, 1)
    wait_for(lambda: "step 2 at" in fleet.log(item_id, attempt), message="step 2")
    fleet.interrupt(first.iid)
    record = first.wait()
    assert record.state == "interrupted" and record.items == [attempt] and not poweroff.exists()
    stopped = fleet.status(item_id, attempt)
    assert stopped is not None and stopped.state == runs.INTERRUPTED, stopped
    assert stopped.interruption and stopped.interruption["kind"] == fleet.interruption_kind
    saved = stopped.interruption["checkpoint_step"]
    assert fleet.outcome(item_id) is None and fleet.dead_letters() == []
    assert fleet.unfinished() == 1  # sent again, the interrupted delivery done with
    if provider == "aws":
        assert fleet.counts() == (1, 0)  # waiting, not in flight
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
    assert fleet.unfinished() == 0


def test_interrupted_item_resumes_from_its_newest_framework_checkpoint(fleets: Any, tmp_path: Path) -> None:
    """Fleet items follow the checkpoint layouts too: an item whose job saves the way the Hugging Face
    Trainer does (``checkpoint-N/``, ``trainer_state.json`` last) is stopped mid-item; the next
    delivery restores that item's newest complete ``checkpoint-N/`` and the Trainer's own rule
    (``get_last_checkpoint``) resumes from a step the first delivery saved."""
    hold = tmp_path / "hold"  # the first delivery cannot finish before the notice lands
    command = f"{sys.executable} -S {LAYOUTS_JOB} huggingface 12 2 0.2"
    fleet = fleets("aws", command=command, checkpoint_interval_s=0.5, max_item_attempts=1)
    (item_id,) = fleet.send(["train"])
    first = fleet.worker(env={"LAYOUTS_HOLD_AT_END": str(hold)})
    attempt = workqueue.attempt_name(first.iid, 1)
    wait_for(lambda: "saved 4 at" in fleet.log(item_id, attempt), message="checkpoint-4 saved")
    fleet.interrupt(first.iid)
    assert first.wait().state == "interrupted"
    # the steps it began to save (a stop may land after the Trainer's last write, before "saved N")
    saved = {int(m) for m in re.findall(r"\bsaving (\d+)", fleet.log(item_id, attempt))}
    stopped = fleet.status(item_id, attempt)
    assert stopped is not None and stopped.interruption, stopped
    kept = stopped.interruption["checkpoint_step"]
    assert kept in saved and kept >= 4, (kept, saved)
    hold.touch()
    second = fleet.worker(env={"LAYOUTS_HOLD_AT_END": str(hold)})
    assert second.wait().state == "left"
    resumed = workqueue.attempt_name(second.iid, 1)
    outcome = fleet.outcome(item_id)
    assert outcome is not None and outcome.state == workqueue.SUCCEEDED, outcome
    log = fleet.log(item_id, resumed)
    # the Trainer's own rule found it and every byte of it loaded (a torn one prints CORRUPT)
    assert re.search(rf"resumed from step {kept}\b", log) and "CORRUPT" not in log, log
    assert json.loads(fleet.result(item_id, resumed, "result.json") or "{}") == {
        "resumed_from": kept,
        "step": 12,
    }
    status = fleet.status(item_id, resumed)
    assert status is not None and status.restored_step == kept


@pytest.mark.parametrize("provider", PROVIDERS)
def test_heartbeats_keep_a_long_item_leased(fleets: Any, provider: str) -> None:
    """A lease that runs out after 2 s, renewed every 0.5 s; the item runs ~5 s. A second worker polling
    all the while never gets it (without the renewals it would be delivered again after 2 s). SQS: a
    2 s visibility timeout. Pub/Sub: ack deadlines on a server whose deadlines last a fifth of their
    seconds, so the 10 s lease (Pub/Sub's minimum) runs out after 2 s.

    That holds while every renewal reaches the queue within the lease: on a machine starved enough
    (a doubled suite on 2 cores) it may not, and the item may then run twice, with one outcome (the
    product's promise). The first worker's record says which: its longest gap between calls."""
    scaled = PubSub(deadline_scale=0.2) if provider == "gcp" else None
    try:
        lease = {"lease_s": 10, "empty_polls": 4} if scaled else {"lease_s": 2, "empty_polls": 3}
        fleet = fleets(provider, on=scaled, heartbeat_s=0.5, env={"ITEM_SLEEP": "5"}, **lease)
        (item_id,) = fleet.send(["long"])
        first = fleet.worker()
        attempt = workqueue.attempt_name(first.iid, 1)

        def running() -> bool:
            status = fleet.status(item_id, attempt)
            return status is not None and status.state == runs.RUNNING

        wait_for(running, message="the item to run")
        second = fleet.worker()
        wait_for(second.record, message="the second worker to poll")
        others = second.wait().items
        record = first.wait()
        assert record.items == [attempt]
        gap = record.longest_lease_gap_s
        assert gap is not None and gap >= 0.5  # measured: at least a heartbeat between two calls
        outcome = fleet.outcome(item_id)
        assert outcome is not None and outcome.state == workqueue.SUCCEEDED
        assert fleet.unfinished() == 0
        if scaled:
            assert scaled.server.counts().get("subscriptions.modifyAckDeadline", 0) >= 5  # the renewals
        if gap < 2.0:  # every call reached the queue within the lease: it was never delivered again
            assert others == [], gap
            assert outcome.attempts == 1
            assert fleet.attempts(item_id) == [attempt]
            assert fleet.folder.list(workqueue.DUPLICATES_PREFIX + "/") == []
        else:  # the lease ran out under load: at most one more run, its result a duplicate or the one
            assert len(others) <= 1, (gap, others)
    finally:
        if scaled:
            scaled.stop()


# -- SQS and Auto Scaling ------------------------------------------------------------------------------


def test_two_workers_split_the_queue_without_running_an_item_twice(fleets: Any) -> None:
    fleet = fleets(empty_polls=5, env={"ITEM_SLEEP": "0.5"})
    first, second = fleet.worker(), fleet.worker()
    # both are polling before there is work, so both get some
    wait_for(lambda: first.record() and second.record(), message="both workers to start")
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


def test_worker_in_an_auto_scaling_group_leaves_it(fleets: Any, s3: Any, tmp_path: Path) -> None:
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
    release = tmp_path / "release"  # the item runs until the test has seen its worker protected
    fleet = fleets(group=name, env={"ITEM_HOLD_UNTIL": str(release)})
    (item_id,) = fleet.send(["in a group"])
    poweroff = tmp_path / "powered-off"
    worker = fleet.worker(iid=member, poweroff=poweroff)

    def protected() -> bool:
        found = autoscaling.describe_auto_scaling_instances(InstanceIds=[member])["AutoScalingInstances"]
        return bool(found) and found[0]["ProtectedFromScaleIn"]

    wait_for(protected, message="scale-in protection while busy")
    release.touch()
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

    wait_for(running, message="the item to run")
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


# -- Pub/Sub and managed instance groups ------------------------------------------------------------


def test_deleted_subscription_ends_the_worker(fleets: Any, tmp_path: Path) -> None:
    """The fleet is over when its subscription is gone (NotFound: ``QueueGone``): the worker leaves at
    once, however many empty pulls it would otherwise wait for."""
    fleet = fleets("gcp", empty_polls=10_000)
    poweroff = tmp_path / "powered-off"
    worker = fleet.worker(poweroff=poweroff)
    wait_for(worker.record, message="the worker to poll")
    fleet.pubsub.subscriber.delete_subscription(subscription=fleet.subscription)
    record = worker.wait(timeout=60)
    assert record.state == "left" and record.items == [] and poweroff.exists()
    assert "the queue is gone" in worker.stderr


GROUP_ZONE = "us-central1-a"


def holds(what: str, check: Callable[[], Any], for_s: float) -> None:
    """``check()`` stays true for ``for_s`` seconds (asked every 0.1 s)."""
    until = time.monotonic() + for_s
    while time.monotonic() < until:
        assert check(), f"no longer true: {what}"
        time.sleep(0.1)


def test_worker_in_a_managed_instance_group_leaves_it(fleets: Any, tmp_path: Path) -> None:
    """Once the subscription stays empty, the worker (a member of a one-VM group) leaves through
    ``deleteInstances``: the group's target size drops to 0, its VM is deleted and never recreated
    (a VM that ends any other way is recreated by the group), and nothing is powered off."""
    from google.api_core.exceptions import NotFound
    from google.cloud import compute_v1

    from airflow_cloudtrain.emulator.gcp.gce import GceServer, compute_client_kwargs

    gce = GceServer(project=PROJECT, provision_s=0.05, boot_s=0.05, delete_after_s=0.3, recreate_s=0.3)
    endpoint = gce.start()
    try:
        kwargs = compute_client_kwargs(endpoint)
        templates = compute_v1.InstanceTemplatesClient(**kwargs)
        groups = compute_v1.InstanceGroupManagersClient(**kwargs)
        instances = compute_v1.InstancesClient(**kwargs)
        name = f"ct-mig-{uuid.uuid4().hex[:8]}"
        properties = {
            "machineType": "n1-standard-4",
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": "projects/debian-cloud/global/images/family/debian-12"
                    },
                }
            ],
            "networkInterfaces": [{"network": "global/networks/default"}],
        }
        template = compute_v1.InstanceTemplate.from_json(json.dumps({"name": name, "properties": properties}))
        templates.insert(project=PROJECT, instance_template_resource=template).result(timeout=120)
        manager = compute_v1.InstanceGroupManager(
            name=name,
            base_instance_name=name,
            instance_template=f"global/instanceTemplates/{name}",
            target_size=1,
        )
        groups.insert(project=PROJECT, zone=GROUP_ZONE, instance_group_manager_resource=manager).result(
            timeout=120
        )

        def group() -> compute_v1.InstanceGroupManager:
            return groups.get(project=PROJECT, zone=GROUP_ZONE, instance_group_manager=name)

        def members() -> list[str]:
            found = groups.list_managed_instances(
                project=PROJECT, zone=GROUP_ZONE, instance_group_manager=name
            )
            return [m.instance.rsplit("/", 1)[-1] for m in found]

        def vm_status(vm: str) -> str | None:
            try:
                return str(instances.get(project=PROJECT, zone=GROUP_ZONE, instance=vm).status)
            except NotFound:
                return None

        (member,) = wait_for(members, message="the group's VM")
        wait_for(lambda: vm_status(member) == "RUNNING", message="its VM to run")
        fleet = fleets("gcp", group=name, zone=GROUP_ZONE, env={"ITEM_SLEEP": "1"})
        (item_id,) = fleet.send(["in a group"])
        poweroff = tmp_path / "powered-off"
        worker = fleet.worker(iid=member, poweroff=poweroff, env={COMPUTE_ENDPOINT_ENV: endpoint})
        record = worker.wait()
        assert record.state == "left" and not poweroff.exists(), worker.stderr[-3000:]  # the group ends it
        assert f"left group {name}" in worker.stderr
        outcome = fleet.outcome(item_id)
        assert outcome is not None and outcome.state == workqueue.SUCCEEDED and outcome.instance_id == member
        assert group().target_size == 0
        wait_for(lambda: vm_status(member) is None and not members(), message="the VM to be deleted")
        holds(
            "the group does not recreate it", lambda: vm_status(member) is None and not members(), for_s=2.0
        )
        assert group().target_size == 0
        assert gce.counts().get("instanceGroupManagers.deleteInstances") == 1
        assert not gce.counts().get("instances.delete")  # never behind the group's back
    finally:
        gce.stop()


# -- the classes alone, in process ---------------------------------------------------------------------


@pytest.fixture
def endpoint_env(pubsub: PubSub, monkeypatch: pytest.MonkeyPatch) -> PubSub:
    monkeypatch.setenv(PUBSUB_ENDPOINT_ENV, pubsub.endpoint)
    return pubsub


def _queue(fleet: PubSubFleet, **settings: Any) -> PubSubQueue:
    fields = {**fleet.settings.to_dict(), **settings}
    return PubSubQueue(WorkerSettings.from_dict(fields))


def test_receive_waits_for_work_then_leases_it(fleets: Any, endpoint_env: PubSub) -> None:
    fleet = fleets("gcp", wait_s=2)
    queue = _queue(fleet)
    started = time.monotonic()
    assert queue.receive() is None
    assert time.monotonic() - started >= 1.9  # pulled again within the wait, not one empty answer
    assert queue.depth() == -1  # Pub/Sub has no backlog call
    (item_id,) = fleet.send(["x"])
    lease = queue.receive()
    assert lease is not None and lease.delivery == 1 and lease.message_id
    assert workqueue.decode_message(lease.body) == (item_id, "x", 0)
    queue.release_now(lease)  # a nack: at once, one delivery more
    again = queue.receive()
    assert again is not None and again.delivery == 2 and again.message_id == lease.message_id
    queue.requeue(again, workqueue.encode_message(item_id, "x", 1))  # a new message, counted afresh
    third = queue.receive()
    assert third is not None and third.delivery == 1 and third.message_id != lease.message_id
    assert workqueue.decode_message(third.body) == (item_id, "x", 1)
    queue.to_dead_letter(third)
    assert fleet.dead_letters() == [third.body] and fleet.unfinished() == 0
    queue.done(third)  # a late ack of a lease that is gone: logged, not raised


def test_without_a_dead_letter_policy_deliveries_are_counted_locally(
    fleets: Any, endpoint_env: PubSub
) -> None:
    """No deadLetterPolicy: Pub/Sub sends no deliveryAttempt; the worker counts its own deliveries, so
    ``max_item_attempts`` still ends a failing item."""
    fleet = fleets("gcp", dead_letter_policy=False)
    queue = _queue(fleet)
    fleet.send(["x"])
    deliveries = []
    for _ in range(3):
        lease = queue.receive()
        assert lease is not None
        deliveries.append(lease.delivery)
        queue.release_now(lease)
    assert deliveries == [1, 2, 3]


def test_queue_gone_and_ack_deadlines(fleets: Any, endpoint_env: PubSub) -> None:
    fleet = fleets("gcp")
    calls: list[tuple[str, dict[str, Any]]] = []

    class Recording:
        def modify_ack_deadline(self, **kwargs: Any) -> None:
            calls.append(("modify_ack_deadline", kwargs))

    lease = Lease("{}", 1, "ack-1", "m-1")
    for lease_s, expected in [(5, 10), (300, 300), (3600, 600)]:
        settings = WorkerSettings.from_dict({**fleet.settings.to_dict(), "lease_s": lease_s})
        PubSubQueue(settings, subscriber=Recording()).extend(lease)
        assert calls[-1][1]["ack_deadline_seconds"] == expected and calls[-1][1]["ack_ids"] == ["ack-1"]
    PubSubQueue(fleet.settings, subscriber=Recording()).release_now(lease)
    assert calls[-1][1]["ack_deadline_seconds"] == 0
    queue = _queue(fleet)
    fleet.pubsub.subscriber.delete_subscription(subscription=fleet.subscription)
    with pytest.raises(QueueGone):
        queue.receive()


def test_backends_import_only_their_own_cloud_sdk() -> None:
    """``open_backend``: the AWS worker never imports the Google clients, the GCP worker never boto3."""
    code = r"""
import sys
from airflow_cloudtrain.agent.worker import open_backend
from airflow_cloudtrain.contract.workqueue import WorkerSettings
provider = sys.argv[1]
queue, group = open_backend(WorkerSettings(provider, "q", "dlq", region="us-east-1", group="g", zone="z",
                                           project="p"), "vm-1")
print(type(queue).__name__, type(group).__name__,
      any(m.startswith("google.pubsub") or m.startswith("google.cloud.compute") for m in sys.modules),
      "boto3" in sys.modules)
"""
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    outputs = {}
    for provider in ("aws", "gcp"):
        done = subprocess.run(
            [sys.executable, "-c", code, provider],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        outputs[provider] = done.stdout.split()
    assert outputs["aws"] == ["SqsQueue", "AutoScalingGroup", "False", "True"]
    assert outputs["gcp"] == ["PubSubQueue", "ManagedInstanceGroup", "False", "False"]  # clients made on use

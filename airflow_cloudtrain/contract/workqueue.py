"""The work-queue contract between a fleet operator and its workers: ids, messages, folder keys.

Stdlib only: the agent imports it on the instance (it ships in the agent zip), and both the
``SpotFleetOperator`` (SQS + Auto Scaling) and the ``PreemptibleGroupOperator`` (Pub/Sub + a managed
instance group) use the same layout, so only the queue and the group differ per cloud.

Layout under the fleet's ``run_uri``::

    spec.json                      RunSpec with ``worker`` = WorkerSettings (the fleet, not one job)
    agent/airflow_cloudtrain.zip   the agent (as for single runs)
    code/code.tar.gz               the user's code (as for single runs)
    items/<id>/                    one item = one ordinary run folder: its attempts' status, heartbeat
                                   and log chunks under instances/<attempt>/, its checkpoints under
                                   checkpoints/, its output under results/<attempt>/
    outcomes/<id>.json             ItemOutcome: the item's one result, written once (first writer wins)
    duplicates/<id>/<attempt>.json an ItemOutcome of a run that finished after the item had its result
    workers/<instance-id>.json     WorkerRecord: what each worker did, rewritten as it goes

An attempt is named ``<instance-id>.<delivery>`` (the queue's receive count), so a worker that gets
the same item twice never overwrites its own first try.

A message's body is ``{"id": "0003", "item": "<the CLOUDTRAIN_WORK_ITEM text>", "interruptions": 0}``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cloudtrain.contract.records import load_known

ITEMS_PREFIX = "items"
OUTCOMES_PREFIX = "outcomes"
DUPLICATES_PREFIX = "duplicates"
WORKERS_PREFIX = "workers"

ENV_ITEM = "CLOUDTRAIN_WORK_ITEM"
ENV_ITEM_ID = "CLOUDTRAIN_ITEM_ID"

MAX_MESSAGE_BYTES = 250_000  # SQS takes 256 KiB per message, Pub/Sub 10 MB: one limit for both

# How long one lease on an item may be (``WorkerSettings.lease_s``): at least 10 s on both queues, at
# most SQS's longest visibility timeout (12 h) or Pub/Sub's longest ack deadline (600 s). One number
# each, read where it matters: the fleet operators' ``lease_timeout`` check at DAG parse time
# (``operators.fleet_config``) and the cap the agent's queues put on the lease they ask for
# (``agent.queue_sqs``, ``agent.queue_pubsub``), so a lease the operator accepts is one the queue holds.
MIN_LEASE_S = 10
SQS_MAX_LEASE_S = 12 * 3600
PUBSUB_MAX_LEASE_S = 600

# ItemOutcome.state
SUCCEEDED, FAILED = "succeeded", "failed"


def item_ids(count: int) -> list[str]:
    """Stable ids for ``count`` items: zero-padded positions (``0000``, ``0001``, ...), so a retried
    task with the same list finds the outcomes of the items an earlier try finished."""
    width = max(4, len(str(max(count - 1, 0))))
    return [f"{i:0{width}d}" for i in range(count)]


def item_text(item: Any) -> str:
    """What the job sees as ``CLOUDTRAIN_WORK_ITEM``: a string as is, anything else as JSON."""
    return item if isinstance(item, str) else json.dumps(item, sort_keys=True)


def item_prefix(item_id: str) -> str:
    return f"{ITEMS_PREFIX}/{item_id}"


def outcome_key(item_id: str) -> str:
    return f"{OUTCOMES_PREFIX}/{item_id}.json"


def duplicate_key(item_id: str, attempt: str) -> str:
    return f"{DUPLICATES_PREFIX}/{item_id}/{attempt}.json"


def worker_key(instance_id: str) -> str:
    return f"{WORKERS_PREFIX}/{instance_id}.json"


def attempt_name(instance_id: str, delivery: int) -> str:
    return f"{instance_id}.{delivery}"


def encode_message(item_id: str, text: str, interruptions: int = 0) -> str:
    return json.dumps({"id": item_id, "item": text, "interruptions": interruptions})


def decode_message(body: str) -> tuple[str, str, int]:
    """(id, item text, interruptions so far) from a message body."""
    data = json.loads(body)
    return str(data["id"]), str(data["item"]), int(data.get("interruptions", 0))


@dataclass
class WorkerSettings:
    """``RunSpec.worker``: how a worker finds its queue and group and paces its leases.

    ``queue`` is the SQS queue URL (or Pub/Sub subscription path, ``projects/P/subscriptions/S``);
    ``dead_letter`` the DLQ's URL (or dead-letter topic path); ``topic`` the Pub/Sub topic the
    subscription reads (GCP: where an interrupted item is published again; None on AWS). ``group`` is the Auto Scaling group (or managed instance group) the worker belongs to;
    ``None`` when it runs outside one (it then powers off when the work is done). ``lease_s`` is the
    visibility timeout of one lease, renewed every ``heartbeat_s`` while the item runs; an item
    whose worker vanished reappears after at most ``lease_s``. ``item_timeout_s`` is each item's
    ``max_runtime``. A worker leaves after ``empty_polls`` receives in a row found nothing, each
    waiting up to ``wait_s``.
    """

    provider: str  # "aws" or "gcp"
    queue: str
    dead_letter: str
    region: str | None = None
    group: str | None = None
    zone: str | None = None  # the managed instance group's zone (GCP)
    project: str | None = None
    topic: str | None = None  # the items' Pub/Sub topic path (GCP)
    lease_s: int = 300
    heartbeat_s: float = 60.0
    item_timeout_s: float | None = None
    max_item_attempts: int = 3
    wait_s: int = 5
    empty_polls: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSettings:
        return load_known(cls, data)


@dataclass
class ItemOutcome:
    """An item's result (``outcomes/<id>.json``): which attempt produced it and where its output is."""

    id: str
    state: str  # SUCCEEDED or FAILED (failed for good: its last allowed attempt failed)
    attempt: str  # <instance-id>.<delivery>
    instance_id: str
    exit_code: int | None = None
    message: str = ""
    attempts: int = 1  # deliveries of the item's message (SQS ApproximateReceiveCount)
    interruptions: int = 0  # runs of this item stopped by an interruption
    results_uri: str | None = None
    started_at: float | None = None
    ended_at: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ItemOutcome:
        data = json.loads(text)
        return load_known(cls, data)


@dataclass
class WorkerRecord:
    """``workers/<instance-id>.json``: rewritten by the worker as it goes."""

    instance_id: str
    started_at: float
    state: str = "working"  # working | left | interrupted
    items: list[str] = field(default_factory=list)  # attempts run here
    updated_at: float | None = None
    ended_at: float | None = None
    # the longest an item's lease went without a call reaching the queue, at most (``agent.worker.
    # LeaseGaps``): over the fleet's lease_s, another worker may have run that item too
    longest_lease_gap_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerRecord:
        data = json.loads(text)
        return load_known(cls, data)

"""A fleet's ``lease_timeout`` that the operator accepts at DAG parse time is a lease its queue holds.

The operator checks ``lease_timeout`` when the DAG file is parsed (``operators.fleet_config``); the
worker's queue on the instance caps the lease it asks for (``agent.queue_sqs``: SQS's visibility
timeout; ``agent.queue_pubsub``: Pub/Sub's ack deadline). Were the two numbers apart, a lease the
operator accepted would be cut short on the queue, and an item still running would be delivered to a
second worker. Both read one number per queue from the contract floor (``contract.workqueue``), which
the agent may import: the test checks they agree at the real limits, and that both follow it when it
changes (a copy of it on either side would not).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cloudtrain.agent.queue_pubsub import PubSubQueue
from airflow_cloudtrain.agent.queue_sqs import SqsQueue
from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.workqueue import WorkerSettings
from airflow_cloudtrain.operators import PreemptibleGroupOperator, SpotFleetOperator

ITEMS = ["lr=0.1", "lr=0.01"]


def spot_fleet(lease_timeout: float) -> Any:
    return SpotFleetOperator(
        task_id="fleet", command="python trial.py", bucket="s3://bkt/sweeps", cloud="ec2spot",
        work_items=ITEMS, lease_timeout=lease_timeout, live_prices=False,
    )  # fmt: skip


def preemptible_group(lease_timeout: float) -> Any:
    return PreemptibleGroupOperator(
        task_id="group", command="python trial.py", bucket="gs://bkt/sweeps", work_items=ITEMS,
        project_id="my-project", zone="us-central1-a", lease_timeout=lease_timeout, live_prices=False,
    )  # fmt: skip


def sqs_cap(lease_s: int) -> int:
    settings = WorkerSettings(
        provider="aws", queue="https://sqs/q", dead_letter="https://sqs/dlq", lease_s=lease_s
    )
    return SqsQueue(settings, client=object())._lease_s()  # the VisibilityTimeout each receive asks for


def pubsub_cap(lease_s: int) -> int:
    settings = WorkerSettings(
        provider="gcp", queue="projects/p/subscriptions/s", dead_letter="d", lease_s=lease_s
    )
    return PubSubQueue(settings, subscriber=object(), publisher=object())._lease_s()  # the ack deadline


QUEUES = {
    "sqs": ("SQS_MAX_LEASE_S", spot_fleet, sqs_cap),
    "pubsub": ("PUBSUB_MAX_LEASE_S", preemptible_group, pubsub_cap),
}


def longest_accepted(make: Any, upper: int) -> int:
    """The longest whole-second ``lease_timeout`` the operator accepts at parse time (bisected)."""
    low, high = workqueue.MIN_LEASE_S, upper  # low is accepted; upper is not
    make(low)
    while high - low > 1:
        mid = (low + high) // 2
        try:
            make(mid)
            low = mid
        except ValueError as err:
            assert "lease_timeout" in str(err)
            high = mid
    return low


@pytest.mark.parametrize("changed", [False, True], ids=["as_shipped", "contract_changed"])
@pytest.mark.parametrize("queue", list(QUEUES))
def test_the_parse_time_lease_check_and_the_queue_cap_agree(
    queue: str, changed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, make, cap = QUEUES[queue]
    if changed:  # one source: both sides follow the contract's number
        monkeypatch.setattr(workqueue, name, getattr(workqueue, name) // 2)
    limit = getattr(workqueue, name)
    accepted = longest_accepted(make, 2 * 12 * 3600)
    assert accepted == limit
    with pytest.raises(ValueError, match=f"lease_timeout={accepted + 1}"):
        make(accepted + 1)
    assert cap(accepted) == accepted  # the longest accepted lease is held as asked
    assert cap(10 * accepted) == accepted  # and the queue never asks for more
    assert cap(workqueue.MIN_LEASE_S) == workqueue.MIN_LEASE_S  # the shortest accepted one too

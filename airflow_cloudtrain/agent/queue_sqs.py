"""The worker's queue and group on AWS: an SQS queue of work items and an EC2 Auto Scaling group.

``agent.worker`` only needs the methods below, so a Pub/Sub subscription and a managed instance group
(GCP) are two more small classes with the same methods:

- queue: ``receive() -> Lease | None`` (one message, leased for ``lease_s``; None when the wait found
  nothing; raises ``QueueGone`` when the queue no longer exists), ``extend(lease)`` (the lease again
  for ``lease_s`` from now), ``done(lease)`` (delete / ack), ``release_now(lease)`` (visible again at
  once: a retry), ``requeue(lease, body)`` (a new message instead of this one: its delivery count
  starts over), ``to_dead_letter(lease)`` (to the dead-letter queue / topic, then done) and
  ``depth()`` (messages waiting);
- group: ``protect()`` (no scale-in while busy) and ``unprotect_and_leave()`` (out of the group with
  its desired size one less, so it is not replaced; the group then terminates the machine).

The clients are boto3's in ``settings.region``, with the default credentials (the instance profile)
and endpoint (``AWS_ENDPOINT_URL`` redirects them to the emulator), retrying throttling and 5xx in
botocore's standard mode. Stdlib + boto3 only: this ships in the agent zip.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.workqueue import WorkerSettings

log = logging.getLogger("cloudtrain.agent")

CLIENT_RETRIES = {"mode": "standard", "max_attempts": 10}
SQS_MAX_WAIT_S = 20  # the longest long poll SQS takes
# What SQS answers for a deleted queue (JSON protocol, and the query protocol's older code).
QUEUE_GONE_CODES = frozenset({"QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"})


class QueueGone(Exception):
    """The queue was deleted (the fleet is over): there is no more work to take."""


@dataclass
class Lease:
    """One received message: its body, how many times it was delivered (1 = first), and the handle
    its lease is renewed / ended with (SQS receipt handle, Pub/Sub ack id)."""

    body: str
    delivery: int
    handle: str
    message_id: str = ""


def aws_client(service: str, region: str | None) -> Any:
    from botocore.config import Config

    from airflow_cloudtrain.storage import aws_client as shared_models_client

    return shared_models_client(service, region_name=region, config=Config(retries=dict(CLIENT_RETRIES)))


def _error_code(err: BaseException) -> str:
    response = getattr(err, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class SqsQueue:
    """The work queue (``settings.queue``, a queue URL) and its dead-letter queue (``dead_letter``)."""

    def __init__(self, settings: WorkerSettings, client: Any = None) -> None:
        self.settings = settings
        self.client = client if client is not None else aws_client("sqs", settings.region)

    def _lease_s(self) -> int:
        """The visibility timeout asked for: at most SQS's longest, the operator's ``lease_timeout`` bound."""
        return max(0, min(int(self.settings.lease_s), workqueue.SQS_MAX_LEASE_S))

    def receive(self) -> Lease | None:
        try:
            response = self.client.receive_message(
                QueueUrl=self.settings.queue,
                MaxNumberOfMessages=1,
                WaitTimeSeconds=max(0, min(int(self.settings.wait_s), SQS_MAX_WAIT_S)),
                VisibilityTimeout=self._lease_s(),
                # ``AttributeNames`` is deprecated for system attributes in this botocore
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        except Exception as err:
            if _error_code(err) in QUEUE_GONE_CODES:
                raise QueueGone(str(err)) from err
            raise
        messages = response.get("Messages") or []
        if not messages:
            return None
        message = messages[0]
        delivery = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
        return Lease(message["Body"], delivery, message["ReceiptHandle"], message.get("MessageId", ""))

    def extend(self, lease: Lease) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.settings.queue, ReceiptHandle=lease.handle, VisibilityTimeout=self._lease_s()
        )

    def done(self, lease: Lease) -> None:
        self.client.delete_message(QueueUrl=self.settings.queue, ReceiptHandle=lease.handle)

    def release_now(self, lease: Lease) -> None:
        self.client.change_message_visibility(
            QueueUrl=self.settings.queue, ReceiptHandle=lease.handle, VisibilityTimeout=0
        )

    def requeue(self, lease: Lease, body: str) -> None:
        """Send ``body`` as a new message, then delete this one (a crash between the two leaves both:
        the outcome check makes the second delivery a no-op once the item has its result)."""
        self.client.send_message(QueueUrl=self.settings.queue, MessageBody=body)
        self.done(lease)

    def to_dead_letter(self, lease: Lease) -> None:
        self.client.send_message(QueueUrl=self.settings.dead_letter, MessageBody=lease.body)
        self.done(lease)

    def depth(self) -> int:
        attributes = self.client.get_queue_attributes(
            QueueUrl=self.settings.queue, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", 0))


class AutoScalingGroup:
    """This instance's membership of the Auto Scaling group ``settings.group``."""

    def __init__(self, settings: WorkerSettings, instance_id: str, client: Any = None) -> None:
        assert settings.group, "no group to belong to"
        self.name = settings.group
        self.instance_id = instance_id
        self.client = client if client is not None else aws_client("autoscaling", settings.region)

    def _protection(self, on: bool) -> None:
        self.client.set_instance_protection(
            AutoScalingGroupName=self.name, InstanceIds=[self.instance_id], ProtectedFromScaleIn=on
        )

    def protect(self) -> None:
        """Busy: a scale-in must pick another instance (it would kill the item running here)."""
        self._protection(True)

    def unprotect_and_leave(self) -> None:
        """Leave for good: protection off, then terminate this instance through the group with the
        desired capacity decremented, so the group neither replaces it nor picks a busy one."""
        self._protection(False)
        self.client.terminate_instance_in_auto_scaling_group(
            InstanceId=self.instance_id, ShouldDecrementDesiredCapacity=True
        )

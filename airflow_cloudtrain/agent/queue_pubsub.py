"""The worker's queue and group on GCP: a Pub/Sub subscription of work items and a managed instance group.

The same small interface as ``agent.queue_sqs`` (see its docstring), so ``agent.worker`` runs
unchanged; ``open_backend`` picks these classes for provider ``"gcp"``. Why they work the way they do:

- Plain (unary) pull, one message at a time, over the REST transport. Streaming pull (what the
  high-level ``google.cloud.pubsub_v1`` subscriber uses) is gRPC-only, leases messages ahead of need
  (flow control would still hold the next item's message while this one runs, keeping it from idle
  workers) and renews and ends leases by itself, where a worker must decide both: it takes one item
  only when it is idle, and the item's outcome decides how its lease ends.
  ``pull(max_messages=1)`` leases exactly the one message this worker runs. A REST pull may answer
  "nothing" at once even when messages are on their way, so an empty answer is pulled again about once
  a second until ``wait_s`` has gone by before ``receive`` reports the subscription empty (the last
  pull may end a little after ``wait_s``: the server may hold a pull open for a while).
- Ack deadlines are the leases. A pulled message is leased for the subscription's ack deadline, which
  the operator chose, so ``receive`` sets it to ``lease_s`` at once, and ``extend`` (the worker's
  heartbeat) sets it again from now; Pub/Sub takes 10..600 s, so ``lease_s`` is clamped to that.
  ``release_now`` is a nack (deadline 0: redelivered at once, one more delivery attempt), ``done`` an
  ack. An ack or nack for a lease that already ran out is accepted silently by most subscriptions and
  refused (400, ``PERMANENT_FAILURE_INVALID_ACK_ID``) by exactly-once ones and the emulator: either
  way the message is delivered again, and the outcome files make that a no-op, so ``done`` and
  ``release_now`` only log it. ``extend`` raises it (the heartbeat logs it: the lease is lost).
- Delivery count: ``delivery_attempt`` is filled in only when the subscription has a dead-letter
  policy (the operator creates it with one). Without it Pub/Sub sends 0; then this worker counts the
  deliveries of a message it saw itself (a failing item nacked and pulled again here), so
  ``max_item_attempts`` still ends a failing item instead of retrying it forever.
- Requeue and dead letters are publishes: an interrupted item goes back as a NEW message on
  ``settings.topic`` (its delivery count starts over), then this one is acked; a failed item's body is
  published to ``settings.dead_letter`` (a topic path) and then acked. A crash between the two leaves
  both messages, which the outcome check turns into a no-op.
- ``depth()`` is -1: Pub/Sub has no backlog API (the backlog is a Cloud Monitoring metric,
  ``subscription/num_undelivered_messages``, minutes behind). The worker's loop never asks for it.
- Leaving the group is ``instanceGroupManagers.deleteInstances`` of this VM, never
  ``instances.delete``: a managed instance group recreates an instance deleted under it (and one that
  powered off), while ``deleteInstances`` removes it from the group and lowers the target size by one,
  so it is not replaced. ``skipInstancesOnValidationError`` makes a second call (a retry, or a VM
  the group already dropped) a no-op rather than an error, so retrying it is safe. The operation is
  not waited for: it ends with this machine. The group's size is constant (no autoscaler), so no
  scale-in can pick a busy VM, and ``protect()`` has nothing to do.

Clients: the GAPIC ``google.pubsub_v1`` ``SubscriberClient`` / ``PublisherClient`` (REST) and, for the
group's one call, a plain REST request (``GroupsRest``), with the VM's service account (ADC), or
``CLOUDTRAIN_PUBSUB_ENDPOINT`` / ``CLOUDTRAIN_COMPUTE_ENDPOINT`` with anonymous credentials (the
emulator's VMs get those). Calls are retried on what ``agent.retry.is_transient`` calls transient
(throttling, 5xx, dropped connections); a pull only briefly, so that a failing receive reaches the
worker's loop, which backs off itself. Google libraries are imported lazily: the AWS path never needs
them, and the agent zip imports without them.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from airflow_cloudtrain.agent.queue_sqs import Lease, QueueGone
from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.retry import is_transient
from airflow_cloudtrain.contract.workqueue import WorkerSettings

log = logging.getLogger("cloudtrain.agent")

PUBSUB_ENDPOINT_ENV = "CLOUDTRAIN_PUBSUB_ENDPOINT"
COMPUTE_ENDPOINT_ENV = "CLOUDTRAIN_COMPUTE_ENDPOINT"
REPULL_S = 1.0  # pause between pulls that found nothing, within one receive's wait_s
PULL_TIMEOUT_S = 60.0  # one pull request's HTTP timeout (a pull may be held open by the server)
PULL_RETRY_S = 10.0  # transient pull errors are retried this long, then the worker loop backs off
CALL_TIMEOUT_S = 30.0  # one ack / deadline / publish / group request's HTTP timeout
CALL_RETRY_S = 120.0  # transient errors of those are retried this long
MAX_COUNTED = 1024  # messages whose local deliveries are remembered (without delivery_attempt)
COMPUTE_API = "https://compute.googleapis.com"


def _retry(budget_s: float) -> Any:
    """An api_core Retry on ``is_transient`` errors: doubling from 0.5 s to at most 15 s, jittered."""
    from google.api_core.retry import Retry

    return Retry(predicate=is_transient, initial=0.5, maximum=15.0, multiplier=2.0, timeout=budget_s)


def _client_kwargs(endpoint_env: str) -> dict[str, Any]:
    """Anonymous credentials at ``$endpoint_env`` when it is set (the emulator), else the defaults."""
    endpoint = os.environ.get(endpoint_env)
    if not endpoint:
        return {}
    from google.auth.credentials import AnonymousCredentials

    return {"credentials": AnonymousCredentials(), "client_options": {"api_endpoint": endpoint}}


def subscriber_client() -> Any:
    from google.pubsub_v1 import SubscriberClient

    return SubscriberClient(transport="rest", **_client_kwargs(PUBSUB_ENDPOINT_ENV))


def publisher_client() -> Any:
    from google.pubsub_v1 import PublisherClient

    return PublisherClient(transport="rest", **_client_kwargs(PUBSUB_ENDPOINT_ENV))


def groups_client() -> GroupsRest:
    return GroupsRest(os.environ.get(COMPUTE_ENDPOINT_ENV) or None)


class GroupsRest:
    """``instanceGroupManagers.deleteInstances``, the one Compute Engine call a worker makes, as a plain
    REST request (``google_rest.google_session``: the VM's service account; none at an ``endpoint`` of
    the emulator's). The GAPIC ``google.cloud.compute_v1`` client would cost each VM a
    package to install and about 3 CPU-seconds to import (its generated types cover all of Compute
    Engine) for this one call. Errors are the GAPIC client's: an HTTP error answer is raised as the
    ``google.api_core.exceptions`` class of its status (``from_http_response``), so ``is_transient``
    and callers read it the same way."""

    def __init__(self, endpoint: str | None = None) -> None:
        self.endpoint = endpoint
        self._session: tuple[Any, str] | None = None

    @property
    def session(self) -> tuple[Any, str]:
        """(the session, the base URL), made on the first call (``google_rest.google_session``)."""
        if self._session is None:
            from airflow_cloudtrain.agent.google_rest import google_session

            self._session = google_session(self.endpoint, COMPUTE_API)
        return self._session

    def delete_instances(
        self, project: str, zone: str, group: str, instances: list[str], timeout: float
    ) -> dict[str, Any]:
        """The operation (JSON) of removing ``instances`` (``zones/Z/instances/NAME``) from ``group``;
        ``skipInstancesOnValidationError`` makes one that already left a no-op."""
        session, base = self.session
        url = (
            f"{base}/compute/v1/projects/{project}/zones/{zone}/instanceGroupManagers/{group}/deleteInstances"
        )
        body = {"instances": instances, "skipInstancesOnValidationError": True}
        response = session.post(url, json=body, timeout=timeout)
        if response.status_code >= 400:
            from google.api_core.exceptions import from_http_response

            raise from_http_response(response)
        return dict(response.json())


def _is_not_found(err: BaseException) -> bool:
    return any(cls.__name__ == "NotFound" for cls in type(err).__mro__) or getattr(err, "code", None) == 404


def _is_invalid_ack_id(err: BaseException) -> bool:
    """The lease's ack id is no longer good (it ran out, or a redelivery superseded it): what
    subscriptions with exactly-once delivery (and the emulator) answer with HTTP 400 and an ErrorInfo;
    others accept the call silently."""
    if getattr(err, "reason", None) == "INVALID_ACK_ID":
        return True
    metadata = getattr(err, "metadata", None)
    return isinstance(metadata, dict) and any(
        str(value).startswith("PERMANENT_FAILURE_INVALID_ACK_ID") for value in metadata.values()
    )


class PubSubQueue:
    """The work subscription (``settings.queue``: ``projects/P/subscriptions/S``), the items' topic
    (``settings.topic``) and the dead-letter topic (``settings.dead_letter``)."""

    def __init__(
        self,
        settings: WorkerSettings,
        subscriber: Any = None,
        publisher: Any = None,
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.subscription = settings.queue
        self._subscriber = subscriber
        self._publisher = publisher
        self._sleep, self._clock = sleep, clock
        self._topic = settings.topic
        self._seen: OrderedDict[str, int] = OrderedDict()  # message id -> deliveries seen here

    @property
    def subscriber(self) -> Any:
        if self._subscriber is None:
            self._subscriber = subscriber_client()
        return self._subscriber

    @property
    def publisher(self) -> Any:
        if self._publisher is None:
            self._publisher = publisher_client()
        return self._publisher

    def _lease_s(self) -> int:
        """The ack deadline asked for: what modifyAckDeadline accepts (0 = nack), the operator's
        ``lease_timeout`` bounds (``contract.workqueue``)."""
        return max(workqueue.MIN_LEASE_S, min(int(self.settings.lease_s), workqueue.PUBSUB_MAX_LEASE_S))

    # -- receiving -----------------------------------------------------------------------------------
    def receive(self) -> Lease | None:
        """One message, leased for ``lease_s``; None when the subscription stayed empty for ``wait_s``."""
        deadline = self._clock() + max(0.0, float(self.settings.wait_s))
        while True:
            pulled_at = self._clock()
            try:
                response = self.subscriber.pull(
                    subscription=self.subscription,
                    max_messages=1,
                    retry=_retry(PULL_RETRY_S),
                    timeout=PULL_TIMEOUT_S,
                )
            except Exception as err:
                if _is_not_found(err):
                    raise QueueGone(str(err)) from err
                raise
            received = list(response.received_messages)
            if received:
                return self._lease(received[0])
            now = self._clock()
            if now >= deadline:
                return None
            # about one pull a second: a pull the server held open has waited its share already
            self._sleep(min(max(0.0, REPULL_S - (now - pulled_at)), deadline - now))

    def _lease(self, received: Any) -> Lease:
        message = received.message
        message_id = str(message.message_id)
        delivery = int(received.delivery_attempt or 0)
        if delivery <= 0:  # no dead-letter policy on the subscription: count what this worker saw
            delivery = self._seen.pop(message_id, 0) + 1
            self._seen[message_id] = delivery
            while len(self._seen) > MAX_COUNTED:
                self._seen.popitem(last=False)
        lease = Lease(bytes(message.data).decode("utf-8"), delivery, str(received.ack_id), message_id)
        try:  # the subscription's own ack deadline may be shorter than lease_s (or than a heartbeat)
            self.extend(lease)
        except Exception as err:
            log.warning("could not set the lease of message %s: %s: %s", message_id, type(err).__name__, err)
        return lease

    # -- leases --------------------------------------------------------------------------------------
    def _deadline(self, lease: Lease, seconds: int) -> None:
        self.subscriber.modify_ack_deadline(
            subscription=self.subscription,
            ack_ids=[lease.handle],
            ack_deadline_seconds=seconds,
            retry=_retry(CALL_RETRY_S),
            timeout=CALL_TIMEOUT_S,
        )

    def extend(self, lease: Lease) -> None:
        self._deadline(lease, self._lease_s())

    def done(self, lease: Lease) -> None:
        try:
            self.subscriber.acknowledge(
                subscription=self.subscription,
                ack_ids=[lease.handle],
                retry=_retry(CALL_RETRY_S),
                timeout=CALL_TIMEOUT_S,
            )
        except Exception as err:
            if not _is_invalid_ack_id(err):
                raise
            log.warning("message %s: its lease ran out before the ack; it comes again", lease.message_id)
        self._seen.pop(lease.message_id, None)

    def release_now(self, lease: Lease) -> None:
        """A nack: redelivered at once (to any worker), one more delivery attempt."""
        try:
            self._deadline(lease, 0)
        except Exception as err:
            if not _is_invalid_ack_id(err):
                raise
            log.info("message %s: its lease had already run out (it comes again anyway)", lease.message_id)

    # -- new messages --------------------------------------------------------------------------------
    def _publish(self, topic: str, body: str) -> None:
        from google.pubsub_v1 import PubsubMessage

        self.publisher.publish(
            topic=topic,
            messages=[PubsubMessage(data=body.encode("utf-8"))],
            retry=_retry(CALL_RETRY_S),
            timeout=CALL_TIMEOUT_S,
        )

    def topic(self) -> str:
        """The items' topic: ``settings.topic``, else the one the subscription reads."""
        if not self._topic:
            subscription = self.subscriber.get_subscription(
                subscription=self.subscription, retry=_retry(CALL_RETRY_S), timeout=CALL_TIMEOUT_S
            )
            self._topic = str(subscription.topic)
        return self._topic

    def requeue(self, lease: Lease, body: str) -> None:
        """Publish ``body`` as a new message, then ack this one (a crash between the two leaves both:
        the outcome check makes the second delivery a no-op once the item has its result)."""
        self._publish(self.topic(), body)
        self.done(lease)

    def to_dead_letter(self, lease: Lease) -> None:
        if not self.settings.dead_letter:
            raise ValueError("no dead-letter topic in the worker settings")
        self._publish(self.settings.dead_letter, lease.body)
        self.done(lease)

    def depth(self) -> int:
        """Unknown (-1): Pub/Sub has no backlog call (only a delayed Monitoring metric)."""
        return -1


def _metadata(path: str) -> str | None:
    """A value of the GCE metadata server (``GCE_METADATA_HOST`` on emulated VMs), e.g.
    ``project/project-id`` or ``instance/zone``."""
    from airflow_cloudtrain.agent.watcher import GceMetadata, _request

    value = _request(f"{GceMetadata().base}/computeMetadata/v1/{path}", {"Metadata-Flavor": "Google"})
    return value.strip() if value else None


class ManagedInstanceGroup:
    """This VM's membership of the zonal managed instance group ``settings.group``."""

    def __init__(self, settings: WorkerSettings, instance_name: str, client: Any = None) -> None:
        assert settings.group, "no group to belong to"
        self.name = settings.group
        self.instance_name = instance_name
        self.project = settings.project
        self.zone = settings.zone
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = groups_client()
        return self._client

    def _location(self) -> tuple[str, str]:
        """(project, zone): from the settings, else from the metadata server."""
        if not self.project:
            self.project = _metadata("project/project-id")
        if not self.zone:
            zone = _metadata("instance/zone")  # projects/<number>/zones/<zone>
            self.zone = zone.rsplit("/", 1)[-1] if zone else None
        if not self.project or not self.zone:
            raise RuntimeError(f"the project / zone of group {self.name!r} are unknown")
        return self.project, self.zone

    def protect(self) -> None:
        """Nothing to do: the group has a constant target size (no autoscaler), so nothing scales it in
        and no busy VM is picked; VMs leave only through ``unprotect_and_leave``."""

    def unprotect_and_leave(self) -> None:
        """Out of the group with its target size one less (so it is not replaced); the group then
        deletes this VM. The operation is not waited for: it ends with this machine."""
        project, zone = self._location()
        leave = _retry(CALL_RETRY_S)(self.client.delete_instances)
        operation = leave(
            project, zone, self.name, [f"zones/{zone}/instances/{self.instance_name}"], timeout=CALL_TIMEOUT_S
        )
        errors = list((operation.get("error") or {}).get("errors") or [])  # an operation that failed at once
        if errors:
            raise RuntimeError(f"deleteInstances of {self.instance_name} from {self.name} failed: {errors}")

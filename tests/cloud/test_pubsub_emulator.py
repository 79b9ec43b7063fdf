"""The emulated Pub/Sub and Monitoring's subscription metric, driven by the real clients.

Pub/Sub through the GAPIC ``google.pubsub_v1`` clients over REST (what the agent and the hook use).
Monitoring through ``googleapiclient`` (Monitoring v3's discovery REST client): google-cloud-monitoring
2.32 ships no REST transport for its GAPIC client. Over REST, errors map from the HTTP status, so
409/400/429 arrive as ``Conflict``/``BadRequest``/``TooManyRequests`` (the gRPC transport's
``AlreadyExists``/``InvalidArgument``/``ResourceExhausted`` are their subclasses): code that must run
on both catches the REST classes.

Leases are shortened by ``deadline_scale`` (10 s of ack deadline last 0.5 s here); every wait is a loop
on a condition with a generous deadline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import pytest
from google import pubsub_v1
from google.api_core import exceptions as gexc
from google.api_core.gapic_v1.client_info import ClientInfo
from google.auth.credentials import AnonymousCredentials
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError
from waiting import wait_for

from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT
from airflow_cloudtrain.emulator.gcp.pubsub import BACKLOG, PubSubServer, pubsub_client_kwargs

PROJECT = "cloudtrain-emulated"
SCALE = 0.05  # a 10 s ack deadline lasts 0.5 s
WAIT_S = 30.0


class PubSub:
    """The server and the clients a hook (or an agent) builds against it."""

    def __init__(self, server: PubSubServer) -> None:
        self.server = server
        self.pub = pubsub_v1.PublisherClient(**pubsub_client_kwargs(server.endpoint))
        self.sub = pubsub_v1.SubscriberClient(**pubsub_client_kwargs(server.endpoint))
        self.monitoring = build(
            "monitoring",
            "v3",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": server.endpoint},
            static_discovery=True,
        )

    def topic(self, **labels: str) -> str:
        name = f"projects/{PROJECT}/topics/ct-{uuid.uuid4().hex[:10]}"
        self.pub.create_topic(request={"name": name, "labels": labels})
        return name

    def subscription(self, topic: str, ack_deadline: int = 600, **fields: Any) -> str:
        name = f"projects/{PROJECT}/subscriptions/ct-{uuid.uuid4().hex[:10]}"
        self.sub.create_subscription(
            request={"name": name, "topic": topic, "ack_deadline_seconds": ack_deadline, **fields}
        )
        return name

    def pull_one(self, subscription: str, timeout: float = WAIT_S) -> pubsub_v1.types.ReceivedMessage:
        """The next message delivered, pulling until one comes (a pull may answer empty)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.sub.pull(subscription=subscription, max_messages=1).received_messages
            if got:
                return got[0]
        raise AssertionError(f"nothing delivered on {subscription} within {timeout} s")

    def backlog_series(self, filter_: str) -> dict[str, Any]:
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        request = (
            self.monitoring.projects()
            .timeSeries()
            .list(name=f"projects/{PROJECT}", filter=filter_, interval_startTime=now, interval_endTime=now)
        )
        return dict(request.execute())


def backlog_filter(subscription: str) -> str:
    short = subscription.rsplit("/", 1)[-1]
    return f'metric.type = "{BACKLOG}" AND resource.labels.subscription_id = "{short}"'


@contextmanager
def lease_scale(ps: PubSub, scale: float) -> Iterator[None]:
    """Leases granted inside the block use ``scale``: a lease that must not run out before the next
    call (on a busy machine) gets more than half a second."""
    ps.server.deadline_scale = scale
    try:
        yield
    finally:
        ps.server.deadline_scale = SCALE


@pytest.fixture(scope="module")
def ps() -> Iterator[PubSub]:
    server = PubSubServer(project=PROJECT, deadline_scale=SCALE)
    server.start()
    yield PubSub(server)
    server.stop()


def test_topics_and_subscriptions(ps: PubSub) -> None:
    topic = ps.topic(team="ml", run="ct-abc")
    got = ps.pub.get_topic(topic=topic)
    assert got.name == topic and dict(got.labels) == {"team": "ml", "run": "ct-abc"}
    with pytest.raises(gexc.Conflict) as exc:
        ps.pub.create_topic(request={"name": topic})
    assert exc.value.code == 409 and "already exists" in exc.value.message

    dead = ps.topic()
    name = f"projects/{PROJECT}/subscriptions/ct-{uuid.uuid4().hex[:10]}"
    created = ps.sub.create_subscription(
        request={
            "name": name,
            "topic": topic,
            "labels": {"cloudtrain-run": "ct-abc"},
            "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 7},
            "message_retention_duration": {"seconds": 3600},
        }
    )
    assert created.ack_deadline_seconds == 10  # the default
    got_sub = ps.sub.get_subscription(subscription=name)
    assert got_sub.topic == topic and dict(got_sub.labels) == {"cloudtrain-run": "ct-abc"}
    assert got_sub.dead_letter_policy.dead_letter_topic == dead
    assert got_sub.dead_letter_policy.max_delivery_attempts == 7
    assert name in list(ps.pub.list_topic_subscriptions(topic=topic))
    assert ps.server.exists("subscription", name) and ps.server.exists("topic", topic)
    with pytest.raises(gexc.Conflict):
        ps.sub.create_subscription(request={"name": name, "topic": topic})

    ps.pub.delete_topic(topic=topic)  # the subscription stays, detached
    with pytest.raises(gexc.NotFound):
        ps.pub.get_topic(topic=topic)
    with pytest.raises(gexc.NotFound):
        ps.pub.delete_topic(topic=topic)
    assert ps.sub.get_subscription(subscription=name).topic == "_deleted-topic_"
    with pytest.raises(gexc.NotFound):
        ps.pub.publish(topic=topic, messages=[{"data": b"x"}])

    ps.sub.delete_subscription(subscription=name)
    for call in (ps.sub.get_subscription, ps.sub.delete_subscription):
        with pytest.raises(gexc.NotFound) as missing:
            call(subscription=name)
        assert "Resource not found" in missing.value.message
    with pytest.raises(gexc.NotFound):
        ps.sub.pull(subscription=name, max_messages=1)
    with pytest.raises(gexc.NotFound):  # its topic must exist
        ps.sub.create_subscription(request={"name": name, "topic": topic})
    assert ps.server.subscription(name) is None and not ps.server.exists("subscription", name)


@pytest.mark.parametrize(
    "fields",
    [
        {"ack_deadline_seconds": 5},
        {"ack_deadline_seconds": 601},
        {"dead_letter_policy": {"dead_letter_topic": "DLT", "max_delivery_attempts": 4}},
        {"dead_letter_policy": {"dead_letter_topic": "DLT", "max_delivery_attempts": 101}},
    ],
)
def test_invalid_subscription_settings(ps: PubSub, fields: dict[str, Any]) -> None:
    topic, dead = ps.topic(), ps.topic()
    if "dead_letter_policy" in fields:
        fields["dead_letter_policy"]["dead_letter_topic"] = dead
    name = f"projects/{PROJECT}/subscriptions/ct-{uuid.uuid4().hex[:10]}"
    with pytest.raises(gexc.BadRequest) as exc:  # InvalidArgument over gRPC
        ps.sub.create_subscription(request={"name": name, "topic": topic, **fields})
    assert exc.value.code == 400
    assert not ps.server.exists("subscription", name)


def test_dead_letter_topic_must_exist(ps: PubSub) -> None:
    missing = f"projects/{PROJECT}/topics/ct-missing-{uuid.uuid4().hex[:6]}"
    with pytest.raises(gexc.NotFound):
        ps.subscription(ps.topic(), dead_letter_policy={"dead_letter_topic": missing})


def test_publish_pull_ack(ps: PubSub) -> None:
    topic = ps.topic()
    first, second = ps.subscription(topic), ps.subscription(topic)
    ids = ps.pub.publish(
        topic=topic, messages=[{"data": b"item-1", "attributes": {"n": "1"}}, {"data": b"item-2"}]
    ).message_ids
    late = ps.subscription(topic)  # made after the publish: gets nothing of it
    for sub in (first, second):  # every subscription of the topic gets its own copy
        got = [ps.pull_one(sub), ps.pull_one(sub)]
        assert [m.message.message_id for m in got] == list(ids)
        assert [m.message.data for m in got] == [b"item-1", b"item-2"]
        assert dict(got[0].message.attributes) == {"n": "1"}
        assert got[0].delivery_attempt == 0  # no dead-letter policy: not sent
        assert got[0].message.publish_time.timestamp() == pytest.approx(time.time(), abs=60)
        assert ps.server.subscription_backlog(sub) == 2  # leased messages are still undelivered
        ps.sub.acknowledge(subscription=sub, ack_ids=[m.ack_id for m in got])
        assert ps.server.subscription_backlog(sub) == 0
        assert not ps.sub.pull(subscription=sub, max_messages=10, return_immediately=True).received_messages
    assert ps.server.subscription_backlog(late) == 0


def test_expired_lease_is_redelivered_with_a_new_ack_id(ps: PubSub) -> None:
    dead = ps.topic()
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline=10, dead_letter_policy={"dead_letter_topic": dead})
    ps.pub.publish(topic=topic, messages=[{"data": b"work"}])
    first = ps.pull_one(sub)
    assert first.delivery_attempt == 1
    assert ps.server.subscription_leased(sub) == 1
    wait_for(lambda: ps.server.subscription_leased(sub) == 0)  # the lease ran out, nobody pulled since
    with pytest.raises(gexc.BadRequest) as expired:
        ps.sub.acknowledge(subscription=sub, ack_ids=[first.ack_id])
    assert expired.value.reason == "INVALID_ACK_ID"
    assert ps.server.subscription_backlog(sub) == 1
    with lease_scale(ps, 1.0):  # the redelivery's lease lasts 10 s: it is still good when acked
        again = ps.pull_one(sub)
    assert again.message.message_id == first.message.message_id
    assert again.delivery_attempt == 2 and again.ack_id != first.ack_id

    with pytest.raises(gexc.BadRequest) as exc:  # the old lease's id, with the good one: good one acked
        ps.sub.acknowledge(subscription=sub, ack_ids=[first.ack_id, again.ack_id])
    assert exc.value.reason == "INVALID_ACK_ID"
    assert exc.value.metadata == {first.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    assert ps.server.subscription_backlog(sub) == 0
    with pytest.raises(gexc.BadRequest):
        ps.sub.modify_ack_deadline(subscription=sub, ack_ids=["no-such-ack-id"], ack_deadline_seconds=60)


def test_modify_ack_deadline_extends_and_nacks(ps: PubSub) -> None:
    dead = ps.topic()
    topic = ps.topic()
    sub = ps.subscription(topic, ack_deadline=10, dead_letter_policy={"dead_letter_topic": dead})
    ps.pub.publish(topic=topic, messages=[{"data": b"long item"}])
    with lease_scale(ps, 0.3):  # a 3 s lease: time enough to extend it on a busy machine (1 s was not)
        got = ps.pull_one(sub)
    pulled = time.monotonic()
    ps.sub.modify_ack_deadline(subscription=sub, ack_ids=[got.ack_id], ack_deadline_seconds=600)
    until = pulled + 4.5  # well past the 3 s lease: it would have run out
    while time.monotonic() < until:
        assert not ps.sub.pull(subscription=sub, max_messages=1).received_messages
    with pytest.raises(gexc.BadRequest):
        ps.sub.modify_ack_deadline(subscription=sub, ack_ids=[got.ack_id], ack_deadline_seconds=601)

    ps.sub.modify_ack_deadline(subscription=sub, ack_ids=[got.ack_id], ack_deadline_seconds=0)  # nack
    again = ps.pull_one(sub, timeout=5)
    assert again.message.message_id == got.message.message_id and again.delivery_attempt == 2
    with pytest.raises(gexc.BadRequest):  # a nacked lease is over
        ps.sub.acknowledge(subscription=sub, ack_ids=[got.ack_id])
    ps.sub.acknowledge(subscription=sub, ack_ids=[again.ack_id])
    assert ps.server.subscription_backlog(sub) == 0


def test_dead_letter_after_max_delivery_attempts(ps: PubSub) -> None:
    dead, topic = ps.topic(), ps.topic()
    dead_sub = ps.subscription(dead)
    sub = ps.subscription(topic, dead_letter_policy={"dead_letter_topic": dead, "max_delivery_attempts": 5})
    ps.pub.publish(topic=topic, messages=[{"data": b"poison", "attributes": {"item": "7"}}])
    for attempt in range(1, 6):
        got = ps.pull_one(sub)
        assert got.delivery_attempt == attempt
        ps.sub.modify_ack_deadline(subscription=sub, ack_ids=[got.ack_id], ack_deadline_seconds=0)
    letter = ps.pull_one(dead_sub)
    assert letter.message.data == b"poison"
    attrs = dict(letter.message.attributes)
    assert attrs["item"] == "7"
    assert attrs["CloudPubSubDeadLetterSourceSubscription"] == sub.rsplit("/", 1)[-1]
    assert ps.server.subscription_backlog(sub) == 0
    assert not ps.sub.pull(subscription=sub, max_messages=1, return_immediately=True).received_messages


def test_monitoring_backlog(ps: PubSub) -> None:
    topic = ps.topic()
    sub = ps.subscription(topic)
    ps.pub.publish(topic=topic, messages=[{"data": b"a"}, {"data": b"b"}, {"data": b"c"}])
    leased = ps.pull_one(sub)

    series = ps.backlog_series(backlog_filter(sub))["timeSeries"]
    assert len(series) == 1
    assert series[0]["metric"]["type"] == BACKLOG
    assert series[0]["resource"] == {
        "type": "pubsub_subscription",
        "labels": {"project_id": PROJECT, "subscription_id": sub.rsplit("/", 1)[-1]},
    }
    assert series[0]["metricKind"] == "GAUGE" and series[0]["valueType"] == "INT64"
    point = series[0]["points"][0]
    assert point["value"] == {"int64Value": "3"}  # waiting and leased
    assert point["interval"]["endTime"].endswith("Z")

    ps.sub.acknowledge(subscription=sub, ack_ids=[leased.ack_id])
    tolerant = f"metric.type='{BACKLOG}'  and resource.label.subscription_id='{sub.rsplit('/', 1)[-1]}'"
    assert ps.backlog_series(tolerant)["timeSeries"][0]["points"][0]["value"] == {"int64Value": "2"}

    # no subscription, no series: never a 0
    assert ps.backlog_series(backlog_filter(f"projects/{PROJECT}/subscriptions/ct-never")) == {}
    ps.sub.delete_subscription(subscription=sub)
    assert ps.backlog_series(backlog_filter(sub)) == {}
    assert ps.server.subscription_backlog(sub) is None

    with pytest.raises(HttpError) as exc:  # the API wants a metric type
        ps.backlog_series('resource.labels.subscription_id = "x"')
    assert exc.value.resp.status == 400


def test_throttling_and_counts(ps: PubSub) -> None:
    topic = ps.topic()
    ps.server.reset_counts()
    ps.server.throttle.set(1.0, "topics.publish")
    try:
        with pytest.raises(gexc.TooManyRequests) as exc:  # ResourceExhausted over gRPC
            ps.pub.publish(topic=topic, messages=[{"data": b"x"}], retry=None)
        assert exc.value.code == 429 and exc.value.reason == "RATE_LIMIT_EXCEEDED"
        ps.server.throttle.set(1.0, "monitoring")
        with pytest.raises(HttpError) as mon:
            ps.backlog_series(backlog_filter(topic))
        assert mon.value.resp.status == 429
    finally:
        ps.server.throttle.clear()
    assert ps.server.subscription_backlog(ps.subscription(topic)) == 0  # nothing was published

    own = pubsub_v1.PublisherClient(
        client_info=ClientInfo(user_agent=EMULATOR_USER_AGENT), **pubsub_client_kwargs(ps.server.endpoint)
    )
    own.get_topic(topic=topic)  # the emulator's own requests: not counted
    assert ps.server.counts() == {
        "topics.publish": 1,
        "throttled:topics.publish": 1,
        "timeSeries.list": 1,
        "throttled:timeSeries.list": 1,
        "subscriptions.create": 1,
    }

"""QueueDepthSensor on Pub/Sub subscriptions against the emulator, what only Pub/Sub has: the backlog
read from Cloud Monitoring's ``subscription/num_undelivered_messages``, leased messages, missing and
deleted subscriptions, a subscription Monitoring has no data for (never read as empty). What SQS and
Pub/Sub share (drains, fills, throttling, one read per poll across deferred sensors, a deferrable run
in a DAG) is ``test_queue_depth.py``, on both.

The emulator answers Monitoring with a sample taken now for every existing subscription: it has no
lag. "No data yet" (a real subscription's first 1-3 minutes) is made with a second, empty
``PubSubServer`` serving the connection's Monitoring while its Pub/Sub is the emulator's: the
subscription exists, Monitoring knows nothing of it until the test creates it there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import Any

import pytest
from google import pubsub_v1
from google.api_core.exceptions import NotFound
from waiting import wait_for

from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.emulator.gcp.pubsub import PubSubServer, pubsub_client_kwargs
from airflow_cloudtrain.hooks.depth import DepthNotKnownYet, QueueDepth, QueueNotFound
from airflow_cloudtrain.hooks.pubsub import PubSubDepthReader, latest_value
from airflow_cloudtrain.sensors import QueueDepthSensor
from airflow_cloudtrain.triggers import queue_depth, shared_poll
from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger, depth_reader, evaluate_depth

LAGGING = "gcp_lagging_monitoring"  # a connection whose Monitoring has no data (fixture below)
UNCLOSED = "Unclosed client session"


# --- helpers -------------------------------------------------------------------------------------


class Background(threading.Thread):
    """Does ``action`` once ``condition`` holds; ``join()`` re-raises what went wrong in it."""

    def __init__(self, condition: Callable[[], bool], action: Callable[[], Any], what: str) -> None:
        super().__init__(daemon=True)
        self.condition, self.action, self.what = condition, action, what
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            wait_for(self.condition, message=self.what)
        except BaseException as err:  # handed to the test by join()
            self.error = err
        try:  # acted on even when the condition never held, so the run waiting on it ends (and fails)
            self.action()
        except BaseException as err:
            self.error = self.error or err

    def join(self, timeout: float | None = 30.0) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


class PubSub:
    """The real REST clients against the emulator: what a publisher and a worker do."""

    def __init__(self, endpoint: str) -> None:
        self.pub = pubsub_v1.PublisherClient(**pubsub_client_kwargs(endpoint))
        self.sub = pubsub_v1.SubscriberClient(**pubsub_client_kwargs(endpoint))

    def publish(self, topic: str, n: int) -> None:
        self.pub.publish(topic=topic, messages=[{"data": json.dumps({"item": i}).encode()} for i in range(n)])

    def pull_all(self, subscription: str, n: int) -> list[str]:
        """Lease ``n`` messages (pulling until they came); their ack ids."""
        ack_ids: list[str] = []
        deadline = time.monotonic() + 120
        while len(ack_ids) < n:
            assert time.monotonic() < deadline, f"only {len(ack_ids)} of {n} messages delivered"
            got = self.sub.pull(subscription=subscription, max_messages=n - len(ack_ids))
            ack_ids += [m.ack_id for m in got.received_messages]
        return ack_ids

    def work_off(self, subscription: str, n: int) -> None:
        """A worker: pull ``n`` messages and acknowledge them."""
        self.sub.acknowledge(subscription=subscription, ack_ids=self.pull_all(subscription, n))


@pytest.fixture
def ps(emu) -> PubSub:
    return PubSub(emu.pubsub_endpoint)


@pytest.fixture
def subscription(ps: PubSub) -> Iterator[tuple[str, str]]:
    """(topic, subscription path), fresh, deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    topic = f"projects/{GCP_PROJECT}/topics/ct-t-{suffix}"
    path = f"projects/{GCP_PROJECT}/subscriptions/ct-s-{suffix}"
    ps.pub.create_topic(name=topic)
    ps.sub.create_subscription(name=path, topic=topic, ack_deadline_seconds=600)
    yield topic, path
    with contextlib.suppress(NotFound):  # a test may have deleted it already
        ps.sub.delete_subscription(subscription=path)
    ps.pub.delete_topic(topic=topic)


def ghost_path() -> str:
    return f"projects/{GCP_PROJECT}/subscriptions/ct-ghost-{uuid.uuid4().hex[:8]}"


def lists(emu) -> int:
    return emu.request_counts().get("timeSeries.list", 0)


def sensor(**kwargs: Any) -> QueueDepthSensor:
    kwargs.setdefault("poll_interval", 0.2)
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("deferrable", False)
    return QueueDepthSensor(task_id=f"wait_{uuid.uuid4().hex[:6]}", **kwargs)


def trigger(path: str, **kwargs: Any) -> QueueDepthTrigger:
    kwargs.setdefault("max_depth", 0)
    kwargs.setdefault("poll_interval", 0.3)
    kwargs.setdefault("conn_id", "google_cloud_default")
    return QueueDepthTrigger(queue=path, provider="pubsub", **kwargs)


async def first_event(t: QueueDepthTrigger) -> dict[str, Any]:
    async with aclosing(t.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("the trigger ended without an event")


def assert_clean(capfd) -> None:
    """No reader or poll group left behind, and nothing complained of an unclosed client."""
    gc.collect()
    assert not queue_depth._readers
    assert not [k for k in shared_poll._groups if isinstance(k, tuple) and k[:1] == ("pubsub",)]
    captured = capfd.readouterr()
    assert UNCLOSED not in captured.out + captured.err


# --- pure parts ----------------------------------------------------------------------------------


def test_the_newest_sample_is_the_backlog() -> None:
    series = [
        {
            "points": [
                {"interval": {"endTime": "2026-01-01T00:02:00.123456789Z"}, "value": {"int64Value": "7"}},
                {"interval": {"endTime": "2026-01-01T00:01:00Z"}, "value": {"int64Value": "9"}},
            ]
        },
        {"points": [{"interval": {"endTime": "2026-01-01T00:00:30Z"}, "value": {"int64Value": "4"}}]},
    ]
    assert latest_value(series) == 7
    assert latest_value([{"points": list(reversed(series[0]["points"]))}, series[1]]) == 7  # any order
    assert latest_value([]) is None and latest_value([{"metric": {}}]) is None  # no sample: not 0


def test_not_known_yet_decides_nothing() -> None:
    unknown = QueueDepth("projects/p/subscriptions/s", error=DepthNotKnownYet("no data yet"))
    assert unknown.depth() == 0  # the counts mean nothing ...
    assert evaluate_depth(unknown, max_depth=0, min_depth=None) is None  # ... so no success on them
    assert evaluate_depth(unknown, max_depth=None, min_depth=0) is None


def test_reader_and_trigger_carry_the_google_connection_and_project() -> None:
    reader = depth_reader("pubsub", "gcp_prod", None, "proj-1")
    assert isinstance(reader, PubSubDepthReader) and reader.provider == "pubsub"
    assert reader.key == ("pubsub", "gcp_prod", "proj-1", None)
    t = trigger(
        "projects/proj-1/subscriptions/s",
        conn_id="gcp_prod",
        project_id="proj-1",
        min_depth=3,
        max_depth=None,
    )
    classpath, kwargs = t.serialize()
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain JSON only
    assert (kwargs["provider"], kwargs["conn_id"], kwargs["project_id"]) == ("pubsub", "gcp_prod", "proj-1")
    module, _, name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def test_a_topic_is_refused_at_parse_time() -> None:
    with pytest.raises(ValueError, match=re.escape("queue='projects/p/topics/t' is a Pub/Sub topic")):
        QueueDepthSensor(task_id="s", queue="projects/p/topics/t", max_depth=0)
    s = QueueDepthSensor(
        task_id="s", queue="projects/p/subscriptions/s", max_depth=0, gcp_conn_id="g", project_id="proj-1"
    )
    assert (s.watched_queue, s.gcp_conn_id, s.project_id) == ("projects/p/subscriptions/s", "g", "proj-1")


# --- poking (non-deferrable) ---------------------------------------------------------------------


def test_leased_messages_count_until_acked(emu, ps, subscription) -> None:
    topic, path = subscription
    ps.publish(topic, 2)
    ack_ids = ps.pull_all(path, 2)  # leased by a worker, not acknowledged
    assert not sensor(queue=path, max_depth=0).poke({})
    # Pub/Sub cannot tell leased messages apart: count_in_flight=False still counts them.
    assert not sensor(queue=path, max_depth=0, count_in_flight=False).poke({})
    ps.sub.acknowledge(subscription=path, ack_ids=ack_ids)
    done = sensor(queue=path, max_depth=0).poke({})
    assert done and done.xcom_value["depth"] == 0


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_missing_subscription_fails_naming_it(emu, deferrable: bool) -> None:
    ghost = ghost_path()
    for threshold in ({"max_depth": 0}, {"min_depth": 1}):
        with pytest.raises(QueueNotFound, match=f"Pub/Sub subscription {ghost} does not exist"):
            sensor(queue=ghost, deferrable=deferrable, **threshold).execute({})


# --- no Monitoring data for a subscription that exists -------------------------------------------


@pytest.fixture
def lagging(emu, monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubServer]:
    """Connection ``LAGGING``: Pub/Sub is the emulator's, Monitoring an empty second server (a
    subscription appears there only when the test creates it: its "first sample")."""
    monitoring = PubSubServer(project=GCP_PROJECT)
    extra = {
        "project": GCP_PROJECT,
        "compute_endpoint": emu.gce_endpoint,  # (anonymous credentials go with a compute endpoint)
        "pubsub_endpoint": emu.pubsub_endpoint,
        "monitoring_endpoint": monitoring.start(),
        "credentials": "anonymous",
    }
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{LAGGING.upper()}",
        json.dumps({"conn_type": "google_cloud_platform", "extra": extra}),
    )
    yield monitoring
    monitoring.stop()


def first_sample(monitoring: PubSubServer, topic: str, path: str) -> None:
    """Monitoring now has data for the subscription: an empty backlog."""
    monitoring.create_topic(topic, {})
    monitoring.create_subscription(path, {"topic": topic})


def test_no_data_yet_is_neither_empty_nor_missing(emu, lagging, subscription) -> None:
    topic, path = subscription  # exists, and is empty: a misread would be "drained"
    depth = depth_reader("pubsub", LAGGING, None).read(path)
    assert not depth.missing and isinstance(depth.error, DepthNotKnownYet)
    assert f"no num_undelivered_messages data yet for Pub/Sub subscription {path}" in str(depth.error)
    assert evaluate_depth(depth, max_depth=0, min_depth=None) is None
    gone = depth_reader("pubsub", LAGGING, None).read(ghost_path())  # no data and no subscription
    assert gone.missing and gone.error is None


def test_poke_waits_while_monitoring_has_no_data(emu, lagging, subscription, capfd) -> None:
    topic, path = subscription
    emu.reset_counts()

    def monitoring_reads() -> int:
        return lagging.counts().get("timeSeries.list", 0)

    arrives = Background(
        lambda: monitoring_reads() >= 3, lambda: first_sample(lagging, topic, path), "3 polls"
    )
    arrives.start()
    result = sensor(queue=path, max_depth=0, gcp_conn_id=LAGGING).execute({})
    arrives.join()
    assert monitoring_reads() >= 4  # three polls without data (waited on), then the data
    assert emu.request_counts().get("subscriptions.get", 0) >= 4  # resolve, then each poll without data
    assert result == {"queue": path, "depth": 0, "visible": 0, "in_flight": 0, "delayed": 0}
    captured = capfd.readouterr()
    assert (
        f"no num_undelivered_messages data yet for Pub/Sub subscription {path}" in captured.out + captured.err
    )


def test_trigger_waits_while_monitoring_has_no_data(emu, lagging, subscription, capfd) -> None:
    topic, path = subscription

    async def main() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(trigger(path, conn_id=LAGGING)))
        deadline = asyncio.get_running_loop().time() + 120
        while lagging.counts().get("timeSeries.list", 0) < 3:
            assert asyncio.get_running_loop().time() < deadline, "the trigger never polled"
            assert not task.done(), task.result()  # no data: waited on, neither done nor failed
            await asyncio.sleep(0.05)
        assert not task.done(), task.result()
        first_sample(lagging, topic, path)
        return await asyncio.wait_for(task, 120)

    event = asyncio.run(main())
    assert event["status"] == "success" and (event["queue"], event["depth"]) == (path, 0)
    assert_clean(capfd)


# --- the trigger ---------------------------------------------------------------------------------


def test_trigger_fails_when_the_subscription_is_missing_or_deleted(emu, ps, subscription, capfd) -> None:
    ghost = ghost_path()
    event = asyncio.run(asyncio.wait_for(first_event(trigger(ghost, min_depth=1, max_depth=None)), 120))
    assert event["status"] == "error" and f"queue {ghost} does not exist" in event["message"]

    topic, path = subscription
    ps.publish(topic, 1)
    emu.reset_counts()

    async def main() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(trigger(path)))
        deadline = asyncio.get_running_loop().time() + 120
        while await asyncio.to_thread(lists, emu) < 2:
            assert asyncio.get_running_loop().time() < deadline, "the trigger never polled"
            await asyncio.sleep(0.05)
        assert not task.done(), task.result()
        await asyncio.to_thread(ps.sub.delete_subscription, subscription=path)
        return await asyncio.wait_for(task, 120)

    event = asyncio.run(main())
    assert event["status"] == "error" and f"queue {path} does not exist" in event["message"]
    assert_clean(capfd)

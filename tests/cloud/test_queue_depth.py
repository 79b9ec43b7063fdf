"""QueueDepthSensor and its trigger on both queues (the ``provider`` parameter): an SQS queue (moto,
``GetQueueAttributes``) and a Pub/Sub subscription (the emulator, its backlog read from Cloud
Monitoring's ``timeSeries.list``). What a user checks is the same on both: the sensor succeeds once
the queue drains or fills to ``min_depth``, a throttled read is waited out (not a failure), deferred
sensors share one read per queue per poll, and a deferrable sensor in a DAG delivers the depth as its
XCom; no client is left open.

What only one queue has stays in its own file: SQS's in-flight and delayed counts, queue names and
URLs, parse-time checks (``test_queue_depth_sensor.py``); Pub/Sub's leased messages, deleted
subscriptions and Monitoring's "no data yet" (``test_queue_depth_pubsub.py``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import Any

import pytest
from dag_helpers import task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.sensors import QueueDepthSensor
from airflow_cloudtrain.triggers import queue_depth, shared_poll
from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger

UNCLOSED = "Unclosed client session"
PROVIDERS = ["aws", "gcp"]


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


class Sqs:
    """A fresh SQS queue: ``ref`` is its name (what a DAG gives), ``id`` its URL (what the XCom says)."""

    read_api, group, conn_id, trigger_kwargs = "GetQueueAttributes", "sqs", "aws_default", {}
    sharers = 20  # deferred sensors on one queue, in the shared-read test

    def __init__(self, emu: Any) -> None:
        import boto3

        self.emu, self.client = emu, boto3.client("sqs")
        self.ref = f"ct-q-{uuid.uuid4().hex[:10]}"
        self.id = self.url = self.client.create_queue(QueueName=self.ref)["QueueUrl"]

    def send(self, n: int) -> None:
        for i in range(n):
            self.client.send_message(QueueUrl=self.url, MessageBody=json.dumps({"item": i}))

    def drain(self, n: int) -> None:
        self.client.purge_queue(QueueUrl=self.url)

    def close(self) -> None:
        self.client.delete_queue(QueueUrl=self.url)


class PubSubSubscription:
    """A fresh topic and subscription: ``ref`` and ``id`` are both the subscription's path."""

    read_api, group, conn_id = "timeSeries.list", "pubsub", "google_cloud_default"
    trigger_kwargs = {"provider": "pubsub"}
    sharers = 10

    def __init__(self, emu: Any) -> None:
        from test_queue_depth_pubsub import PubSub

        from airflow_cloudtrain.emulator import GCP_PROJECT

        self.ps = PubSub(emu.pubsub_endpoint)
        suffix = uuid.uuid4().hex[:10]
        self.topic = f"projects/{GCP_PROJECT}/topics/ct-t-{suffix}"
        self.ref = self.id = self.url = f"projects/{GCP_PROJECT}/subscriptions/ct-s-{suffix}"
        self.ps.pub.create_topic(name=self.topic)
        self.ps.sub.create_subscription(name=self.ref, topic=self.topic, ack_deadline_seconds=600)

    def send(self, n: int) -> None:
        self.ps.publish(self.topic, n)

    def drain(self, n: int) -> None:
        self.ps.work_off(self.ref, n)  # a worker pulls and acknowledges them

    def close(self) -> None:
        self.ps.sub.delete_subscription(subscription=self.ref)
        self.ps.pub.delete_topic(topic=self.topic)


@pytest.fixture(params=PROVIDERS)
def q(request: pytest.FixtureRequest, emu: Any) -> Iterator[Any]:
    made = Sqs(emu) if request.param == "aws" else PubSubSubscription(emu)
    yield made
    made.close()


def reads(emu: Any, q: Any) -> int:
    return int(emu.request_counts().get(q.read_api, 0))


def sensor(**kwargs: Any) -> QueueDepthSensor:
    kwargs.setdefault("poll_interval", 0.2)
    kwargs.setdefault("timeout", 30)
    kwargs.setdefault("deferrable", False)
    return QueueDepthSensor(task_id=f"wait_{uuid.uuid4().hex[:6]}", **kwargs)


def trigger(q: Any, **kwargs: Any) -> QueueDepthTrigger:
    kwargs.setdefault("max_depth", 0)
    kwargs.setdefault("poll_interval", 0.3)
    return QueueDepthTrigger(queue=q.url, conn_id=q.conn_id, **q.trigger_kwargs, **kwargs)


async def first_event(t: QueueDepthTrigger) -> dict[str, Any]:
    async with aclosing(t.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("the trigger ended without an event")


def assert_clean(q: Any, capfd: Any, caplog: Any) -> None:
    """No reader or poll group left behind, and nothing complained of an unclosed client."""
    gc.collect()
    assert not queue_depth._readers
    assert not [k for k in shared_poll._groups if isinstance(k, tuple) and k[:1] == (q.group,)]
    captured = capfd.readouterr()
    assert UNCLOSED not in captured.out + captured.err + caplog.text


# --- poking (non-deferrable) ---------------------------------------------------------------------


def test_succeeds_when_the_queue_drains(emu, q) -> None:
    q.send(3)
    emu.reset_counts()
    # Drain only once the sensor has seen the queue non-empty at least twice.
    drainer = Background(lambda: reads(emu, q) >= 2, lambda: q.drain(3), "two polls")
    drainer.start()
    result = sensor(queue=q.ref, max_depth=0).execute({})
    drainer.join()
    # The first read saw 3 items (the drain starts only once a second read has arrived), and the
    # sensor kept polling until it saw 0. The second read may already see the drain (it is counted
    # when it arrives, before it is answered), so two reads are all that is certain.
    assert reads(emu, q) >= 2
    assert result == {"queue": q.id, "depth": 0, "visible": 0, "in_flight": 0, "delayed": 0}


def test_succeeds_when_min_depth_is_reached(emu, q) -> None:
    q.send(1)
    emu.reset_counts()
    filler = Background(lambda: reads(emu, q) >= 2, lambda: q.send(3), "two polls")
    filler.start()
    result = sensor(queue=q.url, min_depth=4).execute({})
    filler.join()
    assert result["queue"] == q.url and result["depth"] >= 4 and result["visible"] == result["depth"]


def test_a_throttled_poll_is_retried(emu, q) -> None:
    s = sensor(queue=q.url, max_depth=0)
    emu.throttle(1.0, api=q.read_api)
    try:
        assert not s.poke({})  # throttled (after the SDK's own retries): not done, not failed
    finally:
        emu.clear_faults()
    assert s.poke({})


# --- the trigger ---------------------------------------------------------------------------------


def test_triggers_share_one_read_per_poll(emu, q, capfd, caplog) -> None:
    n = q.sharers
    q.send(1)  # never drains: every trigger keeps waiting
    emu.reset_counts()
    triggers = [trigger(q, poll_interval=0.5) for _ in range(n)]

    async def main() -> int:
        tasks = [asyncio.ensure_future(first_event(t)) for t in triggers]
        deadline = asyncio.get_running_loop().time() + 120
        while (calls := await asyncio.to_thread(reads, emu, q)) < 3:
            assert asyncio.get_running_loop().time() < deadline, f"only {calls} polls in 120 s"
            assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return calls

    seen = asyncio.run(main())
    # Unshared, the first poll alone is n reads; shared, each poll is one read for all n.
    assert 3 <= seen <= reads(emu, q) < n
    assert emu.request_counts().get("subscriptions.get", 0) == 0  # Pub/Sub: data came each poll
    assert_clean(q, capfd, caplog)


def test_trigger_succeeds_once_the_queue_drains(emu, q, capfd, caplog) -> None:
    q.send(2)
    emu.reset_counts()

    async def main() -> list[dict[str, Any]]:
        tasks = [asyncio.ensure_future(first_event(trigger(q))) for _ in range(3)]
        deadline = asyncio.get_running_loop().time() + 120
        while await asyncio.to_thread(reads, emu, q) < 2:
            assert asyncio.get_running_loop().time() < deadline, "the triggers never polled"
            await asyncio.sleep(0.05)
        assert not any(t.done() for t in tasks)
        await asyncio.to_thread(q.drain, 2)
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))

    for event in asyncio.run(main()):
        assert event["status"] == "success"
        assert (event["queue"], event["depth"], event["visible"], event["in_flight"]) == (q.url, 0, 0, 0)
    assert_clean(q, capfd, caplog)


def test_trigger_waits_out_throttling(emu, q, capfd, caplog) -> None:
    emu.reset_counts()
    emu.throttle(1.0, api=q.read_api)

    def throttled() -> int:
        return int(emu.request_counts().get(f"throttled:{q.read_api}", 0))

    async def main() -> dict[str, Any]:
        task = asyncio.ensure_future(first_event(trigger(q)))
        deadline = asyncio.get_running_loop().time() + 120
        while await asyncio.to_thread(throttled) < 3:
            assert asyncio.get_running_loop().time() < deadline, "the trigger never polled"
            await asyncio.sleep(0.05)
        assert not task.done(), task.result()  # throttled: waited out, not failed
        emu.clear_faults()
        return await asyncio.wait_for(task, 120)

    try:
        event = asyncio.run(main())
    finally:
        emu.clear_faults()
    assert event["status"] == "success" and event["depth"] == 0
    assert_clean(q, capfd, caplog)


# --- in a DAG ------------------------------------------------------------------------------------


def test_deferrable_sensor_in_a_dag(emu, airflow_db, q, capfd) -> None:
    """The queue comes through a template; it drains after the trigger's first poll."""
    q.send(2)
    emu.reset_counts()
    dag_id = f"queue_depth_deferrable_{q.group}"
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.sensors import QueueDepthSensor
        with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
                 params={{"queue": {q.ref!r}}}) as dag:
            QueueDepthSensor(task_id="wait", queue="{{{{ params.queue }}}}", max_depth=0,
                             poll_interval=0.3, timeout=60, deferrable=True)
        """
    )
    # One read is the sensor's own first check on the worker; the second is the trigger's.
    drainer = Background(lambda: reads(emu, q) >= 2, lambda: q.drain(2), "the trigger's poll")
    drainer.start()
    run = write_dag(source, dag_id).test()
    drainer.join()
    assert task_states(run) == {"wait": "success"}
    assert xcom(run, "wait") == {"queue": q.id, "depth": 0, "visible": 0, "in_flight": 0, "delayed": 0}
    captured = capfd.readouterr()
    assert UNCLOSED not in captured.out + captured.err

"""A deferred Pub/Sub queue-depth wait follows its Google connection: its poll group's Monitoring
session is made anew when the connection was edited, without a triggerer restart (issue 22)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from contextlib import aclosing
from typing import Any

from google import pubsub_v1
from relay import relay

from airflow_cloudtrain.emulator import GCP_PROJECT
from airflow_cloudtrain.emulator.gcp.pubsub import pubsub_client_kwargs
from airflow_cloudtrain.hooks import follow
from airflow_cloudtrain.triggers.queue_depth import QueueDepthTrigger


async def first_event(t: QueueDepthTrigger) -> dict[str, Any]:
    async with aclosing(t.run()) as events:
        async for event in events:
            return event.payload
    raise AssertionError("the trigger ended without an event")


def test_a_connection_edited_while_a_depth_wait_runs_is_seen(emu, monkeypatch) -> None:
    monkeypatch.setattr(follow, "RECHECK_S", 1.0)
    conn = json.loads(os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    monkeypatch.setenv("AIRFLOW_CONN_PUBSUB_EDITED", json.dumps(conn))
    pub = pubsub_v1.PublisherClient(**pubsub_client_kwargs(emu.pubsub_endpoint))
    sub = pubsub_v1.SubscriberClient(**pubsub_client_kwargs(emu.pubsub_endpoint))
    suffix = uuid.uuid4().hex[:10]
    topic = f"projects/{GCP_PROJECT}/topics/ct-follow-{suffix}"
    path = f"projects/{GCP_PROJECT}/subscriptions/ct-follow-{suffix}"
    pub.create_topic(name=topic)
    sub.create_subscription(name=path, topic=topic, ack_deadline_seconds=600)
    pub.publish(topic=topic, messages=[{"data": b"item"} for _ in range(3)])
    try:
        # each read through the edited endpoint held 1 s: the window a loaded machine opened by chance
        with relay(emu.pubsub_endpoint, slow="timeSeries", delay_s=1.0) as r:

            async def main() -> dict[str, Any]:
                trigger = QueueDepthTrigger(
                    queue=path, provider="pubsub", max_depth=0, conn_id="pubsub_edited", poll_interval=0.3
                )
                waiting = asyncio.ensure_future(first_event(trigger))
                deadline = time.monotonic() + 120
                while emu.request_counts().get("timeSeries.list", 0) < 2:  # the group polls
                    assert time.monotonic() < deadline and not waiting.done()
                    await asyncio.sleep(0.05)
                conn["extra"]["monitoring_endpoint"] = r.url  # the edit, as the triggerer sees it
                os.environ["AIRFLOW_CONN_PUBSUB_EDITED"] = json.dumps(conn)
                # answered, not only received: a read still on its way when the queue is drained
                # would see it empty, and the wait would end on the edited endpoint's first read
                while r.answered("timeSeries") < 1:
                    assert time.monotonic() < deadline, "the edited connection was never used"
                    assert not waiting.done(), waiting.result()
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(drain, sub, path, 3)
                return await asyncio.wait_for(waiting, 120)

            event = asyncio.run(main())
            after = r.count("timeSeries")
        assert event["status"] == "success" and event["depth"] == 0, event
        assert after >= 2  # its reads after the edit, through the edited endpoint
    finally:
        sub.delete_subscription(subscription=path)
        pub.delete_topic(topic=topic)


def drain(sub: Any, path: str, n: int) -> None:
    """A worker: pull ``n`` messages and acknowledge them."""
    ack_ids: list[str] = []
    deadline = time.monotonic() + 120
    while len(ack_ids) < n:
        assert time.monotonic() < deadline, f"only {len(ack_ids)} of {n} messages delivered"
        got = sub.pull(subscription=path, max_messages=n - len(ack_ids))
        ack_ids += [m.ack_id for m in got.received_messages]
    sub.acknowledge(subscription=path, ack_ids=ack_ids)

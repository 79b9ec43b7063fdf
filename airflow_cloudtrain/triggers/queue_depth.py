"""Waiting on a queue's depth: the shared readers, the pure decision, the trigger.

A ``DepthReader`` (``hooks.depth``: the protocol lives below its users) reads queue depths for one
connection and location; each cloud is one small hook (``hooks.sqs.SqsDepthReader``:
GetQueueAttributes; ``hooks.pubsub.PubSubDepthReader``: Cloud Monitoring's
``subscription/num_undelivered_messages``), picked by ``clouds.registry.depth_reader``. Deferred sensors in one triggerer share one
reader per (provider, connection, [project,] location) and, through ``shared_poll.watch``, one depth
call per queue per poll: twenty sensors on the same queue cost one GetQueueAttributes (or one
Monitoring ``timeSeries.list``) per poll interval, not twenty. The reader's clients live as long as
its poll group and are closed when the group's last watcher leaves.

A queue that does not exist is never read as empty (``missing``: the wait fails naming it); a queue
whose depth is not known yet (``DepthNotKnownYet``: a new Pub/Sub subscription Monitoring has no
sample of) is never read as 0 either: the wait goes on, logged, until a depth comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Hashable
from contextlib import aclosing, asynccontextmanager
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.hooks.depth import (  # the protocol lives below its users
    PROVIDERS,
    DepthNotKnownYet,
    DepthReader,
    QueueDepth,
    QueueNotFound,
)
from airflow_cloudtrain.triggers import shared_poll

__all__ = [
    "PROVIDERS",
    "DepthNotKnownYet",
    "DepthReader",
    "QueueDepth",
    "QueueDepthTrigger",
    "QueueNotFound",
    "depth_reader",
    "evaluate_depth",
    "watch_depth",
]


def depth_reader(
    provider: str, conn_id: str | None, region: str | None, project_id: str | None = None
) -> DepthReader:
    """The reader for a queue provider ("sqs", "pubsub"), bound to a connection and location (and,
    for Pub/Sub, the project bare subscription names are in): ``clouds.registry.depth_reader``."""
    from airflow_cloudtrain.clouds.registry import depth_reader as registry_depth_reader

    return registry_depth_reader(provider, conn_id, region, project_id)


def evaluate_depth(
    depth: QueueDepth, max_depth: int | None, min_depth: int | None, count_in_flight: bool = True
) -> dict[str, Any] | None:
    """Pure: success when the depth crossed the threshold, error when the queue does not exist,
    else None (keep waiting); a depth with an ``error`` (failed, or not known yet) decides nothing."""
    if depth.missing:
        return {
            "status": "error",
            "queue": depth.queue,
            "message": f"queue {depth.queue} does not exist (a missing queue is never taken as empty)",
        }
    if depth.error is not None:
        return None
    n = depth.depth(count_in_flight)
    if (max_depth is not None and n <= max_depth) or (min_depth is not None and n >= min_depth):
        return {"status": "success", **depth.result(count_in_flight), "at": time.time()}
    return None


# One reader per poll-group key, counted by the watchers using it: its async client is closed when
# the last one leaves (which is when the shared poll's group for that key has ended).
_readers: dict[Hashable, list[Any]] = {}  # key -> [reader, users]


@asynccontextmanager
async def shared_reader(
    provider: str, conn_id: str | None, region: str | None, project_id: str | None = None
) -> AsyncIterator[DepthReader]:
    key = (provider, conn_id, project_id, region)  # SQS has no project: None
    entry = _readers.get(key)
    if entry is None:
        entry = _readers[key] = [depth_reader(provider, conn_id, region, project_id), 0]
    entry[1] += 1
    try:
        yield entry[0]
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            if _readers.get(key) is entry:  # out of the registry first: a newcomer opens a fresh one
                del _readers[key]
            with contextlib.suppress(Exception):  # a client that will not close cleanly is gone anyway
                await entry[0].aclose()


async def watch_depth(
    provider: str,
    conn_id: str | None,
    region: str | None,
    queue: str,
    interval: float,
    project_id: str | None = None,
) -> AsyncGenerator[QueueDepth, None]:
    """The queue's depth after every shared poll. A depth not known yet (``DepthNotKnownYet``) is
    yielded as is (its ``error`` set) for the caller to log and wait on. Transient errors
    (throttling, 5xx, dropped connections) are waited out with backoff within a budget; others end
    the watch."""
    from airflow_cloudtrain.core.retry import TransientBudget

    budget = TransientBudget(base_s=interval)
    while True:
        try:
            async with shared_reader(provider, conn_id, region, project_id) as reader:
                stream = shared_poll.watch(reader.key, [queue], reader.read_async, interval)
                async with aclosing(stream):
                    async for snapshot in stream:
                        depth = snapshot.get(queue)
                        if depth is None:
                            continue
                        if depth.error is not None and not isinstance(depth.error, DepthNotKnownYet):
                            raise depth.error
                        budget.ok()  # an answer, even "no data yet", is a good poll
                        yield depth
        except asyncio.CancelledError:
            raise
        except Exception as err:
            await asyncio.sleep(budget.failed(err))


class QueueDepthTrigger(BaseTrigger):
    """Fires when the queue's depth is <= ``max_depth`` or >= ``min_depth``; fails at once when the
    queue does not exist; waits (logged) while the depth is not known yet. ``queue`` is what the
    reader reads by (an SQS queue URL, a Pub/Sub subscription path); for Pub/Sub ``conn_id`` is the
    Google connection and ``project_id`` the project (``region`` unused).

    :param queue: what the reader reads by: an SQS queue URL or a Pub/Sub subscription path.
    :param max_depth: fire once the depth is at most this (a queue drained).
    :param min_depth: fire once the depth is at least this (a backlog built up).
    :param count_in_flight: count received-but-not-deleted and delayed messages (SQS) in the depth.
    :param provider: the queue provider, ``"sqs"`` or ``"pubsub"``.
    :param conn_id: the Airflow connection (AWS for SQS, Google for Pub/Sub).
    :param region: the SQS region (None: the connection's); unused for Pub/Sub.
    :param project_id: the Google project (None: the connection's); unused for SQS.
    :param poll_interval: seconds between depth reads (shared by every trigger on the same queue).
    """

    def __init__(
        self,
        queue: str,
        max_depth: int | None = None,
        min_depth: int | None = None,
        count_in_flight: bool = True,
        provider: str = "sqs",
        conn_id: str | None = "aws_default",
        region: str | None = None,
        project_id: str | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        super().__init__()
        self.queue = queue
        self.max_depth = max_depth
        self.min_depth = min_depth
        self.count_in_flight = count_in_flight
        self.provider = provider
        self.conn_id = conn_id
        self.region = region
        self.project_id = project_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue": self.queue,
                "max_depth": self.max_depth,
                "min_depth": self.min_depth,
                "count_in_flight": self.count_in_flight,
                "provider": self.provider,
                "conn_id": self.conn_id,
                "region": self.region,
                "project_id": self.project_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        stream = watch_depth(
            self.provider, self.conn_id, self.region, self.queue, self.poll_interval, self.project_id
        )
        event: dict[str, Any] | None = None
        last: int | str | None = None
        try:
            async with aclosing(stream):
                async for depth in stream:
                    event = evaluate_depth(depth, self.max_depth, self.min_depth, self.count_in_flight)
                    if event is not None:
                        break
                    if depth.error is not None:  # not known yet (other errors end the watch)
                        if last != "unknown":
                            last = "unknown"
                            self.log.info("Queue %s: %s; waiting", self.queue, depth.error)
                    elif depth.depth(self.count_in_flight) != last:
                        last = depth.depth(self.count_in_flight)
                        self.log.info("Queue %s: depth %d, waiting", self.queue, last)
            yield TriggerEvent(event)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            yield TriggerEvent(
                {
                    "status": "error",
                    "queue": self.queue,
                    "message": f"reading the depth of queue {self.queue} failed: {err}",
                }
            )

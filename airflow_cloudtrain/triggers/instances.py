"""Triggers that wait on instances: a target state (sensor) or the end of a run (operator)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.clouds.base import Instance
from airflow_cloudtrain.triggers import shared_poll

MAX_CONSECUTIVE_ERRORS = 5
# From which states can a target never be reached? (terminated is forever; stopped comes back only
# through a start call, which nobody waiting here will make.)
UNREACHABLE: dict[str, frozenset[str]] = {
    "running": frozenset({"shutting-down", "terminated"}),
    "pending": frozenset({"shutting-down", "terminated", "stopping", "stopped"}),
    "stopped": frozenset({"shutting-down", "terminated"}),
    "stopping": frozenset({"shutting-down", "terminated"}),
    "shutting-down": frozenset(),
    "terminated": frozenset(),
}


def describer(cloud: str, conn_id: str | None, region: str | None, project_id: str | None = None):
    """(group key, async describe function) for one cloud connection and region."""
    if cloud in ("ec2", "ec2spot"):
        from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

        hook = CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region)
        return ("aws", conn_id, region), hook.describe_async
    import functools

    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    # For GCE "region" is the zone the instances live in: one list call per (connection, project, zone).
    gcp = CloudTrainGcpHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id)
    return ("gcp", conn_id, project_id, region), functools.partial(gcp.describe_async, zone=region)


async def watch_instances(
    cloud: str,
    conn_id: str | None,
    region: str | None,
    ids: list[str],
    interval: float,
    project_id: str | None = None,
) -> AsyncIterator[dict[str, Instance]]:
    """Shared snapshots for ``ids``; transient describe errors are retried a few polls in a row."""
    key, describe = describer(cloud, conn_id, region, project_id)
    errors = 0
    while True:
        try:
            async with aclosing(shared_poll.watch(key, ids, describe, interval)) as stream:
                async for snapshot in stream:
                    errors = 0
                    yield snapshot
        except asyncio.CancelledError:
            raise
        except Exception:
            errors += 1
            if errors >= MAX_CONSECUTIVE_ERRORS:
                raise
            await asyncio.sleep(interval)


class InstanceStateTrigger(BaseTrigger):
    """Fires when every instance is in ``target_state``; fails fast when one can never get there."""

    def __init__(
        self,
        cloud: str,
        instance_ids: list[str],
        target_state: str,
        conn_id: str | None,
        region: str | None,
        poll_interval: float = 15.0,
        project_id: str | None = None,
    ) -> None:
        super().__init__()
        self.cloud = cloud
        self.instance_ids = list(instance_ids)
        self.target_state = target_state
        self.conn_id = conn_id
        self.region = region
        self.poll_interval = poll_interval
        self.project_id = project_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "cloud": self.cloud,
                "instance_ids": self.instance_ids,
                "target_state": self.target_state,
                "conn_id": self.conn_id,
                "region": self.region,
                "poll_interval": self.poll_interval,
                "project_id": self.project_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        stream = watch_instances(
            self.cloud, self.conn_id, self.region, self.instance_ids, self.poll_interval, self.project_id
        )
        try:
            async with aclosing(stream):
                async for snapshot in stream:
                    event = evaluate_states(snapshot, self.instance_ids, self.target_state)
                    if event is not None:
                        break
            yield TriggerEvent(event)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            yield TriggerEvent({"status": "error", "message": f"describing instances failed: {err}"})


def evaluate_states(snapshot: dict[str, Instance], ids: list[str], target: str) -> dict[str, Any] | None:
    """Pure: success when all are at ``target``, error when one can never reach it, else None."""
    states = {i: snapshot[i].state for i in ids if i in snapshot}
    dead = {i: s for i, s in states.items() if s in UNREACHABLE.get(target, frozenset())}
    if dead:
        detail = ", ".join(f"{i} is {s}" for i, s in sorted(dead.items()))
        return {
            "status": "error",
            "states": states,
            "message": f"can never reach {target!r}: {detail}",
        }
    if len(states) == len(ids) and all(s == target for s in states.values()):
        return {"status": "success", "states": states, "at": time.time()}
    return None

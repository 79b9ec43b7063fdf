"""Triggers that wait on instances: a target state (sensor) or the end of a run (operator)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from contextlib import aclosing
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.clouds.registry import provider, provider_for_cloud
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.provider import InstancePoller
from airflow_cloudtrain.triggers import shared_poll
from airflow_cloudtrain.triggers.heap import freeze_long_lived

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


class FollowedPoller:
    """The poll group's poller (the provider's ``InstancePoller``: ``clouds.aws.pollers.Ec2Poller``,
    ``clouds.gcp.pollers.GcePoller``), made anew when its connection changed (``hooks.follow``:
    checked once a minute and after a failed describe), so an edited connection reaches a group that
    runs for days. Nothing is built on the event loop: the first describe, in a worker thread, makes
    the first poller."""

    def __init__(self, conn_id: str | None, make: Callable[[], InstancePoller]) -> None:
        from airflow_cloudtrain.hooks.follow import Following

        self.pollers: Following[InstancePoller] = Following(conn_id, make, lambda poller: poller.close())

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        try:
            return self.pollers.get().describe(ids)
        except Exception:
            self.pollers.failed()
            raise

    def close(self) -> None:
        self.pollers.close()


def _make_poller(key: Hashable) -> FollowedPoller:
    """The poll group's resource (this runs on the event loop: nothing is built yet). The key is the
    provider's ``poll_key``: its name first, its connection second."""
    assert isinstance(key, tuple)
    face = provider(str(key[0]))
    conn_id = None if key[1] is None else str(key[1])
    return FollowedPoller(face.conn(conn_id), lambda: face.instance_poller(key))


async def _close_poller(poller: FollowedPoller) -> None:
    await asyncio.to_thread(poller.close)


# One poller (one SDK client) per poll group, i.e. per (connection, region or zone) in a triggerer.
POLLERS: shared_poll.Pool[FollowedPoller] = shared_poll.Pool(_make_poller, _close_poller)


def poll_key(
    cloud: str, conn_id: str | None, location: str | None, project_id: str | None, ended_only: bool = False
) -> tuple[Hashable, ...]:
    """The shared poll group of a wait: the provider's (``Provider.poll_key``)."""
    return provider_for_cloud(cloud).poll_key(conn_id, location, project_id, ended_only)


async def watch_instances(
    cloud: str,
    conn_id: str | None,
    location: str | None,
    ids: list[str],
    interval: float,
    project_id: str | None = None,
    ended_only: bool = False,
) -> AsyncGenerator[dict[str, Instance], None]:
    """Shared snapshots for ``ids`` (``location``: the EC2 region or the GCE zone). Transient describe
    errors (throttling, 5xx) are waited out with backoff for minutes; others end the watch.

    Describes run in worker threads with the group's one client, closed when the group ends.
    ``ended_only`` (EC2): only stopped or ended instances are reported, the rest are left out.
    """
    key = poll_key(cloud, conn_id, location, project_id, ended_only)

    async def describe(wanted: list[str]) -> dict[str, Instance]:
        return await asyncio.to_thread(POLLERS.get(key).describe, wanted)

    stream = shared_poll.watch_with_retry(key, ids, describe, interval, close=POLLERS.closer(key))
    async with aclosing(stream):
        async for snapshot in stream:
            yield snapshot


class InstanceStateTrigger(BaseTrigger):
    """Fires when every instance is in ``target_state``; fails fast when one can never get there.

    :param cloud: the cloud name (``ec2``, ``ec2spot``, ``gcloud``, ``gcspot``).
    :param instance_ids: the instances (EC2 ids, GCE names).
    :param target_state: the state every instance must reach (``running``, ``stopped``, ``terminated``...).
    :param conn_id: the provider's Airflow connection (None: the provider's default).
    :param region: where the instances are described: the EC2 region or the GCE zone.
    :param poll_interval: seconds between describes (shared by every trigger of the same group).
    :param project_id: the Google project (None: the connection's); unused on AWS.
    :param missing_as_terminated: an id the cloud does not know counts as terminated, not an error.
    """

    def __init__(
        self,
        cloud: str,
        instance_ids: list[str],
        target_state: str,
        conn_id: str | None,
        region: str | None,
        poll_interval: float = 15.0,
        project_id: str | None = None,
        missing_as_terminated: bool = False,
    ) -> None:
        super().__init__()
        self.missing_as_terminated = missing_as_terminated
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
                "missing_as_terminated": self.missing_as_terminated,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        freeze_long_lived()  # once per process: see triggers.heap
        stream = watch_instances(
            self.cloud, self.conn_id, self.region, self.instance_ids, self.poll_interval, self.project_id
        )
        try:
            async with aclosing(stream):
                async for snapshot in stream:
                    event = evaluate_states(
                        snapshot, self.instance_ids, self.target_state, self.missing_as_terminated
                    )
                    if event is not None:
                        break
            yield TriggerEvent(event)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            yield TriggerEvent({"status": "error", "message": f"describing instances failed: {err}"})


def evaluate_states(
    snapshot: dict[str, Instance], ids: list[str], target: str, missing_as_terminated: bool = False
) -> dict[str, Any] | None:
    """Pure: success when all are at ``target``, error when one can never reach it, else None.

    An id the cloud does not know is its own answer (an error naming it): a typo or another
    account's id must not pass as "terminated". ``missing_as_terminated`` opts out of that.
    """
    missing = sorted(i for i in ids if i in snapshot and snapshot[i].missing)
    if missing and not missing_as_terminated:
        return {
            "status": "error",
            "states": {i: "not found" for i in missing},
            "message": f"instance(s) not found: {', '.join(missing)} (pass missing_as_terminated=True "
            "if an instance that is gone should count as terminated)",
        }
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

"""The fleet's deferred wait: the same ``FleetWatch`` the blocking wait runs, off the event loop.

A fleet's poll is a handful of calls (queue depth, the group, its members, new outcomes) and a scaling
call when the backlog grows, whatever the number of items; it runs in a worker thread
(``asyncio.to_thread``) so the triggerer's loop never waits on it, and scaling and the end are
decided exactly as in blocking mode. ``on_kill`` (the user killed the deferred task) tears the fleet
down through the ledger's search by name and tag, since the triggerer has no task state store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.core.retry import TransientBudget
from airflow_cloudtrain.triggers.handover import killed_by_user

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch


class FleetTrigger(BaseTrigger):
    """Waits on a work-queue fleet in the triggerer, as ``SpotFleetOperator`` /
    ``PreemptibleGroupOperator`` do in blocking mode, and fires one event when it is over.

    The event is ``{"status": "done", "handle": ...}`` when every item has an outcome, else
    ``{"status": "error", "message": ..., "handle": ...}`` (the group is gone, no worker started, or
    the watch failed); the task's ``execute_complete`` releases and delivers either way.

    :param handle: the ``FleetHandle`` as a plain dict (``FleetHandle.to_dict()``): run id and key,
        cloud, region (and GCE zone), queue, dead-letter source, group, item ids, prices.
    :param conn_id: the provider's Airflow connection (``aws_conn_id`` or ``gcp_conn_id``); None for
        AWS's default credential chain.
    :param poll_interval: seconds between two polls of the fleet.
    :param startup_timeout: seconds without any worker running while items wait before the fleet
        fails (None: no limit).
    :param project_id: the GCP project (GCP only; None: the connection's).
    :param heartbeat_timeout: seconds a running worker's record may stay unchanged before the group
        replaces it (its agent died; None: never).
    """

    def __init__(
        self,
        handle: dict[str, Any],
        conn_id: str | None,
        poll_interval: float = 10.0,
        startup_timeout: float | None = 1800.0,
        project_id: str | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.heartbeat_timeout = heartbeat_timeout
        self.handle = handle
        self.conn_id = conn_id
        self.project_id = project_id
        self.poll_interval = poll_interval
        self.startup_timeout = startup_timeout

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "handle": self.handle,
                "conn_id": self.conn_id,
                "poll_interval": self.poll_interval,
                "startup_timeout": self.startup_timeout,
                "project_id": self.project_id,
                "heartbeat_timeout": self.heartbeat_timeout,
            },
        )

    def _backend(self) -> RunBackend:
        """The run backend of the fleet's cloud: ``conn_id`` is that provider's connection (the other
        provider's arguments are ignored by the registry)."""
        from airflow_cloudtrain.clouds.registry import backend_for

        return backend_for(
            self.handle["cloud"],
            region=self.handle["region"],
            aws_conn_id=self.conn_id,
            gcp_conn_id=self.conn_id or "google_cloud_default",
            project_id=self.project_id,
        )

    def _watch(self) -> FleetWatch:
        from airflow_cloudtrain.clouds.registry import fleet_backend_for
        from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle
        from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch

        backend = self._backend()
        handle = FleetHandle.from_dict(self.handle)
        cloud = fleet_backend_for(backend, handle.zone)
        log = cast("logging.Logger", self.log)
        folder = backend.run_folder(handle.run_uri)
        return FleetWatch(
            handle, cloud, folder, log, self.startup_timeout, heartbeat_timeout=self.heartbeat_timeout
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_cloudtrain.core.engine import apoll_until

        event: dict[str, Any]
        try:
            watch = await asyncio.to_thread(self._watch)

            async def poll() -> bool | None:
                return True if await asyncio.to_thread(watch.poll) else None

            def transient(err: BaseException, delay: float) -> None:
                self.log.warning("Transient error while watching the fleet (%s); retrying", err)

            await apoll_until(poll, self.poll_interval, on_transient=transient)
            event = {"status": "done", "handle": self.handle}
        except asyncio.CancelledError:
            raise
        except Exception as err:
            event = {"status": "error", "message": f"{type(err).__name__}: {err}", "handle": self.handle}
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The user killed the deferred task: delete group, template, queues and workers."""
        if not await killed_by_user(self, self.log):
            return
        await asyncio.to_thread(self._release)
        self.log.info("Released fleet %s because the task was killed", self.handle.get("run_id"))

    def _release(self) -> None:
        from airflow_cloudtrain.core.ledger import ResourceLedger
        from airflow_cloudtrain.lifecycle.fleet.run import release_fleet
        from airflow_cloudtrain.lifecycle.running_entry import RunningEntry

        log = logging.getLogger(__name__)
        ledger = ResourceLedger(self.handle["run_key"], logger=log)
        backend = self._backend()
        release_fleet(ledger, backend, TransientBudget(budget_s=25.0, cap_s=5.0))
        entry = RunningEntry.from_dict(self.handle.get("index"))
        if entry is not None:  # out of the bucket's running index too
            entry.clear(backend.run_folder(entry.bucket), log)

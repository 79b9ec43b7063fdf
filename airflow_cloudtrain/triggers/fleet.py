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
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.core.retry import TransientBudget


class FleetTrigger(BaseTrigger):
    """Kwargs are plain JSON: the ``FleetHandle`` as a dict, the connection, and the wait settings."""

    def __init__(
        self,
        handle: dict[str, Any],
        conn_id: str | None,
        poll_interval: float = 10.0,
        startup_timeout: float | None = 1800.0,
        project_id: str | None = None,
    ) -> None:
        super().__init__()
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
            },
        )

    def _backend(self) -> Any:
        from airflow_cloudtrain.clouds.registry import backend_for
        from airflow_cloudtrain.contract.clouds import provider_of

        conn = {"aws_conn_id": self.conn_id}
        if provider_of(self.handle["cloud"]) == "gcp":
            conn = {"gcp_conn_id": self.conn_id or "google_cloud_default", "project_id": self.project_id}
        return backend_for(self.handle["cloud"], region=self.handle["region"], **conn)

    def _watch(self) -> Any:
        from airflow_cloudtrain.lifecycle.fleet.run import FleetHandle, fleet_module
        from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch

        backend = self._backend()
        handle = FleetHandle.from_dict(self.handle)
        cloud = fleet_module(backend.provider).fleet_of(backend, *([handle.zone] if handle.zone else []))
        return FleetWatch(handle, cloud, backend.run_folder(handle.run_uri), self.log, self.startup_timeout)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        budget = TransientBudget()
        event: dict[str, Any] = {"status": "error", "message": "the fleet watch ended", "handle": self.handle}
        try:
            watch = await asyncio.to_thread(self._watch)
            while True:
                try:
                    done = await asyncio.to_thread(watch.poll)
                    budget.ok()
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    delay = budget.failed(err)  # re-raises when not transient or lasting too long
                    self.log.warning("Transient error while watching the fleet (%s); retrying", err)
                    await asyncio.sleep(delay)
                    continue
                if done:
                    event = {"status": "done", "handle": self.handle}
                    break
                await asyncio.sleep(self.poll_interval)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            event = {"status": "error", "message": f"{type(err).__name__}: {err}", "handle": self.handle}
        yield TriggerEvent(event)

    async def on_kill(self) -> None:
        """The user killed the deferred task: delete group, template, queues and workers."""
        await asyncio.to_thread(self._release)
        self.log.info("Released fleet %s because the task was killed", self.handle.get("run_id"))

    def _release(self) -> None:
        from airflow_cloudtrain.core.ledger import ResourceLedger
        from airflow_cloudtrain.lifecycle.fleet.run import release_fleet

        ledger = ResourceLedger(self.handle["run_key"], logger=logging.getLogger(__name__))
        release_fleet(ledger, self._backend(), TransientBudget(budget_s=25.0, cap_s=5.0))

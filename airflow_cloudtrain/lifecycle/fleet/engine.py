"""The work-queue fleet as an ``Engine``: ``FleetRun`` (make, re-attach, release) and ``FleetWatch``
(scale, outcomes, the XCom) driven by ``operators.base.EngineOperator``.

``start`` makes the fleet; ``wait`` polls the watch (``core.engine.poll_until``, cut short by a kill)
or the triggerer runs the same watch (``triggers.fleet.FleetTrigger``, named by classpath); ``advance``
releases and delivers the result, failing the task when items failed for good (unless allowed).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle
from airflow_cloudtrain.lifecycle.fleet.run import FleetKilled
from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch

if TYPE_CHECKING:
    from airflow_cloudtrain.core.engine import Step, TriggerSpec
    from airflow_cloudtrain.lifecycle.fleet.run import FleetRun

TRIGGER = "airflow_cloudtrain.triggers.fleet.FleetTrigger"  # stored in Airflow's DB: never rename


class FleetEngine:
    """``SpotFleetOperator`` / ``PreemptibleGroupOperator``'s engine. The handle is a ``FleetHandle``;
    the outcome of a wait is ``True`` (every item has an outcome, or the queue stayed empty)."""

    def __init__(
        self,
        fleet: FleetRun,
        log: logging.Logger,
        startup_timeout: float | None,
        poll_interval: float,
        project_id: str | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.fleet = fleet
        self.log = log
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.poll_interval = poll_interval
        self.project_id = project_id
        self._watch: FleetWatch | None = None

    def watch(self, handle: FleetHandle) -> FleetWatch:
        """The run's watch (one per handle: it remembers what it has seen)."""
        if self._watch is None or self._watch.handle is not handle:
            self._watch = FleetWatch(
                handle,
                self.fleet.cloud,
                self.fleet.folder,
                self.log,
                self.startup_timeout,
                heartbeat_timeout=self.heartbeat_timeout,
            )
        return self._watch

    def start(self) -> Step[FleetHandle]:
        from airflow_cloudtrain.core.engine import Step

        handle = self.fleet.start()
        self.log.info(
            "Fleet %s: %d item(s), run folder %s", handle.run_id, len(handle.item_ids), handle.run_uri
        )
        return Step.waiting(handle)

    def over(self, handle: FleetHandle) -> bool:
        """Is the fleet already done (every item has an outcome)? One poll, just before deferring: a
        trigger that fires within seconds of the deferral hits Airflow's race in which the scheduler
        applies the stale "success" of the defer exit to the resumed try and fails the task
        (apache/airflow#66374). A fleet already done is finished in the worker (the wait sees it on
        its first poll). Never raises: when in doubt (or when the poll fails), defer."""
        try:
            over = self.watch(handle).poll()
        except Exception as err:
            self.log.warning("Could not check the fleet before deferring (%s); deferring", err)
            return False
        if over:
            self.log.info("Every item already has an outcome: finishing in the worker, not deferring")
        return over

    def trigger(self, handle: FleetHandle) -> TriggerSpec:
        from airflow_cloudtrain.core.engine import TriggerSpec

        return TriggerSpec(
            TRIGGER,
            {
                "handle": handle.to_dict(),
                "conn_id": self.fleet.ctx.conn_id,
                "poll_interval": self.poll_interval,
                "startup_timeout": self.startup_timeout,
                "project_id": self.project_id,
                "heartbeat_timeout": self.heartbeat_timeout,
            },
        )

    def wait(self, handle: FleetHandle) -> bool:
        from airflow_cloudtrain.core.engine import poll_until

        watch, fleet = self.watch(handle), self.fleet

        def poll() -> bool | None:
            if fleet.killed:
                raise FleetKilled("the task was killed")
            return True if watch.poll() else None

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error while watching the fleet (%s); retrying", err)

        return poll_until(poll, self.poll_interval, stopped=lambda: fleet.killed, on_transient=transient)

    def advance(self, handle: FleetHandle, outcome: Any) -> Step[FleetHandle]:
        """Release, then deliver: the XCom, or the "failed for good" error."""
        from airflow_cloudtrain.core.engine import Step

        return Step.finished(self.deliver(self.watch(handle)))

    def resume(self, event: Any) -> Step[FleetHandle]:
        """Back from ``FleetTrigger``: ``{"status": "done" | "error", "handle": ..., "message": ...}``
        (the same shape every release's trigger sends)."""
        from airflow.exceptions import AirflowException

        handle = FleetHandle.from_dict(event["handle"])
        if event.get("status") != "done":
            self.fleet.release()
            raise AirflowException(
                f"fleet {handle.run_id} failed: {event.get('message', event.get('status'))}"
            )
        return self.advance(handle, True)

    def abandon(self, reason: str) -> None:
        self.fleet.release()

    def kill(self) -> None:
        self.fleet.kill()

    def _index_cost(self, result: dict[str, Any]) -> None:
        """The fleet's row in the bucket's cost index (``lifecycle.cost_index``; best effort)."""
        import time

        from airflow_cloudtrain.lifecycle.cost_index import fleet_record, write_record

        ctx = self.fleet.ctx
        try:
            bucket = ctx.backend.run_folder(ctx.config.bucket)
        except Exception as err:
            self.log.warning("Could not add the fleet to the bucket's cost index (%s)", err)
            return
        write_record(bucket, fleet_record(result, ctx.key, time.time(), ctx.operator), self.log)

    def deliver(self, watch: FleetWatch) -> dict[str, Any]:
        from airflow.exceptions import AirflowException

        fleet = self.fleet
        watch.refresh()  # workers launched after the last poll count too
        fleet.release(unindex=False)  # the running record goes once the priced one is written
        backend, gpus = fleet.ctx.backend, fleet.ctx.config.hardware.gpus
        result = watch.result(
            charged=lambda itype, zone, spot, start, end: backend.charged_prices(
                itype, zone, spot, gpus, start, end
            )
        )
        self._index_cost(result)
        fleet.unindex()
        self.log.info(
            "Fleet %s: %d/%d item(s) succeeded on %d worker(s), %d interruption(s), $%.6f",
            result["run_id"],
            result["items_succeeded"],
            result["items_total"],
            result["workers_launched"],
            result["interruptions"],
            result["cost_usd"],
        )
        if result["items_duplicated"]:
            self.log.warning(
                "Item(s) %s ran twice (a lease expired while the first worker was alive); the first "
                "result is kept",
                ", ".join(result["items_duplicated"]),
            )
        if result["items_failed"] and not fleet.ctx.fleet.allow_failed_items:
            failed = ", ".join(result["items_failed"])
            raise AirflowException(
                f"{len(result['items_failed'])} of {result['items_total']} item(s) failed for good: "
                f"{failed} (run {result['run_id']}; allow_failed_items=True to succeed anyway)"
            )
        return result

"""WorkQueueOperator: what SpotFleetOperator (EC2) and PreemptibleGroupOperator (GCE) share.

A queue of work items on a group of workers: the items come from an upstream task, each runs
``command`` once on some worker (``CLOUDTRAIN_WORK_ITEM``, ``CLOUDTRAIN_ITEM_ID``), workers leave when
the queue is empty, and the queue, group and template are deleted at the end, whatever happens. The
fleet itself is ``lifecycle.fleet`` (make, re-attach, release; ``lifecycle.gce_fleet`` on GCE) and
``lifecycle.fleet_watch`` (scale, outcomes, XCom); these classes are configuration and Airflow glue.
The subclasses say which clouds they take (``_check_cloud``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.links.run import RunFolderLink, WorkerGroupLink
from airflow_cloudtrain.operators.checks import check_path
from airflow_cloudtrain.operators.cloud_train import TEMPLATED, CloudTrainOperator
from airflow_cloudtrain.operators.config import parse_duration
from airflow_cloudtrain.operators.fleet_config import (
    MAX_LEASE_S,
    is_deferred_value,
    parse_fleet_args,
    parse_work_items,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.lifecycle.fleet.run import FleetHandle, FleetRun
    from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch


class WorkQueueOperator(CloudTrainOperator):
    """Run ``command`` once per item of ``work_items`` on a group of workers (see the subclasses)."""

    template_fields: Sequence[str] = (*TEMPLATED, "work_items")
    max_lease_s: float = MAX_LEASE_S  # the queue's longest lease, and how the error names it
    lease_limit = "12 h"
    template_fields_renderers = {"env": "json", "setup_cmds": "py", "command": "bash", "work_items": "json"}
    ui_color = "#fde8f4"
    operator_extra_links = (WorkerGroupLink(), RunFolderLink())  # a fleet has no one instance to show

    def __init__(
        self,
        *,
        work_items: Any,
        cloud: str,
        num_workers: int = 1,
        max_workers: int | None = None,
        item_timeout: Any = None,
        max_item_attempts: int = 3,
        lease_timeout: Any = 120,
        checkpoint_dir: str | None = None,
        checkpoint_interval: Any = 60,
        allow_failed_items: bool = False,
        **kwargs: Any,
    ) -> None:
        self._check_cloud(cloud, kwargs.get("bid"))  # first: its error, not a warning about the bid
        super().__init__(cloud=cloud, **kwargs)
        self.work_items = work_items
        self.fleet_args = {
            "num_workers": num_workers,
            "max_workers": max_workers,
            "item_timeout": item_timeout,
            "max_item_attempts": max_item_attempts,
            "lease_timeout": lease_timeout,
            "allow_failed_items": allow_failed_items,
        }
        self.checkpoint_dir = check_path(checkpoint_dir, "checkpoint_dir", "/tmp/checkpoints")
        self.checkpoint_interval_s = parse_duration(checkpoint_interval, "checkpoint_interval") or 0.0
        self._fleet: FleetRun | None = None
        parse_fleet_args(self.fleet_args, None, self.max_lease_s, self.lease_limit)
        if not is_deferred_value(work_items):
            parse_work_items(work_items)

    def _check_cloud(self, cloud: Any, bid: Any) -> None:
        raise NotImplementedError

    # --- the run ---------------------------------------------------------------------------------

    def _new_fleet(self, context: Context) -> FleetRun:
        from airflow_cloudtrain.lifecycle.fleet.run import FleetContext, fleet_run
        from airflow_cloudtrain.lifecycle.prepare import JobOptions
        from airflow_cloudtrain.lifecycle.run.attempt import RunContext

        self._check_cloud(self.cloud, self.bid)
        config = self._config()  # rendered: every check again, the cloud-dependent ones too
        items = parse_work_items(self.work_items)
        settings = parse_fleet_args(self.fleet_args, items, self.max_lease_s, self.lease_limit)
        settings.poll_interval = self.poll_interval
        from airflow_cloudtrain.operators.secret_env import parse_secret_env  # the engines never import it

        secret_env = parse_secret_env(self.secret_env, config.cloud, config.env)
        base = RunContext.for_task(config, self, context, self.launch_options, self.wait, secret_env)
        job = JobOptions(checkpoint_dir=self.checkpoint_dir, checkpoint_interval_s=self.checkpoint_interval_s)
        ctx = FleetContext(
            config=config,
            fleet=settings,
            key=base.key,
            backend=base.backend,
            store=base.store,
            try_number=base.try_number,
            options=self.launch_options,
            job=job,
            log=self.log,
            conn_id=base.conn_id,
            secret_env=base.secret_env,
        )
        self._fleet = fleet_run(ctx)
        return self._fleet

    def _push_group_links(self, context: Context, fleet: FleetRun, handle: FleetHandle) -> None:
        """The group's and run folder's console links, as soon as the group exists (``links.run``)."""
        from airflow_cloudtrain.links.run import fleet_target, project_of, push_console_links

        try:
            push_console_links(context["ti"], self, fleet_target(handle, project_of(fleet.ctx.backend)))
        except Exception as err:
            self.log.warning("Could not publish the console links of group %s: %s", handle.group, err)

    def _watch(self, fleet: FleetRun, handle: FleetHandle) -> FleetWatch:
        from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch

        return FleetWatch(handle, fleet.cloud, fleet.folder, self.log, self.wait.startup_timeout)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_cloudtrain.core.retry import TransientBudget

        fleet = self._new_fleet(context)
        handle = fleet.start()
        self._push_group_links(context, fleet, handle)
        self.log.info(
            "Fleet %s: %d item(s), run folder %s", handle.run_id, len(handle.item_ids), handle.run_uri
        )
        watch = self._watch(fleet, handle)
        if self.deferrable and not self._over(watch):  # a fleet already done finishes here
            from airflow_cloudtrain.triggers.fleet import FleetTrigger

            self.defer(
                trigger=FleetTrigger(
                    handle=handle.to_dict(),
                    conn_id=fleet.ctx.conn_id,
                    project_id=self.project_id,
                    poll_interval=self.poll_interval,
                    startup_timeout=self.wait.startup_timeout,
                ),
                method_name="execute_complete",
            )
        budget = TransientBudget()
        try:
            while True:
                try:
                    if watch.poll():
                        break
                    budget.ok()
                    pause = self.poll_interval
                except Exception as err:
                    pause = budget.failed(err)  # re-raises when not transient or lasting too long
                    self.log.warning("Transient error while watching the fleet (%s); retrying", err)
                deadline = time.monotonic() + pause
                while time.monotonic() < deadline and not fleet.killed:
                    time.sleep(min(1.0, pause))
                if fleet.killed:
                    raise RuntimeError("the task was killed")
        except BaseException:
            fleet.release()
            raise
        return self._deliver_fleet(fleet, watch)

    def _over(self, watch: FleetWatch) -> bool:
        """Is the fleet already done (every item has an outcome)? One poll, just before deferring: a
        trigger that fires within seconds of the deferral hits Airflow's race in which the scheduler
        applies the stale "success" of the defer exit to the resumed try and fails the task
        (apache/airflow#66374). A fleet already done is finished in the worker (the wait below sees it
        on its first poll). Never raises: when in doubt (or when the poll fails), defer."""
        try:
            over = watch.poll()
        except Exception as err:
            self.log.warning("Could not check the fleet before deferring (%s); deferring", err)
            return False
        if over:
            self.log.info("Every item already has an outcome: finishing in the worker, not deferring")
        return over

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the trigger: result, teardown, and a failure for anything but a finished run."""
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.lifecycle.fleet.run import FleetHandle

        fleet = self._new_fleet(context)
        handle = FleetHandle.from_dict(event["handle"])
        if event.get("status") != "done":
            fleet.release()
            raise AirflowException(
                f"fleet {handle.run_id} failed: {event.get('message', event.get('status'))}"
            )
        return self._deliver_fleet(fleet, self._watch(fleet, handle))

    def _deliver_fleet(self, fleet: FleetRun, watch: FleetWatch) -> dict[str, Any]:
        from airflow.exceptions import AirflowException

        watch.refresh()  # workers launched after the last poll count too
        fleet.release()
        result = watch.result()
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

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that crashed or timed out resumes with ``__fail__``: tear the fleet down first."""
        if next_method == "__fail__":
            try:
                self._new_fleet(context).release()
                self.log.info("Released the fleet's resources after the deferred wait failed")
            except Exception:
                self.log.exception("Teardown after the failed deferral did not complete")
        return super(CloudTrainOperator, self).resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        if self._fleet is not None:
            self._fleet.kill()

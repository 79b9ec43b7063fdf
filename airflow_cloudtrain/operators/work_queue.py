"""WorkQueueOperator: what SpotFleetOperator (EC2) and PreemptibleGroupOperator (GCE) share.

A queue of work items on a group of workers: the items come from an upstream task, each runs
``command`` once on some worker (``CLOUDTRAIN_WORK_ITEM``, ``CLOUDTRAIN_ITEM_ID``), workers leave when
the queue is empty, and the queue, group and template are deleted at the end, whatever happens. The
run itself is ``lifecycle.fleet`` (``run.FleetRun``: make, re-attach, release; ``watch.FleetWatch``:
scale, outcomes, XCom; ``engine.FleetEngine`` on the one operator skeleton, ``operators.base``);
these classes are configuration: the run arguments they share with ``CloudTrainOperator``
(``operators.base``) and the work queue's own. The subclasses say which clouds they take
(``_check_cloud``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow_cloudtrain.links.run import RunFolderLink, WorkerGroupLink
from airflow_cloudtrain.operators.base import TEMPLATED, RunArgsOperator

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context

    from airflow_cloudtrain.core.engine import Engine
    from airflow_cloudtrain.lifecycle.fleet.engine import FleetEngine
    from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle
    from airflow_cloudtrain.lifecycle.fleet.run import FleetRun


class WorkQueueOperator(RunArgsOperator):
    """Run ``command`` once per item of ``work_items`` on a group of workers (see the subclasses)."""

    template_fields: Sequence[str] = (*TEMPLATED, "work_items", "max_cost")
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
        checkpoint_snapshots: bool = True,
        allow_failed_items: bool = False,
        idle_timeout: Any = None,
        max_cost: Any = None,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import check_bool, check_path
        from airflow_cloudtrain.operators.config import parse_duration
        from airflow_cloudtrain.operators.fleet_config import (
            is_deferred_value,
            parse_fleet_args,
            parse_work_items,
        )

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
        self.checkpoint_snapshots = check_bool(checkpoint_snapshots, "checkpoint_snapshots")
        # the hung-job watchdog, per item: an item whose job idles this long is a failed attempt
        self.idle_timeout_s = parse_duration(idle_timeout, "idle_timeout")
        self._fleet: FleetRun | None = None
        self.max_cost = max_cost
        self._max_cost_usd()
        parse_fleet_args(self.fleet_args, None, self.max_lease_s, self.lease_limit)
        if not is_deferred_value(work_items):
            parse_work_items(work_items)

    def _check_cloud(self, cloud: Any, bid: Any) -> None:
        raise NotImplementedError

    @property
    def max_lease_s(self) -> float:
        """The queue's longest lease (SQS's longest visibility timeout): ``contract.workqueue``'s, the
        cap the agent's queue puts on the lease it asks for. Read when the operator is constructed, not
        imported with it (importing stays cheap)."""
        from airflow_cloudtrain.contract.workqueue import SQS_MAX_LEASE_S

        return SQS_MAX_LEASE_S

    # --- the run: a FleetEngine on the operator skeleton ------------------------------------------

    def _new_fleet(self, context: Context) -> FleetRun:
        from airflow_cloudtrain.lifecycle.fleet.run import FleetContext, FleetRun
        from airflow_cloudtrain.lifecycle.prepare import JobOptions
        from airflow_cloudtrain.lifecycle.run.attempt import RunContext
        from airflow_cloudtrain.operators.fleet_config import parse_fleet_args, parse_work_items

        self._check_cloud(self.cloud, self.bid)
        config = self._config()  # rendered: every check again, the cloud-dependent ones too
        items = parse_work_items(self.work_items)
        settings = parse_fleet_args(self.fleet_args, items, self.max_lease_s, self.lease_limit)
        settings.poll_interval = self.poll_interval
        settings.max_cost_usd = self._max_cost_usd()
        settings.orphan_timeout_s = self._wait_settings(config).orphan_timeout  # the fleet's lease
        from airflow_cloudtrain.operators.secret_env import parse_secret_env  # the engines never import it

        secret_env = parse_secret_env(getattr(self, "secret_env", None), config.cloud, config.env)
        base = RunContext.for_task(config, self, context, self.launch_options, self.wait, secret_env)
        job = JobOptions(
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_interval_s=self.checkpoint_interval_s,
            checkpoint_snapshots=self.checkpoint_snapshots,
            idle_timeout_s=self.idle_timeout_s,
        )
        ctx = FleetContext(
            config=config,
            fleet=settings,
            key=base.key,
            backend=base.backend,
            store=base.store,
            try_number=base.try_number,
            options=self.launch_options,
            job=job,
            log=self._logger(),
            conn_id=base.conn_id,
            secret_env=base.secret_env,
            project_id=self.project_id,
            operator=type(self).__name__,
        )
        self._fleet = FleetRun(ctx)
        return self._fleet

    def _logger(self) -> logging.Logger:
        """The task's logger (Airflow's type for it is a structural one: the standard methods)."""
        return cast("logging.Logger", self.log)

    def new_engine(self, context: Context) -> Engine[Any]:
        from airflow_cloudtrain.lifecycle.fleet.engine import FleetEngine

        return FleetEngine(
            self._new_fleet(context),
            self._logger(),
            self.wait.startup_timeout,
            self.poll_interval,
            self.project_id,
            heartbeat_timeout=self.wait.heartbeat_timeout,
        )

    def on_handle(self, context: Context, engine: Engine[Any], handle: Any) -> None:
        """The group's and run folder's console links, as soon as the group exists (``links.run``)."""
        from airflow_cloudtrain.links.run import fleet_target, project_of, push_console_links

        fleet: FleetEngine = engine  # type: ignore[assignment]
        target: FleetHandle = handle
        try:
            push_console_links(context["ti"], self, fleet_target(target, project_of(fleet.fleet.ctx.backend)))
        except Exception as err:
            self.log.warning("Could not publish the console links of group %s: %s", target.group, err)

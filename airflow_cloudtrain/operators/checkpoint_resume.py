"""CheckpointResumeOperator: a spot run that survives interruptions and resumes from its checkpoint.

One task is the whole loop: launch, wait (deferred: no worker slot), and on an interruption release
and relaunch, the job resuming from the newest complete checkpoint in the run folder, until the job
ends, a budget is spent or the deadline policy says otherwise. The loop itself is the engine
``lifecycle.resume.engine.ResumeRun`` over ``lifecycle.resume.loop.RecoveryLoop`` (history, attempts,
ledger) and ``lifecycle.resume.recovery`` (decisions), driven by the operator skeleton
(``operators.base.EngineOperator``); this class is configuration, like ``CloudTrainOperator``, whose
arguments it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.operators.cloud_train import TEMPLATED, CloudTrainOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.core.engine import Engine
    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop


class CheckpointResumeOperator(CloudTrainOperator):
    """Run ``command`` on spot capacity until it finishes, resuming after every interruption.

    Takes every ``CloudTrainOperator`` argument, plus ``checkpoint_dir``, ``checkpoint_interval``,
    ``max_restarts`` (interruptions tolerated), ``max_restarts_on_errors`` (relaunches after the job
    itself failed), ``resume_from`` (an earlier run id or run URI: continue from its checkpoints, in
    its run folder), ``policy`` (``"spot_first"`` or ``"deadline"``), ``on_demand_after``,
    ``deadline``, ``expected_duration`` and ``probe_interval`` (for ``"deadline"``), ``stop_grace``, ``idle_timeout`` and
    ``zones`` (the zones of one region a spot relaunch may move between).
    The XCom adds ``attempts`` (the per-attempt cost ledger), ``totals``, ``restarts``,
    ``resumed_step``, ``ledger_uri``, and ``num_nodes`` / ``nodes`` of the last attempt; ``cost_usd``
    is the sum over the ledger's rows (a gang's: one per node of each attempt).

    :param checkpoint_dir: Directory on the instance the job writes checkpoints to (synced to the run folder).
    :param checkpoint_interval: How often the agent syncs checkpoints (seconds or ``"5m"``).
    :param checkpoint_snapshots: Keep the files of ``checkpoint_dir`` that match no framework layout
        (``checkpoint.pt`` rewritten every epoch) too, each at its newest stable version (default
        True); False keeps only the layouts of docs/checkpoints.md and warns about the rest.
    :param max_restarts: Interruptions tolerated before the task fails.
    :param max_restarts_on_errors: Relaunches after the job itself failed (0: fail at once).
    :param resume_from: An earlier run id or run URI whose checkpoints this run continues from.
    :param policy: ``"spot_first"`` or ``"deadline"`` (the spot policy engine).
    :param on_demand_after: With ``spot_first``: interruptions after which on-demand is used.
    :param deadline: With ``deadline``: when the job must be done (a duration from the start).
    :param expected_duration: With ``deadline``: the job's compute time without interruptions.
    :param stop_grace: Time the job gets to checkpoint after an interruption notice.
    :param idle_timeout: Stop a job that used no CPU (and no GPU) for this long (the hung-job watchdog).
    :param zones: The zones of one region every launch may use, e.g. ``["us-east-1a", "us-east-1b"]``
        (default: the offers' own zones, as ``zone``/``region`` pick them). A spot (re)launch tries them
        least-recently-troubled first (preemptions, capacity errors), so after a preemption the run
        moves to another zone and resumes there from its checkpoint in the bucket; the ledger row says
        ``moved_from`` and ``move_reason``. Not with ``zone`` or ``subnet_id``; no moves across regions.
    :param probe_interval: With ``deadline``: how often (default ``"10m"``) the policy is asked, while
        an on-demand attempt runs, whether to leave it for spot. When it would, a spot instance is
        launched beside it (no capacity: nothing paid, the attempt goes on); once that one has booted
        the on-demand job is stopped with its checkpoint synced (ledger ``ended``: ``left_for_spot``)
        and the spot instance resumes from it. A gang (``num_nodes`` > 1) is asked between attempts only.
    :param checkpoint_ranks: With ``num_nodes`` > 1, whose ``checkpoint_dir`` is synced: ``"head"``
        (default: rank 0's only; on a relaunch every rank restores the head's newest complete
        checkpoint, so data-parallel ranks start from the same weights) or ``"all"`` (every rank syncs
        its own under its own prefix and restores its own rank's; for sharded state).

    A gang (``num_nodes`` > 1) is stopped, released and relaunched whole when any node is lost (with or
    without notice): one interruption per gang attempt; the ledger has a row per node of each attempt.

    Every ``CloudTrainOperator`` parameter applies too.
    """

    template_fields: Sequence[str] = (*TEMPLATED, "resume_from", "checkpoint_dir", "num_nodes")
    ui_color = "#fdf3e8"

    def __init__(
        self,
        *,
        checkpoint_dir: str | None = None,
        checkpoint_interval: Any = 300,
        checkpoint_snapshots: bool = True,
        max_restarts: int = 10,
        max_restarts_on_errors: int = 0,
        resume_from: str | None = None,
        policy: str = "spot_first",
        on_demand_after: int | None = None,
        deadline: Any = None,
        expected_duration: Any = None,
        stop_grace: Any = None,
        idle_timeout: Any = None,
        checkpoint_ranks: str = "head",
        zones: Sequence[str] | None = None,
        probe_interval: Any = None,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import check_bool
        from airflow_cloudtrain.operators.resume_config import (
            parse_checkpoint_ranks,
            parse_resume_args,
            parse_zones,
        )

        super().__init__(**kwargs)
        self.zones = parse_zones(
            zones,
            kwargs.get("cloud", "ec2"),
            kwargs.get("region"),
            kwargs.get("zone"),
            kwargs.get("subnet_id"),
        )
        self.checkpoint_ranks = parse_checkpoint_ranks(checkpoint_ranks)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_snapshots = check_bool(checkpoint_snapshots, "checkpoint_snapshots")
        self.resume_from = resume_from
        self.resume = parse_resume_args(
            kwargs.get("cloud", "ec2"),
            checkpoint_dir,
            checkpoint_interval,
            max_restarts,
            max_restarts_on_errors,
            resume_from,
            policy,
            on_demand_after,
            deadline,
            expected_duration,
            stop_grace,
            idle_timeout,
            probe_interval,
        )

    # -- the loop ------------------------------------------------------------------------------------
    def _loop(self, context: Context) -> RecoveryLoop:
        from airflow_cloudtrain.lifecycle.prepare import JobOptions
        from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
        from airflow_cloudtrain.lifecycle.resume.recovery import RecoverySettings
        from airflow_cloudtrain.operators.resume_config import parse_resume_from, zones_region

        config = self._config()  # rendered: every check again, the cloud-dependent ones too
        if self.zones:  # the offers and the backend are those of the zones' region
            config = replace(config, region=config.region or zones_region(self.zones, config.cloud))
        args = self.resume
        job = JobOptions(
            checkpoint_dir=self.checkpoint_dir or None,
            checkpoint_interval_s=args.checkpoint_interval_s,
            checkpoint_snapshots=self.checkpoint_snapshots,
            stop_grace_s=args.stop_grace_s,
            idle_timeout_s=args.idle_timeout_s,
            checkpoint_ranks=self.checkpoint_ranks,
        )
        ctx = self._run_context(config, context)
        ctx.job = job
        settings = RecoverySettings(
            cloud=config.cloud,
            max_restarts=args.max_restarts,
            max_restarts_on_errors=args.max_restarts_on_errors,
            policy=args.policy,
            on_demand_after=args.on_demand_after,
            expected_duration_s=args.expected_duration_s,
            relaunch_wait_s=min(300.0, max(5.0, 10 * self.poll_interval)),
            spot_price_ratio=self._price_ratio(config) if args.policy == "deadline" else 0.32,
            **self._budget_prices(config, ctx.wait.max_cost_usd, ctx.gang.num_nodes if ctx.gang else 1),
            zones=self.zones,
            probe_interval_s=args.probe_interval_s,
        )
        loop = RecoveryLoop(ctx, settings, job, parse_resume_from(self.resume_from, config.cloud))
        # a deadline given as a timedelta counts from the loop's first start, kept in its history
        loop.settings = replace(settings, deadline_at=args.deadline_at(loop.history.started_at))
        loop.history.deadline_at = loop.settings.deadline_at  # in the ledger: the timeline's line
        return loop

    def _price_ratio(self, config: Any) -> float:
        """Spot / on-demand price of the offer a spot launch would get, for the deadline policy."""
        from airflow_cloudtrain.lifecycle.prepare import offers_for
        from airflow_cloudtrain.lifecycle.resume.recovery import SPOT_OF

        offer = offers_for(replace(config, cloud=SPOT_OF[config.cloud]), None, self.log)[0]
        if offer.spot_price and offer.price:
            return float(offer.spot_price) / float(offer.price)
        return 0.32

    def _budget_prices(self, config: Any, max_cost: float | None, nodes: int) -> dict[str, Any]:
        """With ``max_cost``: the budget and what the next spot / on-demand launch costs per hour (the
        catalog's cheapest offers, every node), for the loop's budget rule (``recovery.within_budget``)."""
        if max_cost is None:
            return {}
        from airflow_cloudtrain.lifecycle.prepare import offers_for
        from airflow_cloudtrain.lifecycle.resume.recovery import ON_DEMAND_OF, SPOT_OF

        def hourly(cloud: str) -> float | None:
            try:
                offer = offers_for(replace(config, cloud=cloud), None, self.log)[0]
            except ValueError:  # nothing on that side fits: the rule then has no price to go by
                return None
            return None if offer.hourly is None else float(offer.hourly) * nodes

        return {
            "max_cost_usd": max_cost,
            "spot_hourly_usd": hourly(SPOT_OF[config.cloud]),
            "on_demand_hourly_usd": hourly(ON_DEMAND_OF[config.cloud]),
        }

    def new_engine(self, context: Context) -> Engine[Any]:
        """The loop (``lifecycle.resume.engine.ResumeRun``), built from the saved history on first
        use; when it cannot be (the bucket is down) after a failed deferral, a plain attempt of the
        same run key releases the run (``CloudTrainOperator._new_attempt``)."""
        from airflow_cloudtrain.lifecycle.resume.engine import ResumeRun

        return ResumeRun(lambda: self._loop(context), lambda: self._new_attempt(context), self.log)

    # The previous release deferred with these method names; a task it deferred resumes through
    # them after an upgrade, into the same skeleton (the engine reads either trigger's event).
    def attempt_complete(self, context: Context, event: Any = None) -> Any:
        """Back from a ``RunTrigger`` the previous release deferred on: ``execute_complete``."""
        return self.execute_complete(context, event)

    def wait_complete(self, context: Context, event: Any = None) -> Any:
        """Back from a timer the previous release deferred on: ``execute_complete``."""
        return self.execute_complete(context, event)

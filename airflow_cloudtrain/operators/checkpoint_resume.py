"""CheckpointResumeOperator: a spot run that survives interruptions and resumes from its checkpoint.

One task is the whole loop: launch, wait (deferred: no worker slot), and on an interruption release
and relaunch, the job resuming from the newest complete checkpoint in the run folder, until the job
ends, a budget is spent or the deadline policy says otherwise. The loop itself is
``lifecycle.loop.RecoveryLoop`` (history, attempts, ledger) and ``lifecycle.recovery`` (decisions);
this class is configuration and Airflow glue, like ``CloudTrainOperator``, whose arguments it takes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.operators.cloud_train import TEMPLATED, CloudTrainOperator, quiet_bid

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt


class CheckpointResumeOperator(CloudTrainOperator):
    """Run ``command`` on spot capacity until it finishes, resuming after every interruption.

    Takes every ``CloudTrainOperator`` argument, plus ``checkpoint_dir``, ``checkpoint_interval``,
    ``max_restarts`` (interruptions tolerated), ``max_restarts_on_errors`` (relaunches after the job
    itself failed), ``resume_from`` (an earlier run id or run URI: continue from its checkpoints, in
    its run folder), ``policy`` (``"spot_first"`` or ``"deadline"``), ``on_demand_after``,
    ``deadline`` and ``expected_duration`` (for ``"deadline"``), ``stop_grace`` and ``idle_timeout``.
    The XCom adds ``attempts`` (the per-attempt cost ledger), ``totals``, ``restarts``,
    ``resumed_step`` and ``ledger_uri``; ``cost_usd`` is the sum over the attempts.
    """

    template_fields: Sequence[str] = (*TEMPLATED, "resume_from", "checkpoint_dir")
    ui_color = "#fdf3e8"

    def __init__(
        self,
        *,
        checkpoint_dir: str | None = None,
        checkpoint_interval: Any = 300,
        max_restarts: int = 10,
        max_restarts_on_errors: int = 0,
        resume_from: str | None = None,
        policy: str = "spot_first",
        on_demand_after: int | None = None,
        deadline: Any = None,
        expected_duration: Any = None,
        stop_grace: Any = None,
        idle_timeout: Any = None,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.resume_config import parse_resume_args

        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_dir
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
        )
        self._loop_obj: RecoveryLoop | None = None
        self._killed = False

    # -- the loop ------------------------------------------------------------------------------------
    def _loop(self, context: Context) -> RecoveryLoop:
        from airflow_cloudtrain.lifecycle.prepare import JobOptions
        from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
        from airflow_cloudtrain.lifecycle.resume.recovery import RecoverySettings
        from airflow_cloudtrain.lifecycle.run.attempt import RunContext
        from airflow_cloudtrain.operators.resume_config import parse_resume_from

        config = self._config()  # rendered: every check again, the cloud-dependent ones too
        args = self.resume
        job = JobOptions(
            checkpoint_dir=self.checkpoint_dir or None,
            checkpoint_interval_s=args.checkpoint_interval_s,
            stop_grace_s=args.stop_grace_s,
            idle_timeout_s=args.idle_timeout_s,
        )
        ctx = RunContext.for_task(config, self, context, self.launch_options, self.wait)
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
        )
        loop = RecoveryLoop(ctx, settings, job, parse_resume_from(self.resume_from, config.cloud))
        # a deadline given as a timedelta counts from the loop's first start, kept in its history
        loop.settings = replace(settings, deadline_at=args.deadline_at(loop.history.started_at))
        loop.killed = self._killed
        self._loop_obj = loop
        return loop

    def _price_ratio(self, config: Any) -> float:
        """Spot / on-demand price of the offer a spot launch would get, for the deadline policy."""
        from airflow_cloudtrain.lifecycle.prepare import offers_for
        from airflow_cloudtrain.lifecycle.resume.recovery import SPOT_OF

        offer = offers_for(replace(config, cloud=SPOT_OF[config.cloud]), None, self.log)[0]
        if offer.spot_price and offer.price:
            return float(offer.spot_price) / float(offer.price)
        return 0.32

    def _new_attempt(self, context: Context) -> RunAttempt:
        """Any attempt of the run (same key, ledger, folder): what teardown after a failed deferral
        uses (``CloudTrainOperator.resume_execution``). Releasing needs only the run key (ledger and
        tag sweep), so when the loop cannot be rebuilt (the bucket is down) a plain attempt does it."""
        try:
            loop = self._loop(context)
        except Exception as err:
            self.log.warning("Could not load the run's loop (%s); releasing by run key", err)
            return super()._new_attempt(context)
        self._attempt = loop.attempt()
        return self._attempt

    @quiet_bid
    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A failed deferral (``__fail__``): the ledger gets a row for the attempt it waited on, then
        ``CloudTrainOperator`` releases the run."""
        if next_method == "__fail__":
            try:
                loop = self._loop(context)
                waited_on = loop.attempt().stored
                if waited_on is not None:
                    loop.abandoned(waited_on, "the deferred wait failed")
            except Exception as err:  # releasing matters more
                self.log.warning("Could not record the failed attempt in the ledger: %s", err)
        return super().resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        """Stop the loop (no further launch or wait) and release the current attempt."""
        self._killed = True
        if self._loop_obj is not None:
            self._loop_obj.killed = True
        super().on_kill()

    @quiet_bid
    def execute(self, context: Context) -> dict[str, Any]:
        loop = self._loop(context)
        self._say_bid_ignored(loop.ctx.config)
        return self._run(context, loop)

    @quiet_bid
    def attempt_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from a ``RunTrigger``: finish that attempt, then go on with the loop."""
        from airflow_cloudtrain.core.records import LaunchRecord, Outcome

        loop = self._loop(context)
        launch = LaunchRecord.from_dict(event["launch"])
        loop.finish(loop.attempt(launch.cloud), launch, Outcome.from_dict(event["outcome"]))
        return self._run(context, loop)

    @quiet_bid
    def wait_complete(self, context: Context, event: Any = None) -> dict[str, Any]:
        """Back from a timer the loop deferred on (the deadline policy's ``wait``, no capacity)."""
        loop = self._loop(context)
        loop.end_wait()
        return self._run(context, loop)

    def _run(self, context: Context, loop: RecoveryLoop) -> dict[str, Any]:
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.core.launcher import LaunchFailed

        while True:
            if self._killed:
                raise AirflowException(f"task killed: the loop stopped (run {loop.history.run_id})")
            step = loop.next_step()
            if step.kind == "done":
                loop.close(True)
                return loop.result()
            if step.kind == "fail":
                loop.close(False, step.reason)
                raise AirflowException(f"{step.reason} (run {loop.history.run_id})")
            if step.kind == "wait":
                self._wait(loop, step.seconds, step.reason)
                continue
            attempt = loop.launch_attempt(step.cloud)
            self._attempt = attempt
            try:
                launch, done = attempt.start()
            except LaunchFailed as err:  # start() released whatever the failed launch made
                loop.launch_failed(step.cloud or loop.settings.cloud, err)
                continue
            self._push_links(context, attempt, launch)  # the buttons follow the current attempt
            if done is None:
                if self.deferrable and not attempt.over(launch):  # an ended attempt finishes here
                    self.defer(trigger=attempt.trigger(launch), method_name="attempt_complete")
                try:
                    done = attempt.wait(launch)
                except BaseException as err:
                    attempt.abandon()
                    loop.abandoned(launch, f"{type(err).__name__}: {err}"[:300])
                    raise
            loop.finish(attempt, launch, done)

    def _wait(self, loop: RecoveryLoop, seconds: float, reason: str) -> None:
        """Wait before the next launch: on a timer trigger when deferrable, else here."""
        self.log.info("Waiting %.0f s before the next launch: %s", seconds, reason)
        loop.begin_wait(reason)
        if self.deferrable:
            from datetime import datetime, timedelta, timezone

            from airflow.providers.standard.triggers.temporal import DateTimeTrigger

            moment = datetime.now(timezone.utc) + timedelta(seconds=seconds)
            self.defer(trigger=DateTimeTrigger(moment=moment), method_name="wait_complete")
        until = time.monotonic() + seconds
        while not self._killed and time.monotonic() < until:  # on_kill may come while we sleep
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        loop.end_wait()

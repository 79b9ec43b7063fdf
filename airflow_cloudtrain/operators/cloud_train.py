"""CloudTrainOperator: one job on one rented instance, and the instance given back whatever happens.

Configuration plus Airflow glue: the run itself is ``lifecycle.attempt.RunAttempt`` (launch or adopt,
wait, outcome, release through the resource ledger, cost), which later operators loop over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.links.run import CloudInstanceLink, RunFolderLink
from airflow_cloudtrain.operators.base import (  # noqa: F401  (re-exported: their home before operators.base)
    GCSPOT_BID_WARNING,
    TEMPLATED,
    RunArgsOperator,
    no_gcspot_bid_warning,
    parsing_for_a_task,
    quiet_bid,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.core.engine import Engine
    from airflow_cloudtrain.core.records import LaunchRecord
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt


class CloudTrainOperator(RunArgsOperator):
    """Run ``command`` on the cheapest instance that meets ``cpus``/``gpus``/``ram``/``hdd``.

    ``cloud`` is ``ec2``, ``ec2spot``, ``gcloud`` or ``gcspot``. The operator writes the run spec to
    the run folder under ``bucket``, launches the instance (failing over to the next offer when a type
    has no capacity), waits for the agent's final status while streaming the job's log, releases the
    instance, and returns the XCom dict (``run_id``, ``run_uri``, ``instance_type``, ``exit_code``,
    ``duration_s``, ``cost_usd``, ``interruptions``, ...). A retried task delivers a result an earlier
    try's job already produced, or adopts its instance, instead of running the job twice.
    """

    template_fields: Sequence[str] = TEMPLATED
    template_fields_renderers = {"env": "json", "secret_env": "json", "setup_cmds": "py", "command": "bash"}
    ui_color = "#e8f4fd"
    operator_extra_links = (CloudInstanceLink(), RunFolderLink())
    _attempt: RunAttempt | None = None  # the current attempt (the resume loop's too)

    def _run_context(self, config: RunConfig, context: Context) -> RunContext:
        """The run's context from the rendered ``config``; ``secret_env`` is parsed here, on the
        operator's floor (the engines below never import the operators)."""
        from airflow_cloudtrain.lifecycle.run.attempt import RunContext
        from airflow_cloudtrain.operators.secret_env import parse_secret_env

        secret_env = parse_secret_env(getattr(self, "secret_env", None), config.cloud, config.env)
        return RunContext.for_task(config, self, context, self.launch_options, self.wait, secret_env)

    def _new_attempt(self, context: Context) -> RunAttempt:
        from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt

        return RunAttempt(self._run_context(self._config(), context))

    def new_engine(self, context: Context) -> Engine[Any]:
        from airflow_cloudtrain.lifecycle.run.engine import SingleRun

        return SingleRun(self._new_attempt(context))

    def _say_bid_ignored(self, config: Any) -> None:
        """The run's one "bid has no effect" line in the task log, at its start (not on resuming)."""
        if config.cloud == "gcspot" and config.bid is not None:
            from airflow_cloudtrain.catalog.select import gcspot_bid_message

            self.log.warning("%s", gcspot_bid_message(config.bid.raw))

    @quiet_bid
    def execute(self, context: Context) -> Any:
        engine = self._new(context)
        self._say_bid_ignored(_attempts(engine).config)
        return self._drive(context, engine, engine.start())

    def on_handle(self, context: Context, engine: Engine[Any], handle: Any) -> None:
        """An attempt in flight: its console links (the resume loop's current attempt's)."""
        from airflow_cloudtrain.core.records import LaunchRecord

        attempt = _attempts(engine).attempt
        if attempt is not None and isinstance(handle, LaunchRecord):
            self._push_links(context, attempt, handle)

    def _push_links(self, context: Context, attempt: RunAttempt, launch: LaunchRecord) -> None:
        """The console links of the instance that now exists, while the run is still going
        (``links.run``); never fails the run."""
        from airflow_cloudtrain.links.run import project_of, push_console_links, run_target

        try:
            target = run_target(launch, project_of(attempt.ctx.backend))
            push_console_links(context["ti"], self, target)
        except Exception as err:
            self.log.warning("Could not publish the console links of %s: %s", launch.instance_id, err)

    @quiet_bid
    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """Back from the trigger: release, account, and raise on anything but success."""
        return super().execute_complete(context, event)

    @quiet_bid
    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        return super().resume_execution(next_method, next_kwargs, context)


def _attempts(engine: Engine[Any]) -> AttemptEngine:
    """The engines of ``CloudTrainOperator`` and its subclasses run attempts (``SingleRun``,
    ``ResumeRun``): their configuration and current attempt."""
    from typing import cast

    return cast("AttemptEngine", engine)


if TYPE_CHECKING:  # the run machinery's types (apart from the imports above: those are the parse's)
    from airflow_cloudtrain.lifecycle.run.attempt import RunContext
    from airflow_cloudtrain.lifecycle.run.engine import AttemptEngine
    from airflow_cloudtrain.spec import RunConfig

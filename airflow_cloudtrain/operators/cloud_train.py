"""CloudTrainOperator: one job on one rented instance, and the instance given back whatever happens.

Configuration plus Airflow glue: the run itself is ``lifecycle.attempt.RunAttempt`` (launch or adopt,
wait, outcome, release through the resource ledger, cost), which later operators loop over.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk import conf

from airflow_cloudtrain.lifecycle.prepare import LaunchOptions, WaitSettings
from airflow_cloudtrain.links.run import CloudInstanceLink, RunFolderLink
from airflow_cloudtrain.operators.base import EngineOperator
from airflow_cloudtrain.operators.checks import check_bool, check_seconds
from airflow_cloudtrain.operators.config import check_run_args, is_templated, parse_config, parse_duration
from airflow_cloudtrain.operators.launch_config import (
    check_connection_args,
    check_launch_for_cloud,
    parse_launch_args,
)
from airflow_cloudtrain.operators.network_config import apply_network_args, check_network_for_run
from airflow_cloudtrain.operators.secret_env import check_secret_env
from airflow_cloudtrain.spec import parse_cloud

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.core.engine import Engine
    from airflow_cloudtrain.core.records import LaunchRecord
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt

TEMPLATED = (
    "cloud",
    "command",
    "env",
    "secret_env",
    "setup_cmds",
    "code",
    "bucket",
    "cpus",
    "gpus",
    "ram",
    "hdd",
    "bid",
    "instance_type",
    "gpu_type",
    "image",
    "region",
    "zone",
    "max_runtime",
)


GCSPOT_BID_WARNING = r"bid=.* has no effect on cloud='gcspot'"
F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def no_gcspot_bid_warning() -> Iterator[None]:
    """Inside a task the "bid has no effect on gcspot" warning is the operator's own log line, once per
    run (``CloudTrainOperator._say_bid_ignored``): Python's once-per-process warning would come again
    from every process of the run (its start, and each resumption after a deferral)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=GCSPOT_BID_WARNING, category=UserWarning)
        yield


def quiet_bid(method: F) -> F:
    """``method`` runs under ``no_gcspot_bid_warning``."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with no_gcspot_bid_warning():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def parsing_for_a_task() -> bool:
    """Is this parse the one a task process makes before it runs (or resumes) a task? Its warnings
    land in the task log, where the DAG processor's parse already showed them to the DAG's author."""
    from airflow.sdk import get_parsing_context

    return get_parsing_context().task_id is not None


class CloudTrainOperator(EngineOperator):
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

    def __init__(
        self,
        *,
        command: str,
        bucket: str,
        cloud: str = "ec2",
        code: str | None = None,
        image: str | None = None,
        setup_cmds: list[str] | None = None,
        env: dict[str, str] | None = None,
        secret_env: dict[str, str] | None = None,
        cpus: int | str = 1,
        gpus: int | str = 0,
        gpu_type: str | None = None,
        ram: int | str | None = None,
        hdd: int | str | None = None,
        instance_type: str | None = None,
        bid: str | float | None = None,
        region: str | None = None,
        zone: str | None = None,
        max_runtime: Any = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 10.0,
        aws_conn_id: str | None = "aws_default",
        gcp_conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        image_id: str | None = None,
        key_name: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: list[str] | None = None,
        iam_instance_profile: str | None = None,
        tags: dict[str, str] | None = None,
        volume_id: str | None = None,
        service_account: str | None = None,
        network: str | None = None,
        subnetwork: str | None = None,
        external_ip: bool = True,
        ssh_source_ranges: list[str] | None = None,
        provisioning: str | None = None,
        max_launch_attempts: int = 6,
        live_prices: bool = True,
        startup_timeout: Any = "30m",
        heartbeat_timeout: Any = "10m",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for name in TEMPLATED:
            setattr(self, name, locals()[name])
        self.deferrable = check_bool(deferrable, "deferrable")
        self.poll_interval = check_seconds(poll_interval, "poll_interval")
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.project_id = project_id
        check_connection_args(aws_conn_id, gcp_conn_id, project_id, cloud)
        self.launch_options = LaunchOptions(
            **parse_launch_args(
                {
                    "image_id": image_id,
                    "key_name": key_name,
                    "subnet_id": subnet_id,
                    "security_group_ids": security_group_ids,
                    "iam_instance_profile": iam_instance_profile,
                    "tags": tags,
                    "volume_id": volume_id,
                    "service_account": service_account,
                    "provisioning": provisioning,
                    "max_launch_attempts": max_launch_attempts,
                    "live_prices": live_prices,
                }
            )
        )
        # GCE only; may pin the region
        apply_network_args(self, network, subnetwork, external_ip, ssh_source_ranges)
        # an agent that never reports or stops beating means nobody will power the instance off
        self.wait = WaitSettings(
            poll_interval=self.poll_interval,
            startup_timeout=parse_duration(startup_timeout, "startup_timeout"),
            heartbeat_timeout=parse_duration(heartbeat_timeout, "heartbeat_timeout"),
        )
        self._attempt: RunAttempt | None = None
        check_secret_env(secret_env, cloud, env)  # references only; the values are read at run time
        with no_gcspot_bid_warning() if parsing_for_a_task() else contextlib.nullcontext():
            self._check_parse_time()

    def _check_parse_time(self) -> None:
        """Each argument known now, and each combination of known ones; a templated argument is
        checked (with its combinations) when the task runs, by ``_config``."""
        config = check_run_args(self._args())
        if not is_templated(self.cloud):
            check_launch_for_cloud(parse_cloud(self.cloud), self.launch_options)
        if config is not None:
            from airflow_cloudtrain.lifecycle.prepare import offers_for

            offers_for(config, None, self.log)  # a request nothing satisfies fails here

    def _config(self) -> Any:
        """The rendered arguments, all checked (the same checks as at parse time)."""
        config = parse_config(self._args())
        check_launch_for_cloud(config.cloud, self.launch_options)
        check_network_for_run(config, self.launch_options)
        return config

    def _args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TEMPLATED}

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

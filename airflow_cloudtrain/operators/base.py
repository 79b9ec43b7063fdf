"""The one operator skeleton: execute, defer, ``execute_complete``, ``__fail__`` and ``on_kill``
over an engine (``core.engine.Engine``), written once for every operator of the family.

An operator subclass is configuration: it checks its arguments at construction and says which
engine runs it (``new_engine``); it may publish console links for each handle (``on_handle``).
The skeleton never imports the run machinery at module level, so DAG parsing stays cheap.

``RunArgsOperator`` (below the skeleton) holds the arguments every rented-instance operator shares:
``CloudTrainOperator`` (and the checkpoint-resume loop on it) and the work-queue fleets
(``WorkQueueOperator``: ``SpotFleetOperator``, ``PreemptibleGroupOperator``) take the same run
arguments (cloud, hardware, code, image, environment, bucket, launch and network options, waits),
checked at parse time by ``operators.config``, ``launch_config``, ``network_config`` and
``secret_env`` (imported when an operator is constructed), and nothing of how a run goes.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from airflow.sdk import BaseOperator, conf

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.engine import Engine, Step


class EngineOperator(BaseOperator):
    """Drives an ``Engine`` to its end, in this worker or through the triggerer.

    ``deferrable`` frees the worker slot while waiting; a task killed on the worker (``on_kill``), a
    wait that fails, and a deferral that fails (``__fail__``: the trigger crashed or timed out) all
    release what the run made, through the engine's ledger.
    """

    deferrable: bool = False
    _engine: Engine[Any] | None = None
    # The run's result, kept for the lineage the OpenLineage listener extracts right after the task
    # (as the Amazon provider's SageMaker operators keep theirs): no XCom read from its forked child.
    run_result: Any = None

    def new_engine(self, context: Context) -> Engine[Any]:
        """The task's engine, built from the rendered arguments (each call a fresh one: a resumed
        task runs in a new process)."""
        raise NotImplementedError

    def on_handle(self, context: Context, engine: Engine[Any], handle: Any) -> None:
        """A run is in flight on ``handle`` (its console links, say). Must not fail the task."""

    def _new(self, context: Context) -> Engine[Any]:
        self._engine = self.new_engine(context)
        return self._engine

    def execute(self, context: Context) -> Any:
        engine = self._new(context)
        return self._drive(context, engine, engine.start())

    def execute_complete(self, context: Context, event: Any = None) -> Any:
        """Back from the trigger: the engine reads its event; anything but success raises."""
        engine = self._new(context)
        return self._drive(context, engine, engine.resume(event))

    def _drive(self, context: Context, engine: Engine[Any], step: Step[Any]) -> Any:
        while not step.done:
            handle = step.handle
            self.on_handle(context, engine, handle)
            if self.deferrable and not engine.over(handle):  # an ended run finishes here
                spec = engine.trigger(handle)
                self.defer(trigger=spec.build(), method_name=spec.method_name)
            try:
                outcome = engine.wait(handle)
            except BaseException as err:  # killed, timed out, or the wait failed: nothing may outlive it
                engine.abandon(f"{type(err).__name__}: {err}"[:300])
                raise
            step = engine.advance(handle, outcome)
        self.run_result = step.result
        return step.result

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that crashed or timed out resumes with ``__fail__`` and never reaches
        ``execute_complete``: release the run through its ledger first."""
        if next_method == "__fail__":
            try:
                self._new(context).abandon("the deferred wait failed")
                self.log.info("Released the run's resources after the deferred wait failed")
            except Exception:
                self.log.exception("Teardown after the failed deferral did not complete")
        return super().resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        """The task was killed on the worker (while launching or waiting): release with it."""
        if self._engine is not None:
            self._engine.kill()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (with Airflow's OpenLineage provider): the code and ``env`` URIs in, the results
        and checkpoint folders out, a ``cloudtrain`` run facet (``operators.lineage``)."""
        from airflow_cloudtrain.operators.lineage import facets_on_complete

        return facets_on_complete(self, task_instance)


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
    "orphan_timeout",
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


class RunArgsOperator(EngineOperator):
    """The shared run arguments, checked at construction (see ``CloudTrainOperator`` for each)."""

    # set from the arguments of the same names (``TEMPLATED``): rendered before the task runs
    cloud: str
    bid: str | float | None
    project_id: str | None
    orphan_timeout: Any  # a duration or None (``operators.lease_config``), maybe a template

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
        orphan_timeout: Any = "30m",
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.lifecycle.prepare import LaunchOptions, WaitSettings
        from airflow_cloudtrain.operators.checks import check_bool, check_seconds
        from airflow_cloudtrain.operators.config import parse_duration
        from airflow_cloudtrain.operators.gang_config import refuse_num_nodes
        from airflow_cloudtrain.operators.launch_config import check_connection_args, parse_launch_args
        from airflow_cloudtrain.operators.network_config import apply_network_args
        from airflow_cloudtrain.operators.secret_env import check_secret_env

        refuse_num_nodes(type(self).__name__, kwargs)  # CloudTrainOperator took its own already
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
        check_secret_env(secret_env, cloud, env)  # references only; the values are read at run time
        from airflow_cloudtrain.operators.lease_config import check_orphan_timeout

        check_orphan_timeout(orphan_timeout, self.poll_interval, max_runtime)  # a run nobody watches
        with no_gcspot_bid_warning() if parsing_for_a_task() else contextlib.nullcontext():
            self._check_parse_time()

    def _check_parse_time(self) -> None:
        """Each argument known now, and each combination of known ones; a templated argument is
        checked (with its combinations) when the task runs, by ``_config``."""
        from airflow_cloudtrain.operators.config import is_templated
        from airflow_cloudtrain.operators.launch_config import check_launch_for_cloud
        from airflow_cloudtrain.spec import parse_cloud

        if not is_templated(self.cloud):
            check_launch_for_cloud(parse_cloud(self.cloud), self.launch_options)
        self._known_offers()  # a request nothing satisfies fails here

    max_cost: Any = None  # set by the operators that take a budget, before they check it

    def _max_cost_usd(self, nodes: int | None = 1) -> float | None:
        """``max_cost`` parsed, and (once the request and ``nodes`` are known: a gang's ``num_nodes``, a
        fleet's first worker) compared with a minute of the cheapest offer; a template is checked when
        the task runs."""
        from airflow_cloudtrain.operators.budget_config import check_covers_a_minute, parse_max_cost
        from airflow_cloudtrain.operators.config import is_templated

        if is_templated(self.max_cost):
            return None
        budget = parse_max_cost(self.max_cost)
        offers = self._known_offers() if budget is not None and nodes is not None else None
        if budget is not None and offers is not None and nodes is not None:
            check_covers_a_minute(budget, offers, nodes, self.max_cost)
        return budget

    def _known_offers(self) -> list[Offer] | None:
        """The offers that meet the request, once every argument they depend on is known (None
        while one is templated). Computed once per set of argument values: the parse-time checks
        and the ``max_cost`` check share it instead of filtering the catalog twice."""
        from airflow_cloudtrain.operators.config import check_run_args

        args = self._args()
        key = repr(sorted(args.items()))
        cached: tuple[str, list[Offer] | None] | None = self.__dict__.get("_offers_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        config = check_run_args(args)
        offers = None
        if config is not None:
            from airflow_cloudtrain.lifecycle.prepare import offers_for

            offers = list(offers_for(config, None, cast("logging.Logger", self.log)))
        self.__dict__["_offers_cache"] = (key, offers)
        return offers

    def _config(self) -> Any:
        """The rendered arguments, all checked (the same checks as at parse time)."""
        from airflow_cloudtrain.operators.config import parse_config
        from airflow_cloudtrain.operators.launch_config import check_launch_for_cloud
        from airflow_cloudtrain.operators.network_config import check_network_for_run

        config = parse_config(self._args())
        check_launch_for_cloud(config.cloud, self.launch_options)
        check_network_for_run(config, self.launch_options)
        return config

    def _args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in TEMPLATED}

    def _wait_settings(self, config: Any) -> Any:
        """``self.wait`` with the rendered ``orphan_timeout`` (checked again against the rendered
        ``max_runtime``): what the run's waits renew and its spec tells the agent."""
        from dataclasses import replace

        from airflow_cloudtrain.operators.lease_config import parse_orphan_timeout

        timeout = parse_orphan_timeout(self.orphan_timeout, self.poll_interval, config.max_runtime_s)
        return replace(self.wait, orphan_timeout=timeout)

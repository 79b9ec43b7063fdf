"""CloudTrainOperator: one job on one rented instance, and the instance given back whatever happens.

Configuration plus Airflow glue: the run itself is ``lifecycle.attempt.RunAttempt`` (launch or adopt,
wait, outcome, release through the resource ledger, cost), which later operators loop over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

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

    :param command: Shell command run in the job's working directory on the instance.
    :param bucket: Root URI of the run folders: ``s3://bucket/prefix`` (EC2) or ``gs://...`` (GCE).
    :param cloud: ``ec2``, ``ec2spot``, ``gcloud`` or ``gcspot``.
    :param code: A local directory, or an ``s3://`` / ``gs://`` tarball, unpacked into the working directory.
    :param image: Container image the command runs in (GPUs passed through); none: on the host.
    :param setup_cmds: Shell commands run on the instance before the job.
    :param env: Extra environment variables for the job (stored in plain text in the run folder).
    :param secret_env: Variables read from a secret store at run time: references only (SSM, Secrets
        Manager, Secret Manager, ``airflow_conn://``, ``airflow_var://``), never values.
    :param cpus: vCPUs wanted (at least).
    :param gpus: GPUs wanted (at least).
    :param gpu_type: Accelerator name (``A10G``, ``T4``, ``V100``, ...).
    :param ram: Memory wanted: ``"16g"``, ``"512m"``, ``"1.5GiB"``, or an int in MiB.
    :param hdd: Root disk wanted: the same forms, an int in GiB.
    :param instance_type: An explicit type; skips the catalog search.
    :param bid: Spot bid: ``"0.45"`` (USD per instance-hour) or ``"60%"`` (of on-demand).
    :param region: Where to launch; a default comes from the connection or the catalog.
    :param zone: A zone within the region.
    :param max_runtime: Hard limit (``"6h"``, seconds, ``"unlimited"``); the instance ends itself past it.
    :param deferrable: Free the worker slot while waiting (Airflow's ``default_deferrable`` by default).
    :param poll_interval: Seconds between status polls.
    :param aws_conn_id: Airflow AWS connection (``ec2``, ``ec2spot``).
    :param gcp_conn_id: Airflow Google connection (``gcloud``, ``gcspot``).
    :param project_id: GCP project; the connection's by default.
    :param image_id: EC2 AMI / GCE image for the host.
    :param key_name: EC2 key pair (SSH stays closed unless a security group opens it).
    :param subnet_id: EC2 subnet.
    :param security_group_ids: EC2 security groups.
    :param iam_instance_profile: EC2 instance profile the agent uses to reach the run folder.
    :param tags: Extra tags (EC2) / labels (GCE) on everything the run makes.
    :param volume_id: An EBS volume attached as the working directory.
    :param service_account: GCE service account of the VM.
    :param network: GCE VPC network.
    :param subnetwork: GCE subnetwork.
    :param external_ip: Give the GCE VM an external IP (for egress without Cloud NAT).
    :param ssh_source_ranges: CIDR ranges allowed to reach the GCE VM on port 22 (none by default).
    :param provisioning: GCE provisioning model override (``SPOT``, ``STANDARD``).
    :param max_launch_attempts: Offers and zones tried before a launch fails for lack of capacity.
    :param live_prices: Refresh prices from the cloud's own APIs (cached) before choosing.
    :param startup_timeout: How long the agent may take to report after launch.
    :param heartbeat_timeout: How long the agent may stay silent before the run is declared lost.
    :param orphan_timeout: A run nobody has watched for this long ends itself (the agent stops the job,
        syncs its checkpoint and powers off; README "Runs nobody watches"); default 30 minutes, at
        least 3 x ``poll_interval``; None: no lease, the run depends on ``max_runtime`` alone (templated).
    :param idle_timeout: Stop a job whose processes used no CPU (and no GPU) for this long (the
        hung-job watchdog; a duration, default None: off); the run ends ``idle`` and the task fails.
    :param num_nodes: Instances running ``command`` together as one job (a gang, README "Multi-node
        training"): all of one offer in one zone, all or nothing, one outcome. Default 1.
    :param placement: ``"cluster"``: the gang's nodes close together (an EC2 cluster placement group,
        a GCE compact placement policy); None: the cloud places them.
    :param log_nodes: ``"all"`` (every node's log in the task log, prefixed ``[rank N]``) or ``"head"``;
        default ``"all"`` up to 8 nodes, ``"head"`` above.
    :param max_cost: A budget in USD (README "What a run costs"): the run is stopped before its cost
        (every node, earlier attempts of a resume run included) would pass it, and the task fails
        naming it. Default None: no budget.
    """

    template_fields: Sequence[str] = (*TEMPLATED, "num_nodes", "max_cost")
    template_fields_renderers = {"env": "json", "secret_env": "json", "setup_cmds": "py", "command": "bash"}
    ui_color = "#e8f4fd"
    operator_extra_links = (CloudInstanceLink(), RunFolderLink())
    _attempt: RunAttempt | None = None  # the current attempt (the resume loop's too)
    idle_timeout_s: float | None = None

    def __init__(
        self,
        *,
        idle_timeout: Any = None,
        num_nodes: int | str = 1,
        placement: str | None = None,
        log_nodes: str | None = None,
        max_cost: Any = None,
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import parse_duration
        from airflow_cloudtrain.operators.gang_config import parse_gang_args

        super().__init__(**kwargs)
        self.idle_timeout_s = parse_duration(idle_timeout, "idle_timeout")
        self.num_nodes = num_nodes
        self.placement = placement
        self.log_nodes = log_nodes
        gang = parse_gang_args(
            num_nodes, placement, log_nodes, self.cloud, getattr(self, "instance_type", None)
        )
        if gang is not None and gang.num_nodes > 1 and self.launch_options.volume_id:
            raise ValueError(
                f"volume_id={self.launch_options.volume_id!r} is not valid with num_nodes={num_nodes!r}: one EBS "
                "volume attaches to one instance; leave volume_id out of a gang (use code= or the bucket)"
            )
        self.max_cost = max_cost
        self._max_cost_usd(gang.num_nodes if gang is not None else None)

    def _gang(self, config: RunConfig) -> GangOptions | None:
        """The rendered gang arguments (checked again: ``num_nodes`` or the cloud may have been a
        template); None for a single instance."""
        from airflow_cloudtrain.lifecycle.prepare import GangOptions
        from airflow_cloudtrain.operators.gang_config import parse_gang_args

        args = parse_gang_args(
            self.num_nodes, self.placement, self.log_nodes, config.cloud, config.instance_type
        )
        if args is None or args.num_nodes == 1:
            return None
        return GangOptions(args.num_nodes, args.placement, args.log_nodes)

    def _run_context(self, config: RunConfig, context: Context) -> RunContext:
        """The run's context from the rendered ``config``; ``secret_env`` is parsed here, on the
        operator's floor (the engines below never import the operators)."""
        from airflow_cloudtrain.lifecycle.run.attempt import RunContext
        from airflow_cloudtrain.operators.secret_env import parse_secret_env

        secret_env = parse_secret_env(getattr(self, "secret_env", None), config.cloud, config.env)
        wait = self._wait_settings(config)  # orphan_timeout, rendered and checked
        ctx = RunContext.for_task(config, self, context, self.launch_options, wait, secret_env)
        if self.idle_timeout_s:  # the hung-job watchdog (CheckpointResumeOperator sets its own job)
            from airflow_cloudtrain.lifecycle.prepare import JobOptions

            ctx.job = JobOptions(idle_timeout_s=self.idle_timeout_s)
        ctx.gang = self._gang(config)
        budget = self._max_cost_usd(ctx.gang.num_nodes if ctx.gang else 1)  # rendered by now
        if budget is not None:
            ctx.wait = replace(ctx.wait, max_cost_usd=budget)
        return ctx

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

    return cast("AttemptEngine", engine)


if TYPE_CHECKING:  # the run machinery's types (apart from the imports above: those are the parse's)
    from airflow_cloudtrain.lifecycle.prepare import GangOptions
    from airflow_cloudtrain.lifecycle.run.attempt import RunContext
    from airflow_cloudtrain.lifecycle.run.engine import AttemptEngine
    from airflow_cloudtrain.spec import RunConfig

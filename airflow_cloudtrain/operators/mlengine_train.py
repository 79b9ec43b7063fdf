"""MLEngineTrainOperator: a Vertex AI custom job described in Cloud ML Engine's vocabulary.

ML Engine is retired and Airflow's Google provider removed its MLEngine operators; this operator keeps
the old words (scale tiers, master / worker / parameter-server / evaluator types and counts, legacy
machine names, ``--job-dir``, resume from the first job's id) and submits what they mean as a Vertex AI
custom job (``airflow_cloudtrain.mlengine`` holds the translation). On top of Vertex's own operators it
streams the job's log lines into the task log, cancels the job when the task is killed (deferred too),
re-attaches to a running job on retry instead of submitting a second one, and estimates the cost.

Configuration and Airflow glue only: execute / defer / ``execute_complete`` / ``on_kill`` are the one
operator skeleton's (``operators.base.EngineOperator``), and the job's life is its engine
(``lifecycle.vertex.engine.VertexEngine`` over ``lifecycle.vertex.job.VertexJobRun``); nothing here
imports google-cloud-aiplatform (DAG parsing stays cheap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import conf

from airflow_cloudtrain.links.vertex import LINK_XCOM_KEY, VertexJobLink
from airflow_cloudtrain.operators.base import EngineOperator
from airflow_cloudtrain.operators.mlengine_config import VOCABULARY_ARGS

if TYPE_CHECKING:
    import logging

    from airflow.sdk import Context

    from airflow_cloudtrain.clouds.gcp.vertex import JobRecord
    from airflow_cloudtrain.core.engine import Engine
    from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
    from airflow_cloudtrain.mlengine.job import JobConfig

TEMPLATED = (
    "project_id",
    "region",
    "code",
    "python_module",
    "training_args",
    "image",
    "command",
    "env",
    "executor_image",
    *VOCABULARY_ARGS,
    "bucket",
    "job_id",
    "resume_from",
    "spot",
    "max_runtime",
    "service_account",
    "orphan_timeout",
)


class MLEngineTrainOperator(EngineOperator):
    """Train on Vertex AI with ML Engine's ``scale_tier`` / machine-type vocabulary.

    ``code`` (a local folder, packaged and uploaded, or gs:// package URIs) + ``python_module`` +
    ``training_args``, or ``image`` (a custom container) + ``command``. The job writes under
    ``<bucket>/<job_id>/`` (``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR``; ``--job-dir`` for python
    packages); ``resume_from=<first job id>`` writes into that job's folder instead and starts from its
    checkpoints. XCom: ``job_id``, ``job_name``, ``job_dir``, ``state``, ``console_url``, ``replicas``,
    ``duration_s``, ``cost_usd`` (an estimate), ``resumed_from``.

    :param region: the Vertex AI region of the job, e.g. ``"us-central1"``.
    :param bucket: gs:// URI under which each job's folder ``<bucket>/<job_id>/`` is written.
    :param project_id: the Google Cloud project; default: the connection's project.
    :param code: a local folder (packaged as a source distribution and uploaded) or one or more gs://
        package URIs (``.tar.gz``, ``.whl``) holding ``python_module``.
    :param python_module: the dotted module Vertex runs, e.g. ``"trainer.task"``; exclusive with
        ``image``.
    :param training_args: the program's arguments: a list of strings or one shell-quoted string
        (``--job-dir <job folder>`` is added for a python package unless given).
    :param image: a custom container image URI to run instead of a python package.
    :param command: the container's entrypoint (with ``image`` only): a list or one shell-quoted string.
    :param env: environment variables for every replica (``CLOUDTRAIN_JOB_ID`` is always set).
    :param executor_image: the prebuilt training container of a python package; default TensorFlow
        2.17, the GPU build when a pool has a GPU.
    :param scale_tier: ``BASIC``, ``STANDARD_1``, ``PREMIUM_1``, ``BASIC_GPU`` (default),
        ``BASIC_TPU`` or ``CUSTOM`` (case-insensitive); ``CUSTOM`` takes the ``*_type`` arguments.
    :param master_type: the chief's machine (``CUSTOM``, required): an ML Engine legacy name
        (``complex_model_m_gpu``) or a Compute Engine type (``n1-standard-8``).
    :param worker_type: the workers' machine (``CUSTOM``), legacy or Compute Engine name.
    :param worker_count: how many workers (``CUSTOM``).
    :param parameter_server_type: the parameter servers' machine (``CUSTOM``).
    :param parameter_server_count: how many parameter servers (``CUSTOM``).
    :param evaluator_type: the evaluators' machine (``CUSTOM``).
    :param evaluator_count: how many evaluators (``CUSTOM``).
    :param master_accelerator: GPUs for a Compute Engine ``master_type``: ``"NVIDIA_TESLA_T4"``,
        ``"T4:2"`` or ``{"type": "T4", "count": 2}``.
    :param worker_accelerator: GPUs for a Compute Engine ``worker_type`` (same forms).
    :param parameter_server_accelerator: GPUs for a Compute Engine ``parameter_server_type``.
    :param evaluator_accelerator: GPUs for a Compute Engine ``evaluator_type``.
    :param job_id: the job's id and folder name (letters, digits, underscores, starting with a
        letter); default ``<task_id>_<UTC timestamp>``, kept across the task's tries.
    :param resume_from: the id of an earlier job of this bucket: the new job writes into the first
        job's folder and starts from its checkpoints.
    :param spot: run the replicas on Spot capacity.
    :param restart_job_on_worker_restart: restart the whole cluster when a replica restarts; default
        on for Spot jobs of more than one replica.
    :param max_runtime: Vertex's timeout for the job (``"1d"``, ``"90m"``, seconds, or
        ``"unlimited"``); default 7 days.
    :param service_account: the service account e-mail the replicas run as.
    :param gcp_conn_id: the Airflow Google connection.
    :param deferrable: wait in the triggerer instead of holding a worker slot.
    :param poll_interval: how often the job's state is read (seconds, or a duration such as ``"1m"``).
    :param log_polling_interval: how often the job's Cloud Logging lines are read into the task log.
    :param orphan_timeout: the wait renews the job's lease in its job folder; ``cloudtrain gc`` cancels a
        job whose lease lapsed this long ago (default 30 minutes; None: no lease).
    """

    template_fields: Sequence[str] = TEMPLATED
    orphan_timeout: Any  # a duration or None (``operators.lease_config``), maybe a template
    template_fields_renderers = {"env": "json", "training_args": "py", "command": "bash"}
    operator_extra_links = (VertexJobLink(),)
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        region: str,
        bucket: str,
        project_id: str | None = None,
        code: str | list[str] | None = None,
        python_module: str | None = None,
        training_args: list[str] | str | None = None,
        image: str | None = None,
        command: list[str] | str | None = None,
        env: dict[str, str] | None = None,
        executor_image: str | None = None,
        scale_tier: str = "BASIC_GPU",
        master_type: str | None = None,
        worker_type: str | None = None,
        worker_count: int | str = 0,
        parameter_server_type: str | None = None,
        parameter_server_count: int | str = 0,
        evaluator_type: str | None = None,
        evaluator_count: int | str = 0,
        master_accelerator: Any = None,
        worker_accelerator: Any = None,
        parameter_server_accelerator: Any = None,
        evaluator_accelerator: Any = None,
        job_id: str | None = None,
        resume_from: str | None = None,
        spot: bool = False,
        restart_job_on_worker_restart: bool | None = None,
        max_runtime: Any = "7d",
        service_account: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 30.0,
        log_polling_interval: float = 30.0,
        max_cost: Any = None,
        orphan_timeout: Any = "30m",
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import check_bool, check_conn_id, parse_duration
        from airflow_cloudtrain.operators.mlengine_config import check_job_args

        super().__init__(**kwargs)
        for name in TEMPLATED:
            setattr(self, name, locals()[name])
        self.restart_job_on_worker_restart = restart_job_on_worker_restart
        self.gcp_conn_id = check_conn_id(gcp_conn_id, "gcp_conn_id", "google_cloud_default", optional=False)
        self.deferrable = check_bool(deferrable, "deferrable")
        self.poll_interval = parse_duration(poll_interval, "poll_interval") or 30.0
        self.log_polling_interval = parse_duration(log_polling_interval, "log_polling_interval") or 30.0
        self._run: VertexJobRun | None = None
        check_job_args(self._args())  # each known argument now; templated ones once rendered
        from airflow_cloudtrain.operators.lease_config import check_orphan_timeout

        check_orphan_timeout(orphan_timeout, self.poll_interval, max_runtime)  # gc cancels it past that
        self.max_cost = max_cost
        self._budget()

    def _budget(self) -> tuple[float | None, float | None]:
        """(``max_cost``, every replica's USD per hour together): the budget checked against one
        minute of the job's replicas once every argument is known (a template: when the task runs)."""
        from airflow_cloudtrain.operators.budget_config import parse_max_cost
        from airflow_cloudtrain.operators.config import is_templated

        if is_templated(self.max_cost):
            return None, None
        budget = parse_max_cost(self.max_cost)
        args = self._args()
        if budget is None or any(is_templated(v) for v in args.values()):
            return budget, None
        from airflow_cloudtrain.lifecycle.vertex.cost import estimate_cost
        from airflow_cloudtrain.operators.mlengine_config import parse_job_config

        config = parse_job_config(args)
        hourly, _ = estimate_cost(config.pools, config.region, config.spot, 3600.0)
        if hourly is not None and budget < hourly / 60:
            raise ValueError(
                f"max_cost={self.max_cost!r} (USD) buys less than one minute of the job's replicas (${hourly:g}/h "
                f"together, list prices): ${hourly / 60:.4f}; raise max_cost or leave it out"
            )
        return budget, hourly

    def _args(self) -> dict[str, Any]:
        args = {name: getattr(self, name) for name in TEMPLATED if name != "orphan_timeout"}
        args["restart_job_on_worker_restart"] = self.restart_job_on_worker_restart
        return args

    def _new_run(self, context: Context) -> VertexJobRun:
        from airflow_cloudtrain.contract.runs import RunKey
        from airflow_cloudtrain.hooks.vertex import VertexHook
        from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
        from airflow_cloudtrain.operators.mlengine_config import parse_job_config

        config: JobConfig = parse_job_config(self._args())
        ti = context["ti"]
        key = RunKey.of_task(self, context, config.bucket)
        hook = VertexHook(gcp_conn_id=self.gcp_conn_id, project_id=config.project_id)
        log = cast("logging.Logger", self.log)  # Airflow's task logger: the stdlib Logger's calls
        try_number = getattr(ti, "try_number", 1) or 1
        self._run = VertexJobRun(config, key, hook, context.get("task_state_store"), log, try_number)
        return self._run

    def new_engine(self, context: Context) -> Engine[Any]:
        from airflow_cloudtrain.lifecycle.vertex.engine import VertexEngine, VertexWait
        from airflow_cloudtrain.operators.lease_config import parse_orphan_timeout
        from airflow_cloudtrain.operators.mlengine_config import parse_job_config

        conn_id = self.gcp_conn_id or "google_cloud_default"  # never None: checked at construction
        budget, hourly = self._budget()  # rendered by now
        max_runtime_s = parse_job_config(self._args()).max_runtime_s
        orphan = parse_orphan_timeout(self.orphan_timeout, self.poll_interval, max_runtime_s)
        wait = VertexWait(conn_id, self.poll_interval, self.log_polling_interval, budget, hourly, orphan)
        return VertexEngine(self._new_run(context), wait)

    def on_handle(self, context: Context, engine: Engine[Any], handle: JobRecord) -> None:
        """The console link, now: Airflow pushes an extra link's value only when ``execute`` returns or
        defers, so a blocking task's button would stay empty while its job runs. Never fails the task."""
        from airflow_cloudtrain.clouds.gcp.vertex import console_url

        try:
            project = self._run.project if self._run is not None else handle.project
            url = console_url(project, handle.region, handle.numeric_id)
            context["ti"].xcom_push(key=LINK_XCOM_KEY, value=url)
            context["ti"].xcom_push(key=VertexJobLink().xcom_key, value=url)
        except Exception as err:
            self.log.warning("Could not publish the console link of %s: %s", handle.name, err)

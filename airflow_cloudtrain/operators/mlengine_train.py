"""MLEngineTrainOperator: a Vertex AI custom job described in Cloud ML Engine's vocabulary.

ML Engine is retired and Airflow's Google provider removed its MLEngine operators; this operator keeps
the old words (scale tiers, master / worker / parameter-server / evaluator types and counts, legacy
machine names, ``--job-dir``, resume from the first job's id) and submits what they mean as a Vertex AI
custom job (``airflow_cloudtrain.mlengine`` holds the translation). On top of Vertex's own operators it
streams the job's log lines into the task log, cancels the job when the task is killed (deferred too),
re-attaches to a running job on retry instead of submitting a second one, and estimates the cost.

Configuration and Airflow glue only: the job's life is ``lifecycle.vertex_job.VertexJobRun``; nothing
here imports google-cloud-aiplatform (DAG parsing stays cheap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, conf

from airflow_cloudtrain.links.vertex import LINK_XCOM_KEY, VertexJobLink
from airflow_cloudtrain.operators.mlengine_config import VOCABULARY_ARGS

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
    from airflow_cloudtrain.operators.mlengine_config import JobConfig

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
)


class MLEngineTrainOperator(BaseOperator):
    """Train on Vertex AI with ML Engine's ``scale_tier`` / machine-type vocabulary.

    ``code`` (a local folder, packaged and uploaded, or gs:// package URIs) + ``python_module`` +
    ``training_args``, or ``image`` (a custom container) + ``command``. The job writes under
    ``<bucket>/<job_id>/`` (``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR``; ``--job-dir`` for python
    packages); ``resume_from=<first job id>`` writes into that job's folder instead and starts from its
    checkpoints. XCom: ``job_id``, ``job_name``, ``job_dir``, ``state``, ``console_url``, ``replicas``,
    ``duration_s``, ``cost_usd`` (an estimate), ``resumed_from``.
    """

    template_fields: Sequence[str] = TEMPLATED
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

    def _args(self) -> dict[str, Any]:
        args = {name: getattr(self, name) for name in TEMPLATED}
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
        self._run = VertexJobRun(
            config, key, hook, context.get("task_state_store"), self.log, getattr(ti, "try_number", 1) or 1
        )
        return self._run

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import TaskDeferred

        run = self._new_run(context)
        job = run.start()
        if job.terminal:  # an earlier try's job ended while nobody watched: its last lines, its result
            run.show_rest(job)
            return self._deliver(run, job)
        try:
            self._push_link(context, run, job)
            if self.deferrable and not run.over(job):  # an ended job finishes here (``over``)
                from airflow_cloudtrain.triggers.vertex_job import VertexJobTrigger

                self.defer(
                    trigger=VertexJobTrigger(
                        job_name=job.name,
                        conn_id=self.gcp_conn_id,
                        project_id=run.project,
                        poll_interval=self.poll_interval,
                        log_polling_interval=self.log_polling_interval,
                        job_dir=job.output_dir,
                    ),
                    method_name="execute_complete",
                )
            job = run.wait(job, self.poll_interval, self.log_polling_interval)
        except TaskDeferred:
            raise
        except BaseException:  # killed, or the wait itself failed: the job must not run on unwatched
            run.kill()
            raise
        return self._deliver(run, job)

    def _push_link(self, context: Context, run: VertexJobRun, job: Any) -> None:
        """The console link, now: Airflow pushes an extra link's value only when ``execute`` returns or
        defers, so a blocking task's button would stay empty while its job runs."""
        from airflow_cloudtrain.clouds.gcp.vertex import console_url

        url = console_url(run.project, job.region, job.numeric_id)
        context["ti"].xcom_push(key=LINK_XCOM_KEY, value=url)
        context["ti"].xcom_push(key=VertexJobLink().xcom_key, value=url)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the trigger: report, and raise on anything but success."""
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.clouds.gcp.vertex import JobRecord

        run = self._new_run(context)
        if event.get("status") != "done":
            try:
                cancelled = run.cancel()
                self.log.info(
                    "Cancelled %s after the deferred wait failed", ", ".join(cancelled) or "nothing"
                )
            except Exception:
                self.log.exception("Cancelling the job after the failed wait did not complete")
            raise AirflowException(event.get("message") or "waiting for the Vertex AI job failed")
        return self._deliver(run, JobRecord.from_dict(event["job"]))

    def _deliver(self, run: VertexJobRun, job: Any) -> dict[str, Any]:
        result = run.finish(job)
        self.log.info(
            "Vertex AI job %s %s in %ss; estimated cost $%s (%s)",
            result["job_id"],
            result["state"],
            result["duration_s"],
            result["cost_usd"],
            result["cost_basis"],
        )
        if not job.succeeded:
            from airflow.exceptions import AirflowException

            raise AirflowException(
                f"Vertex AI job {result['job_id']} ended {job.state}: {job.error or 'no error message'} "
                f"({result['console_url']})"
            )
        return result

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that crashed or timed out resumes with ``__fail__``: cancel the job first."""
        if next_method == "__fail__":
            try:
                self._new_run(context).kill()
            except Exception:
                self.log.exception("Cancelling the job after the failed deferral did not complete")
        return super().resume_execution(next_method, next_kwargs, context)

    def on_kill(self) -> None:
        """Killed on the worker (submitting or waiting): cancel the job with the task."""
        if self._run is not None:
            self._run.kill()

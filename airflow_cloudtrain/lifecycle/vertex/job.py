"""One MLEngineTrainOperator task's Vertex AI custom job: find or submit, wait, report, cancel.

The order, and why:

1. **Find before submitting.** Every job carries the run key's labels; a try lists the run key's jobs
   first. One still running (an earlier try's worker was killed, or the triggerer lost the task) is
   re-attached, never duplicated. One that succeeded but whose result was never delivered to Airflow
   (the worker died after the end) is delivered as is. Otherwise a new job is submitted: a retry after
   a failed job runs again, in the same job folder, so it starts from the failed job's checkpoints.
2. **Write-ahead.** The job is recorded in the resource ledger (``task_state_store``) before the create
   call and its name after it; a worker killed inside the call leaves a job the label search finds.
3. **One teardown.** Killing the task, a failed wait, or a failed deferral cancels the job through the
   ledger (``clouds.vertex``: teardown of a Vertex job is a cancel).

The job folder is ``<bucket>/<job_id>/`` (``baseOutputDirectory``: replicas get ``AIP_MODEL_DIR``,
``AIP_CHECKPOINT_DIR``, ``AIP_TENSORBOARD_LOG_DIR`` under it, and legacy code gets ``--job-dir``).
``resume_from`` names an earlier job: the new job writes into that job's folder, the folder of the job
that first created it -- resuming a resumed job still points at the first, as the detector's
``--resume`` required -- found from the earlier job's own ``baseOutputDirectory``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.gcp.vertex import CANCELLING, KIND, PAUSED, JobRecord, VertexJobs, console_url
from airflow_cloudtrain.contract.runs import TAG_RUN_URI, RunKey, join
from airflow_cloudtrain.core.engine import poll_until
from airflow_cloudtrain.core.ledger import ResourceLedger, store_get, store_set
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry
from airflow_cloudtrain.lifecycle.vertex.cost import estimate_cost
from airflow_cloudtrain.lifecycle.vertex.logs import JobLogTail, LogStream
from airflow_cloudtrain.mlengine import ROLES, MachineSpec, ReplicaPool, worker_pool_specs
from airflow_cloudtrain.mlengine.job import EXECUTOR_CPU, EXECUTOR_GPU, JobConfig

if TYPE_CHECKING:
    from airflow_cloudtrain.hooks.vertex import VertexHook
    from airflow_cloudtrain.storage import RunFolder

STORE_KEY = "cloudtrain_vertex"  # task_state_store: the job id chosen by the first try


class OverBudget(RuntimeError):
    """``max_cost``: the job's cost by the next poll would pass the budget (the task fails saying so)."""


class JobKilled(RuntimeError):
    """The task was killed while its job was being submitted or waited for."""


def _label(text: str) -> str:
    import re

    return re.sub(r"[^a-z0-9_-]", "_", text.lower())[:63]


def delivered_key(numeric_id: str) -> str:
    return f"_cloudtrain/jobs/{numeric_id}/delivered.json"


def first_job_of(output_dir: str | None) -> str | None:
    return output_dir.rstrip("/").rsplit("/", 1)[-1] if output_dir else None


class VertexJobRun:
    """The job of one task instance (one run key), in one project and region."""

    def __init__(
        self,
        config: JobConfig,
        key: RunKey,
        hook: VertexHook,
        store: Any = None,  # Airflow's task_state_store (None: nothing persisted across tries)
        logger: logging.Logger | None = None,
        try_number: int = 1,
    ) -> None:
        self.config = config
        self.key = key
        self.hook = hook
        self.store = store
        self.log = logger or logging.getLogger(__name__)
        self.try_number = try_number
        self.project = hook.project
        self.jobs = VertexJobs(hook.job_client(config.region), self.project, config.region)
        self.ledger = ResourceLedger.load(key.digest, store, self.log)
        self.killed = threading.Event()

    def folder(self, uri: str) -> RunFolder:
        folder: RunFolder = self.hook.run_folder(uri)
        return folder

    # --- start: re-attach, deliver, or submit ----------------------------------------------------

    def start(self) -> JobRecord:
        """The task's job: an earlier try's (running, or finished and unreported) or a new one."""
        earlier = call_with_retry(lambda: self.jobs.find(self.key.digest))
        if any(j.state == CANCELLING for j in earlier):  # a cancel in flight ends its job: then go on
            earlier = self._cancels_done(earlier)
        running = [j for j in earlier if not j.terminal]
        if running:
            job = running[0]
            self.log.info(
                "Re-attaching to Vertex AI job %s (%s, %s), submitted by an earlier try",
                job.display_name,
                job.name,
                job.state,
            )
            self.ledger.add(KIND, job.name, job.region)
            return job
        if earlier and earlier[0].succeeded and not self.delivered(earlier[0]):
            job = earlier[0]
            self.log.info(
                "Vertex AI job %s (%s) already succeeded in an earlier try: delivering that result",
                job.display_name,
                job.name,
            )
            return job
        try:
            return self._submit({j.name for j in earlier})
        except BaseException:
            self.cancel()  # a create that went through before the failure must not run on
            raise

    def _cancels_done(self, jobs: list[JobRecord], timeout_s: float = 600.0) -> list[JobRecord]:
        """Wait for jobs being cancelled (a failed or killed earlier try, a cleared task) to end, so a
        retry submits anew instead of re-attaching to a job that is about to be CANCELLED. A kill
        ends the wait (the submit that follows then refuses to run)."""
        self.log.info("Waiting for an earlier try's job to finish cancelling before submitting")
        deadline = time.monotonic() + timeout_s

        def settled() -> list[JobRecord] | None:
            found = self.jobs.find(self.key.digest)
            cancelling = any(j.state == CANCELLING for j in found)
            if cancelling and time.monotonic() < deadline and not self.killed.is_set():
                return None
            return found

        return poll_until(settled, 5.0, stopped=self.killed.is_set, on_transient=self._transient)

    def job_id(self) -> str:
        """The configured id, else the one the first try chose (``<task>_<UTC timestamp>``)."""
        if self.config.job_id:
            return self.config.job_id
        stored = store_get(self.store, STORE_KEY) or {}
        if stored.get("run_key") == self.key.digest and stored.get("job_id"):
            return str(stored["job_id"])
        base = "".join(c if c.isalnum() else "_" for c in self.key.task_id) or "train"
        base = base if base[0].isalpha() else f"job_{base}"
        job_id = f"{base[:90]}_{datetime.now(timezone.utc):%Y%m%d_%H%M%S}"
        if self.key.map_index >= 0:
            job_id += f"_{self.key.map_index}"
        store_set(self.store, STORE_KEY, {"run_key": self.key.digest, "job_id": job_id})
        return job_id

    def resolve_folder(self, job_id: str) -> tuple[str, str | None]:
        """(job folder, the first job's id when resuming)."""
        if not self.config.resume_from:
            return join(self.config.bucket, job_id), None
        name = self.config.resume_from
        named = call_with_retry(lambda: self.jobs.named(name))
        bucket = self.config.bucket.rstrip("/") + "/"
        named.sort(key=lambda j: not (j.output_dir or "").startswith(bucket))  # this bucket's first
        for job in named:
            if job.output_dir:
                first = first_job_of(job.output_dir) or name
                if first != name:
                    self.log.info(
                        "Job %s itself resumed %s: resuming from the first job's folder", name, first
                    )
                return job.output_dir.rstrip("/"), first
        folder = join(self.config.bucket, name)
        if self.folder(folder).list(""):
            return folder, name
        raise ValueError(
            f"resume_from={name!r}: no Vertex AI job named {name!r} in {self.project}/{self.config.region} "
            f"and no job folder {folder}/ (resume_from takes the id of an earlier job of this bucket)"
        )

    def body(
        self, job_id: str, job_dir: str, resumed_from: str | None, packages: list[str]
    ) -> dict[str, Any]:
        """The CustomJob, snake_case as google-cloud-aiplatform takes it."""
        c = self.config
        env = {**c.env, "CLOUDTRAIN_JOB_ID": job_id}
        if resumed_from:
            env["CLOUDTRAIN_RESUMED_FROM"] = resumed_from
        env_list = [{"name": k, "value": v} for k, v in sorted(env.items())]
        if c.python_module:
            args = list(c.training_args)
            if "--job-dir" not in args and not any(a.startswith("--job-dir=") for a in args):
                args += ["--job-dir", job_dir]  # what ML Engine passed to legacy trainers
            code = {
                "python_package_spec": {
                    "executor_image_uri": c.executor_image or (EXECUTOR_GPU if c.has_gpu else EXECUTOR_CPU),
                    "package_uris": packages,
                    "python_module": c.python_module,
                    "args": args,
                    "env": env_list,
                }
            }
        else:
            container: dict[str, Any] = {"image_uri": c.image, "args": list(c.training_args), "env": env_list}
            if c.command:
                container["command"] = list(c.command)
            code = {"container_spec": container}
        pools = [dict(spec, **code) if spec else {} for spec in worker_pool_specs(c.pools)]
        scheduling: dict[str, Any] = {"restart_job_on_worker_restart": c.restart_job_on_worker_restart}
        if c.max_runtime_s:
            scheduling["timeout"] = timedelta(seconds=int(c.max_runtime_s))
        if c.spot:
            scheduling["strategy"] = "SPOT"
        labels = {k: _label(v) for k, v in self.key.tags().items() if k != TAG_RUN_URI}
        labels["cloudtrain-job-id"] = _label(job_id)
        labels["cloudtrain-try"] = str(self.try_number)
        spec: dict[str, Any] = {
            "worker_pool_specs": pools,
            "base_output_directory": {"output_uri_prefix": job_dir},
            "scheduling": scheduling,
        }
        if c.service_account:
            spec["service_account"] = c.service_account
        return {"display_name": job_id, "job_spec": spec, "labels": labels}

    def _submit(self, earlier: set[str]) -> JobRecord:
        job_id = self.job_id()
        job_dir, resumed_from = self.resolve_folder(job_id)
        packages = list(self.config.packages)
        if self.config.code_dir:
            from airflow_cloudtrain.lifecycle.vertex.package import upload_package

            packages = [upload_package(self.config.code_dir, self.folder(job_dir))]
        body = self.body(job_id, job_dir, resumed_from, packages)
        if self.killed.is_set():
            raise JobKilled("the task was killed before its Vertex AI job was submitted")
        entry = self.ledger.intend(KIND, self.config.region)
        job = self._create(body, earlier)
        self.ledger.created(entry, job.name, job.region)
        self.log.info(
            "Submitted Vertex AI job %s (%s) writing to %s%s",
            job_id,
            job.name,
            job_dir,
            f", resuming {resumed_from}" if resumed_from else "",
        )
        if self.killed.is_set():
            raise JobKilled("the task was killed while its Vertex AI job was being submitted")
        return job

    def _create(self, body: dict[str, Any], earlier: set[str]) -> JobRecord:
        """Submit the job once, through throttling and server errors (README: throttling is ridden
        out). A refused create (429) made nothing, but a 5xx or a dropped connection may come after
        the job was made, and Vertex's create takes no request id: so once a create failed, every
        next attempt first lists the run key's jobs and takes a new one (not in ``earlier``, the jobs
        that were there before) instead of creating a second job."""
        failed = [False]

        def once() -> JobRecord:
            if self.killed.is_set():  # not transient: the retries stop
                raise JobKilled("the task was killed while its Vertex AI job was being submitted")
            if failed[0]:
                made = [j for j in self.jobs.find(self.key.digest) if j.name not in earlier]
                if made:
                    self.log.info("The failed create of %s went through: taking it", made[0].name)
                    return made[0]
            try:
                return self.jobs.create(body)
            except Exception:
                failed[0] = True
                raise

        def retrying(err: BaseException, delay: float) -> None:
            self.log.warning("Submitting the Vertex AI job failed (%s); retrying in %.0f s", err, delay)

        return call_with_retry(once, on_retry=retrying)

    # --- wait (blocking) --------------------------------------------------------------------------

    def log_tail(self, job: JobRecord) -> JobLogTail:
        return JobLogTail(self.hook, job.numeric_id, self.folder(job.output_dir) if job.output_dir else None)

    def _transient(self, err: BaseException, delay: float) -> None:
        self.log.warning("Transient error polling Vertex AI (%s); retrying in %.0f s", err, delay)

    def wait(
        self,
        job: JobRecord,
        poll_interval: float,
        log_interval: float,
        budget: Callable[[JobRecord, float], str | None] | None = None,
        renew: Callable[[], object] | None = None,
    ) -> JobRecord:
        """Poll the job until it ends, showing its log lines; cancelled with the task (``kill``). A failed
        log read never fails the wait (``LogStream``). The job is read every ``poll_interval`` and its
        log every ``log_interval``: ``poll_until`` ticks at the shorter of the two."""
        logs = LogStream(self.log, log_interval)
        name = job.name
        next_read = [0.0]  # monotonic time of the next read of the job

        def ended() -> JobRecord | None:
            if self.killed.is_set():
                raise JobKilled(f"the task was killed while waiting for {name}")
            if renew is not None:
                renew()  # the job's lease, when due (``core.lease``)
            if time.monotonic() >= next_read[0]:
                fresh = self.jobs.get(name)  # a transient error: backed off in ``poll_until``
                next_read[0] = time.monotonic() + poll_interval
                if fresh is None:
                    raise RuntimeError(f"Vertex AI job {name} no longer exists (deleted?)")
                if logs.tail is None:
                    logs.tail = logs.guard(self.log_tail, fresh)
                if fresh.terminal:
                    logs.drain(lambda: show_lines(self.log, logs.tail))
                    return fresh
                over = budget(fresh, time.time()) if budget is not None else None
                if over is not None:  # the engine's abandon cancels the job through the ledger
                    raise OverBudget(over)
            if logs.due():
                logs.guard(show_lines, self.log, logs.tail)
            return None

        tick = min(poll_interval, max(0.5, log_interval))
        return poll_until(ended, tick, stopped=self.killed.is_set, on_transient=self._transient)

    def over(self, job: JobRecord) -> bool:
        """Has the job already ended? Checked once just before deferring: a trigger that fires within
        seconds of the deferral hits Airflow's race in which the scheduler applies the stale "success"
        of the defer exit to the resumed try and fails the task (apache/airflow#66374); an ended job is
        finished in the worker instead (``wait`` returns at once). Never raises: when in doubt, defer."""
        try:
            fresh = call_with_retry(lambda: self.jobs.get(job.name))
        except Exception as err:
            self.log.warning("Could not check %s before deferring (%s); deferring", job.name, err)
            return False
        if fresh is not None and fresh.terminal:
            self.log.info(
                "Vertex AI job %s already %s: finishing in the worker, not deferring", job.name, fresh.state
            )
            return True
        return False

    def show_rest(self, job: JobRecord) -> None:
        """The lines of a finished job that no try showed yet (it ended while no one watched)."""
        logs = LogStream(self.log, 0.0)
        logs.tail = logs.guard(self.log_tail, job)
        logs.drain(lambda: show_lines(self.log, logs.tail))

    # --- end --------------------------------------------------------------------------------------

    def delivered(self, job: JobRecord) -> bool:
        if not job.output_dir:
            return False
        return self.folder(job.output_dir).get_bytes(delivered_key(job.numeric_id)) is not None

    def finish(self, job: JobRecord) -> dict[str, Any]:
        """The XCom of a finished job; marks it delivered, so a re-run of the task submits anew."""
        if job.state == PAUSED:  # a paused job fails the task, and must not resume unwatched later
            self.cancel()
        result = job_result(job, self.config.pools)
        if job.output_dir:
            self.folder(job.output_dir).put_text(
                delivered_key(job.numeric_id), json.dumps(delivered_record(job, result, time.time()))
            )
        self.ledger.entries = [e for e in self.ledger.entries if e.id != job.name]
        self.ledger._save()
        return result

    def cancel(self) -> list[str]:
        """Cancel the task's job(s) through the ledger (and the label sweep); the names cancelled."""
        released = call_with_retry(
            lambda: self.ledger.release(self.jobs), TransientBudget(budget_s=25.0, cap_s=5.0)
        )
        return [r.id or "" for r in released]

    def kill(self) -> None:
        self.killed.set()
        try:
            cancelled = self.cancel()
            self.log.info("Cancelled %s because the task was killed", ", ".join(cancelled) or "nothing")
        except Exception:
            self.log.exception("Cancelling the Vertex AI job after the kill did not complete")


def show_lines(log: logging.Logger, tail: JobLogTail | None) -> int:
    """Show a tail's new lines in the task log, then save its cursor; how many (none without a tail)."""
    if tail is None:
        return 0
    lines = tail.poll()
    for line in lines:
        log.info("%s", line.render())
    if lines:
        tail.commit()
    return len(lines)


def pools_of(job: JobRecord, requested: list[ReplicaPool]) -> list[ReplicaPool]:
    """The job's own pools (what Vertex runs), with the names the user asked for where they match."""
    by_index = {p.index: p for p in requested}
    out = []
    for pool in job.pools:
        index = int(pool["index"])
        machine = MachineSpec(
            pool["machine_type"], pool.get("accelerator_type"), int(pool.get("accelerator_count") or 0)
        )
        asked = by_index.get(index)
        out.append(ReplicaPool(ROLES[index], machine, int(pool["count"]), asked.requested if asked else None))
    return out


def delivered_record(job: JobRecord, result: dict[str, Any], at: float) -> dict[str, Any]:
    """``delivered.json``: the job's result reached Airflow (``at``), with what the job itself told of
    its life (created, running from, ended), its state and estimate: the Cloud training page draws
    the jobs of a job folder from these (``ui.vertex_timeline``), a retry's and a resume's too."""
    return {
        "state": job.state,
        "at": at,
        "job_id": job.display_name,
        "job_name": job.name,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "spot": job.spot,
        "machine_type": job.pools[0]["machine_type"] if job.pools else None,
        "replicas": sum(int(p.get("count") or 0) for p in job.pools),
        "cost_usd": result.get("cost_usd"),
    }


def job_result(job: JobRecord, requested: list[ReplicaPool]) -> dict[str, Any]:
    """The XCom dict (JSON-safe)."""
    pools = pools_of(job, requested)
    duration = job.duration_s(time.time())
    cost, basis = estimate_cost(pools, job.region, job.spot, duration or 0.0)
    first = first_job_of(job.output_dir)
    return {
        "job_id": job.display_name,
        "job_name": job.name,
        "job_dir": job.output_dir,
        "state": job.state,
        "error": job.error,
        "console_url": console_url(job.project, job.region, job.numeric_id),
        "project_id": job.project,
        "region": job.region,
        "spot": job.spot,
        "replicas": [p.to_xcom() for p in pools],
        "duration_s": None if duration is None else round(duration, 1),
        "cost_usd": None if cost is None else round(cost, 4),
        "cost_is_estimate": True,
        "cost_basis": basis,
        "resumed_from": first if first and first != job.display_name else None,
    }

"""The Vertex AI job as an ``Engine``: ``MLEngineTrainOperator`` on the one operator skeleton.

``VertexJobRun`` (``job.py``) does the work (find or submit, wait while streaming the log, report,
cancel through the ledger); this maps it onto the skeleton's calls:

- ``start``: the task's job (an earlier try's, or a new one); an earlier try's job that already
  ended shows its last log lines and is delivered at once.
- ``trigger``: ``triggers.vertex_job.VertexJobTrigger``, named by classpath (kwargs and event shape
  unchanged: tasks deferred by an earlier release resume).
- ``advance`` / ``resume``: the XCom dict, or the task fails ("Vertex AI job ... ended ..."); an
  event other than ``done`` (the wait failed in the triggerer) cancels the job first.
- ``abandon`` / ``kill``: cancel the job (the teardown of a Vertex job is a cancel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.gcp.vertex import JobRecord

if TYPE_CHECKING:
    from airflow_cloudtrain.core.engine import Step, TriggerSpec
    from airflow_cloudtrain.core.lease import LeaseRenewer
    from airflow_cloudtrain.lifecycle.running_entry import RunningEntry
    from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun

TRIGGER = "airflow_cloudtrain.triggers.vertex_job.VertexJobTrigger"  # stored in Airflow's DB: keep it


@dataclass(frozen=True)
class VertexWait:
    """How the job is waited for: the connection the trigger re-reads, and the two cadences."""

    conn_id: str
    poll_interval: float
    log_polling_interval: float
    max_cost_usd: float | None = None  # ``max_cost`` (``core.budget.replicas_over_budget``)
    hourly_usd: float | None = None  # every replica of every pool together, at list prices
    orphan_timeout: float | None = None  # the job's lease (``core.lease``), in its job folder

    def lease(self, run: VertexJobRun, job: JobRecord) -> LeaseRenewer:
        """The job's lease: no agent of ours reads it; ``cloudtrain gc`` cancels a job whose lease
        lapsed (a Vertex job whose watcher is gone)."""
        from airflow_cloudtrain.core.lease import LeaseRenewer

        output = job.output_dir
        return LeaseRenewer(
            lambda: run.folder(output or ""), self.orphan_timeout if output else None, "vertex", run.log
        )


class VertexEngine:
    """``MLEngineTrainOperator``'s engine: one Vertex AI custom job, from submit to its XCom."""

    def __init__(self, run: VertexJobRun, wait: VertexWait) -> None:
        self.run = run
        self.settings = wait
        self.index: RunningEntry | None = None  # the job in the bucket's running index (once started)

    def start(self) -> Step[JobRecord]:
        from airflow_cloudtrain.core.engine import Step

        job = self.run.start()
        if job.terminal:  # an earlier try's job ended while nobody watched: its last lines, its result
            self.run.show_rest(job)
            return self.advance(job, job)
        self.settings.lease(self.run, job).renew(force=True)  # a task killed before its first poll
        self.index = self._running_entry(job)
        if self.settings.orphan_timeout is None:
            self.run.log.info(
                "orphan_timeout=None: no lease; cloudtrain gc never cancels this job as orphaned"
            )
        return Step.waiting(job)

    def over(self, handle: JobRecord) -> bool:
        return self.run.over(handle)

    def trigger(self, handle: JobRecord) -> TriggerSpec:
        from airflow_cloudtrain.core.engine import TriggerSpec

        return TriggerSpec(
            TRIGGER,
            {
                "job_name": handle.name,
                "conn_id": self.settings.conn_id,
                "project_id": self.run.project,
                "poll_interval": self.settings.poll_interval,
                "log_polling_interval": self.settings.log_polling_interval,
                "job_dir": handle.output_dir,
                "max_cost": self.settings.max_cost_usd,
                "hourly_usd": self.settings.hourly_usd,
                "orphan_timeout": self.settings.orphan_timeout,
                "index": self.index.to_dict() if self.index is not None else None,
            },
        )

    def wait(self, handle: JobRecord) -> JobRecord:
        from airflow_cloudtrain.core.budget import replicas_over_budget

        settings = self.settings

        def budget(job: JobRecord, now: float) -> str | None:
            return replicas_over_budget(
                settings.max_cost_usd, settings.hourly_usd, job.started_at, now, settings.poll_interval
            )

        lease, index, run = settings.lease(self.run, handle), self.index, self.run

        def renew() -> None:
            lease.renew()
            if index is not None and index.due(time.time()):  # the running index's sign of life
                index.update(run.folder(index.bucket), run.log, time.time())

        return run.wait(handle, settings.poll_interval, settings.log_polling_interval, budget, renew=renew)

    def _running_entry(self, job: JobRecord) -> RunningEntry:
        """The job in the bucket's running index while it runs: its replicas, their list price per hour
        (``lifecycle.running_entry``; refreshed by the wait, taken out when it is priced or cancelled)."""
        from airflow_cloudtrain.lifecycle.running_entry import RunningEntry
        from airflow_cloudtrain.lifecycle.vertex.cost import estimate_cost
        from airflow_cloudtrain.lifecycle.vertex.job import pools_of

        run = self.run
        pools = pools_of(job, run.config.pools)
        entry = RunningEntry.of(
            run.config.bucket,
            run.key,
            operator="MLEngineTrainOperator",
            run_id=job.display_name,
            run_uri=job.output_dir or "",
            cloud="vertex",
            name=job.display_name,
            instance_type=pools[0].machine.machine_type if pools else None,
            nodes=sum(p.count for p in pools),
            spot=job.spot,
            hourly_usd=estimate_cost(pools, job.region, job.spot, 3600.0)[0],
            started_at=float(job.started_at or job.created_at or time.time()),
        )
        entry.write(run.folder(run.config.bucket), run.log)
        return entry

    def _unindex(self, job_id: str | None = None) -> None:
        """The job out of the running index (best effort): ``job_id`` its display name."""
        from airflow_cloudtrain.lifecycle.cost_index import clear_running

        run = self.run
        name = job_id or (self.index.record.instance_id if self.index is not None else None)
        if not name:
            return  # not started by this engine: the record goes stale, ``cloudtrain gc`` deletes it
        try:
            clear_running(run.folder(run.config.bucket), name, name, run.log)
        except Exception as err:
            run.log.warning("Could not take the job out of the bucket's running index (%s)", err)

    def _index_cost(self, result: dict[str, Any]) -> None:
        """The job's row in the bucket's cost index (``lifecycle.cost_index``; best effort)."""
        import time

        from airflow_cloudtrain.lifecycle.cost_index import vertex_record, write_record

        run = self.run
        try:
            bucket = run.folder(run.config.bucket)
        except Exception as err:
            run.log.warning("Could not add the job to the bucket's cost index (%s)", err)
            return
        write_record(bucket, vertex_record(result, run.key, time.time()), run.log)

    def advance(self, handle: JobRecord, outcome: JobRecord) -> Step[JobRecord]:
        """The job ended (``outcome``: its final record): report it; raise unless it succeeded."""
        from airflow_cloudtrain.core.engine import Step

        result = self.run.finish(outcome)
        self._index_cost(result)
        self._unindex(outcome.display_name)
        self.run.log.info(
            "Vertex AI job %s %s in %ss; estimated cost $%s (%s)",
            result["job_id"],
            result["state"],
            result["duration_s"],
            result["cost_usd"],
            result["cost_basis"],
        )
        if not outcome.succeeded:
            from airflow.exceptions import AirflowException

            raise AirflowException(
                f"Vertex AI job {result['job_id']} ended {outcome.state}: "
                f"{outcome.error or 'no error message'} ({result['console_url']})"
            )
        return Step.finished(result)

    def resume(self, event: Any) -> Step[JobRecord]:
        """``{"status": "done", "job": ...}`` delivers; anything else (the deferred wait failed)
        cancels the job and fails the task with the trigger's message."""
        event = event if isinstance(event, dict) else {}
        if event.get("status") != "done":
            try:
                cancelled = self.run.cancel()
                self.run.log.info(
                    "Cancelled %s after the deferred wait failed", ", ".join(cancelled) or "nothing"
                )
            except Exception:
                self.run.log.exception("Cancelling the job after the failed wait did not complete")
            from airflow.exceptions import AirflowException

            raise AirflowException(event.get("message") or "waiting for the Vertex AI job failed")
        job = JobRecord.from_dict(event["job"])
        return self.advance(job, job)

    def abandon(self, reason: str) -> None:
        """A failed or killed wait, a failed deferral: the job must not run on unwatched."""
        self.run.kill()
        self._unindex()

    def kill(self) -> None:
        self.run.kill()
        self._unindex()

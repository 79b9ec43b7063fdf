"""The emulated Vertex AI's state: CustomJobs and their lifecycle, the delete operations, and the jobs'
replicas as the runner sees them. No HTTP here (``vertex.py`` serves it).

Lifecycle, on the wall clock: JOB_STATE_QUEUED for ``queued_s``, JOB_STATE_PENDING for ``pending_s``,
then JOB_STATE_RUNNING: every replica is a local process (``seen()``, which the runner polls, lists
them; ``replica_exited`` hears of their ends). Then:

* the chief (``workerpool0-0``) exits 0: JOB_STATE_SUCCEEDED, the other replicas are stopped (parameter
  servers usually never exit);
* any replica exits non-zero: JOB_STATE_FAILED, error code 3 and Vertex's message ``The replica
  workerpool1-0 exited with a non-zero status of 1. ...``, the others stopped. (Vertex may first restart
  a replica in place after some system errors; a user program's failure fails the job, as here.)
* ``scheduling.timeout`` passes (counted from startTime): JOB_STATE_FAILED, code 4 (DEADLINE_EXCEEDED);
* cancel: JOB_STATE_CANCELLING until every replica process is gone, then JOB_STATE_CANCELLED with
  error ``{code: 1, message: "CANCELED"}``.

A stopped replica's machine shuts down as the runner shuts any machine down: SIGTERM, a grace, then
every process of it is killed. Transitions are worked out whenever state is read (``_sweep``); the end
of a cancel and a preempted replica's restart wait for the runner to let go of the old processes, so
they are decided in ``seen()`` (the runner's own thread, between two of its polls).

Locking: the runner calls ``replica_exited`` holding its lock, so this state never waits for the
runner's lock while holding its own (it reads ``runner.held()``/``pids()`` first).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.emulator.gcp.vertex_cluster import Replica, build_replicas, launcher
from airflow_cloudtrain.emulator.gcp.vertex_jobs import (
    CANCELLED,
    CANCELLING,
    CHIEF,
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    Job,
    VertexError,
    job_filter,
    matches,
    timestamp,
)
from airflow_cloudtrain.emulator.gcp.vertex_logs import LogStore
from airflow_cloudtrain.emulator.gcp.vertex_validate import check_custom_job, duration_s
from airflow_cloudtrain.emulator.runner import Seen

if TYPE_CHECKING:
    from airflow_cloudtrain.emulator.runner import InstanceRunner

log = logging.getLogger(__name__)


class VertexState:
    """CustomJobs of any project and location, behind one lock (module doc)."""

    queued_s: float = 0.2
    pending_s: float = 0.2

    def __init__(self, workdir: Path, replica_env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.replica_env = dict(replica_env or {})  # the emulated endpoints, for every replica
        self.runner: InstanceRunner | None = None
        self.logs = LogStore()
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {}
        self._ops: dict[str, dict[str, Any]] = {}
        self._rids: dict[str, tuple[str, str, int]] = {}  # runner id -> (job id, task, attempt)
        self._seq = itertools.count(1)

    # --- the API ---------------------------------------------------------------------------------

    def create_job(self, project: str, location: str, body: dict[str, Any]) -> dict[str, Any]:
        display_name, spec, labels = check_custom_job(body)
        now = time.time()
        with self._lock:
            job_id = str(10**18 + secrets.randbelow(9 * 10**18))
            job = Job(
                job_id, project, location, display_name, spec, labels, next(self._seq), now, state_t=now
            )
            self._jobs[job_id] = job
            self.logs.add(project, job_id, "service", "Waiting for job to be provisioned.")
            return job.show()

    def get_job(self, project: str, location: str, job_id: str) -> dict[str, Any]:
        with self._lock:
            return self._job(project, location, job_id).show()

    def list_jobs(
        self, project: str, location: str, filter_: str, page_size: int, page_token: str
    ) -> dict[str, Any]:
        clauses = job_filter(filter_)
        if page_token and not page_token.isdigit():
            raise VertexError(400, f"Invalid page token {page_token!r}.")
        with self._lock:
            self._sweep(time.time())
            found = sorted(
                (
                    j
                    for j in self._jobs.values()
                    if (j.project, j.location) == (project, location) and matches(j, clauses)
                ),
                key=lambda j: -j.seq,  # newest first
            )
            if page_token:
                found = [j for j in found if j.seq < int(page_token)]
            size = page_size if page_size > 0 else 100
            out: dict[str, Any] = {"customJobs": [j.show() for j in found[:size]]} if found else {}
            if len(found) > size:
                out["nextPageToken"] = str(found[size - 1].seq)
            return out

    def cancel_job(self, project: str, location: str, job_id: str) -> None:
        with self._lock:
            job = self._job(project, location, job_id)
            if job.state in TERMINAL:
                message = f'Cannot cancel CustomJob "{job.name}": it is in state {job.state}.'
                raise VertexError(400, message, "FAILED_PRECONDITION")
            if job.state != CANCELLING:
                self._set(job, CANCELLING, time.time())
                self.logs.add(job.project, job.id, "service", "Job is being cancelled.")
                if self.runner is None:
                    self._finish_cancel(job, time.time())

    def delete_job(self, project: str, location: str, job_id: str) -> dict[str, Any]:
        with self._lock:
            job = self._job(project, location, job_id)
            if job.state not in TERMINAL:
                message = (
                    f'CustomJob "{job.name}" is in state {job.state} and cannot be deleted; '
                    "cancel it and wait for it to end first."
                )
                raise VertexError(400, message, "FAILED_PRECONDITION")
            del self._jobs[job.id]
            now = timestamp(time.time())
            op_name = f"projects/{project}/locations/{location}/operations/{secrets.randbelow(10**19)}"
            op = {
                "name": op_name,
                "metadata": {
                    "@type": "type.googleapis.com/google.cloud.aiplatform.v1.DeleteOperationMetadata",
                    "genericMetadata": {"createTime": now, "updateTime": now},
                },
                "done": True,
                "response": {"@type": "type.googleapis.com/google.protobuf.Empty"},
            }
            self._ops[op_name] = op
            return op

    def get_operation(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name not in self._ops:
                raise VertexError(404, f"Operation {name} is not found.")
            return self._ops[name]

    # --- lifecycle -------------------------------------------------------------------------------

    def _job(self, project: str, location: str, job_id: str) -> Job:
        self._sweep(time.time())
        job = self._jobs.get(job_id)
        if job is None or (job.project, job.location) != (project, location):
            name = f"projects/{project}/locations/{location}/customJobs/{job_id}"
            raise VertexError(404, f'The CustomJob "{name}" does not exist.')
        return job

    def _set(self, job: Job, state: str, t: float) -> None:
        job.state, job.state_t = state, t

    def _sweep(self, now: float) -> None:
        """Move jobs on by the clock: queued -> pending -> running, running past its timeout."""
        for job in list(self._jobs.values()):
            if job.state == QUEUED and now >= job.state_t + self.queued_s:
                self._set(job, PENDING, job.state_t + self.queued_s)
            if job.state == PENDING and now >= job.state_t + self.pending_s:
                try:
                    self._start(job, job.state_t + self.pending_s)
                except Exception as exc:  # the runner's poll (every instance's too) must go on
                    log.exception("vertex emulator: could not start the replicas of %s", job.name)
                    self._end(job, FAILED, now, {"code": 13, "message": f"Internal error: {exc}"})
            timeout = duration_s(job.scheduling.get("timeout"))
            if job.state == RUNNING and timeout and job.start_t and now >= job.start_t + timeout:
                message = f"Job failed: it ran past its timeout of {job.scheduling['timeout']} (scheduling.timeout)."
                self._end(job, FAILED, now, {"code": 4, "message": message})

    def _start(self, job: Job, t: float) -> None:
        self._set(job, RUNNING, t)
        job.start_t = t
        root = self.workdir / job.id
        job.replicas = build_replicas(job.id, job.project, job.spec, root, self.replica_env)
        for rep in job.replicas.values():
            rep.running = True
            self._register(job, rep)
            self.logs.watch(root / "logs" / f"{rep.task}.jsonl", job.project, job.id, rep.task)
        self.logs.add(job.project, job.id, "service", "Waiting for training program to start.")

    def _register(self, job: Job, rep: Replica) -> None:
        rid = rep.rid(job.id)
        self._rids[rid] = (job.id, rep.task, rep.attempt)
        job.rids.append(rid)

    def _end(self, job: Job, state: str, t: float, error: dict[str, Any] | None = None) -> None:
        """A terminal state: the replicas still running are stopped (they leave ``seen``)."""
        self._set(job, state, t)
        job.end_t, job.error = t, error
        for rep in job.replicas.values():
            rep.running = False
        if state == SUCCEEDED:
            self.logs.add(job.project, job.id, "service", "Job completed successfully.")
        elif error:
            self.logs.add(job.project, job.id, "service", error["message"], "ERROR")

    def _finish_cancel(self, job: Job, t: float) -> None:
        self._end(job, CANCELLED, t, {"code": 1, "message": "CANCELED"})
        self.logs.add(job.project, job.id, "service", "Job is cancelled.")

    def _failure(self, job: Job, task: str, code: int) -> str:
        logs = (
            f"https://console.cloud.google.com/logs/viewer?project={job.project}&resource=ml_job%2Fjob_id%2F"
            f"{job.id}&advancedFilter=resource.type%3D%22ml_job%22%0Aresource.labels.job_id%3D%22{job.id}%22"
        )
        return (
            f"The replica {task} exited with a non-zero status of {code}. Termination reason: Error. \n"
            f"To find out more about why your job exited please check the logs: {logs}"
        )

    # --- the runner's side -----------------------------------------------------------------------

    def seen(self) -> list[Seen]:
        """The replica machines that should run now (polled by the runner)."""
        held = self.runner.held() if self.runner is not None else set()
        out = []
        with self._lock:
            now = time.time()
            self._sweep(now)
            for job in self._jobs.values():
                if job.state == CANCELLING and not held.intersection(job.rids):
                    self._finish_cancel(job, now)
                if job.state != RUNNING:
                    continue
                spot = job.scheduling.get("strategy") == "SPOT"
                for rep in job.replicas.values():
                    rep.retired = [r for r in rep.retired if r in held]
                    if not rep.running or rep.retired:  # a preempted machine not gone yet: wait
                        continue
                    argv = [sys.executable, str(launcher()), str(rep.launch)]
                    cwd = str(rep.workdir())
                    seen = Seen("vertex", rep.rid(job.id), "", rep.machine_type, job.location, spot, rep.env)
                    seen.argv, seen.cwd = argv, cwd
                    out.append(seen)
        return out

    def replica_exited(self, seen: Seen) -> None:
        """A replica's process ended on its own with ``seen.returncode``."""
        with self._lock:
            job_id, task, attempt = self._rids.get(seen.id, ("", "", -1))
            job = self._jobs.get(job_id)
            rep = job.replicas.get(task) if job else None
            if (
                job is None
                or rep is None
                or rep.attempt != attempt
                or not rep.running
                or job.state != RUNNING
            ):
                return  # an earlier attempt, or a job that ended meanwhile
            rep.running, rep.exit_code = False, seen.returncode or 0
            now = time.time()
            if rep.exit_code:
                message = self._failure(job, task, rep.exit_code)
                self._end(job, FAILED, now, {"code": 3, "message": message})
            elif task == CHIEF:
                self._end(job, SUCCEEDED, now)

    # --- helpers for tests -----------------------------------------------------------------------

    def find(self, job: str) -> Job:
        """A job by full name, numeric id or display name (the newest of that name); KeyError if none."""
        with self._lock:
            self._sweep(time.time())
            key = job.rsplit("/", 1)[-1]
            if key in self._jobs:
                return self._jobs[key]
            named = [j for j in self._jobs.values() if j.display_name == job]
            if not named:
                raise KeyError(f"no CustomJob {job!r}")
            return max(named, key=lambda j: j.seq)

    def fail_job(self, job: str, message: str, code: int = 13) -> None:
        """The job fails now with that message (its replicas are stopped)."""
        with self._lock:
            found = self.find(job)
            if found.state in TERMINAL:
                raise ValueError(f"CustomJob {found.name} has ended already ({found.state})")
            self._end(found, FAILED, time.time(), {"code": code, "message": message})

    def preempt_replica(self, job: str, replica: str = CHIEF) -> None:
        """The spot VM of ``replica`` is reclaimed: its processes are killed and it restarts afresh (every
        replica does with ``restartJobOnWorkerRestart``); the job stays RUNNING."""
        with self._lock:
            found = self.find(job)
            if found.scheduling.get("strategy") != "SPOT":
                raise ValueError(f"CustomJob {found.name} does not run on spot VMs (scheduling.strategy)")
            if found.state != RUNNING or replica not in found.replicas:
                raise ValueError(f"CustomJob {found.name} ({found.state}) has no running replica {replica!r}")
            everyone = bool(found.scheduling.get("restartJobOnWorkerRestart"))
            for rep in found.replicas.values() if everyone else [found.replicas[replica]]:
                rep.retired.append(rep.rid(found.id))
                rep.attempt, rep.restarts, rep.running, rep.exit_code = (
                    rep.attempt + 1,
                    rep.restarts + 1,
                    True,
                    None,
                )
                self._register(found, rep)
            text = f"The replica {replica} was preempted (its spot VM was reclaimed); restarting " + (
                "every replica." if everyone else "it."
            )
            self.logs.add(found.project, found.id, "service", text, "WARNING")

    def job(self, job: str) -> dict[str, Any] | None:
        try:
            return self.find(job).show()
        except KeyError:
            return None

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            self._sweep(time.time())
            return [j.show() for j in sorted(self._jobs.values(), key=lambda j: -j.seq)]

    def replica_processes(self, job: str) -> dict[str, int | None]:
        """Task name -> pid of its current attempt's process (None: none runs)."""
        pids = self.runner.pids() if self.runner is not None else {}
        with self._lock:
            found = self.find(job)
            return {t: pids.get(r.rid(found.id)) for t, r in found.replicas.items()}

    def replica_restarts(self, job: str) -> dict[str, int]:
        with self._lock:
            return {t: r.restarts for t, r in self.find(job).replicas.items()}

"""The deferred wait of MLEngineTrainOperator: until the Vertex AI job ends, its log lines streamed.

Job states are shared: every deferred job of one (connection, project, region) in this triggerer is
read from one ``customJobs.list`` per poll (our active jobs, by the ``cloudtrain-managed`` label), and a
job missing from that list (it just ended) from one ``get``; a job that get does not find either is
asked for once more, directly, before its wait fails. The group's client follows its connection
(``hooks.follow``): an edited connection is seen within a minute, or at once after a failed call. Log lines are read per job on their own
cadence (``log_polling_interval``) from Cloud Logging and written to the task log with the replica and
the time the job wrote them; the cursor lives in the job folder, so a re-created trigger (triggerer
restart) neither repeats nor loses lines (``lifecycle.vertex_logs``). Every client call is blocking
(google-cloud-aiplatform's REST client, ``requests``) and runs in a worker thread, never on the loop.
``on_kill`` cancels the job: a task killed while deferred leaves nothing running.

The wait is the one async poll loop (``core.engine.apoll_until``): each poll takes the next shared
snapshot (``shared_poll.watch``, not its own retrying wrapper); a describe error reaches every watcher
of the group, and each watcher's own transient budget decides whether to wait it out (leaving the
group while it backs off, joining a fresh one after) or to fail its wait.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.clouds.gcp.vertex import JobRecord
from airflow_cloudtrain.core.budget import replicas_over_budget
from airflow_cloudtrain.core.engine import apoll_until
from airflow_cloudtrain.core.lease import LeaseRenewer
from airflow_cloudtrain.core.retry import TransientBudget
from airflow_cloudtrain.lifecycle.running_entry import RunningEntry
from airflow_cloudtrain.triggers import shared_poll
from airflow_cloudtrain.triggers.handover import killed_by_user

if TYPE_CHECKING:
    from airflow_cloudtrain.clouds.gcp.vertex import VertexJobs
    from airflow_cloudtrain.hooks.follow import Following
    from airflow_cloudtrain.lifecycle.vertex.logs import JobLogTail
    from airflow_cloudtrain.storage import RunFolder

_ENDED_KEPT = 1000
T = TypeVar("T")
Key = tuple[str, str, str | None, str]  # ("vertex", connection, project, region): one poll group


class VertexPoller:
    """The Vertex side of one poll group (connection, project, region): its ``VertexJobs`` client,
    built in a worker thread on first use and following the connection (``hooks.follow``: an edited
    connection, or another emulator's, is seen without a restart), and the final records of the jobs
    that ended while the group lived. Closed when the group ends."""

    def __init__(self, conn_id: str, project_id: str | None, region: str) -> None:
        from airflow_cloudtrain.hooks.follow import Following

        self.project_id = project_id
        self.region = region
        self.jobs: Following[VertexJobs] = Following(conn_id, self._make, lambda jobs: jobs.close())
        self._lock = threading.Lock()
        self._ended: dict[str, JobRecord] = {}  # job name -> its final record: it never changes again

    def _make(self) -> VertexJobs:
        return jobs_client(self.jobs.conn_id, self.project_id, self.region)

    def call(self, what: Callable[[VertexJobs], T]) -> T:
        """``what(VertexJobs)``; a failed call makes the next one re-read the connection first."""
        try:
            return what(self.jobs.get())
        except Exception:
            self.jobs.failed()
            raise

    def describe(self, names: list[str]) -> dict[str, JobRecord]:
        """Blocking: the watched jobs, from one list of our active jobs plus a get for each one missing.

        A job that ended is read once: its final record is kept, so polls that come before its trigger
        has left the group (it may still be draining log lines) cost no further reads."""
        wanted = set(names)
        found = {j.name: j for j in self.call(lambda jobs: jobs.active_managed()) if j.name in wanted}
        for name in sorted(wanted - set(found)):
            with self._lock:
                job = self._ended.get(name)
            if job is None:
                job = self.call(functools.partial(_get, name=name))
            if job is not None:
                found[name] = job
                if job.terminal:
                    self._remember_ended(job)
        return found

    def _remember_ended(self, job: JobRecord) -> None:
        with self._lock:
            self._ended[job.name] = job
            while len(self._ended) > _ENDED_KEPT:  # oldest first: dicts keep insertion order
                del self._ended[next(iter(self._ended))]

    def close(self) -> None:
        self.jobs.close()


def jobs_client(conn_id: str | None, project_id: str | None, region: str) -> VertexJobs:
    """Blocking: a new ``VertexJobs`` (one JobServiceClient) from the connection as it is now."""
    from airflow_cloudtrain.clouds.gcp.vertex import VertexJobs
    from airflow_cloudtrain.hooks.vertex import VertexHook

    hook = VertexHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id)
    return VertexJobs(hook.job_client(region), hook.project, region)


def _get(jobs: VertexJobs, name: str) -> JobRecord | None:
    return jobs.get(name)


def _make_poller(key: Hashable) -> VertexPoller:
    _kind, conn_id, project_id, region = cast("Key", key)
    return VertexPoller(conn_id, project_id, region)


async def _close_poller(poller: VertexPoller) -> None:
    await asyncio.to_thread(poller.close)


# One poller per poll group: it lives exactly as long as the group (a group that ended and started
# again, e.g. the next ``dag.test()`` under another emulator, builds its client anew).
POLLERS: shared_poll.Pool[VertexPoller] = shared_poll.Pool(_make_poller, _close_poller)


class VertexJobTrigger(BaseTrigger):
    """Waits for one Vertex AI custom job, streaming its log lines into the task log.

    Yields one event: ``{"status": "done", "job": <JobRecord as a dict>}`` when the job ended (any end:
    the task decides what fails), or ``{"status": "error", "message": ...}`` when the wait itself
    failed (the task then cancels the job). Killing the deferred task cancels the job (``on_kill``).

    :param job_name: the job's full name, ``projects/<project>/locations/<region>/customJobs/<id>``.
    :param conn_id: the Airflow Google connection (re-read while waiting: an edit is followed).
    :param project_id: the project, when the connection does not name it.
    :param poll_interval: seconds between reads of the job's state (shared by every job of the
        connection, project and region deferred in this triggerer).
    :param log_polling_interval: seconds between reads of the job's Cloud Logging lines.
    :param job_dir: the job folder (gs://), where the log cursor is kept across triggerer restarts;
        None: lines are not remembered.
    :param max_cost: ``max_cost`` in USD: the wait ends (an ``error`` event the task cancels the job on)
        before the job's cost would pass it; None: no budget.
    :param hourly_usd: every replica of the job together, USD per hour (list prices).
    """

    def __init__(
        self,
        job_name: str,
        conn_id: str = "google_cloud_default",
        project_id: str | None = None,
        poll_interval: float = 30.0,
        log_polling_interval: float = 30.0,
        job_dir: str | None = None,
        max_cost: float | None = None,
        hourly_usd: float | None = None,
        orphan_timeout: float | None = None,
        index: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.job_name = job_name
        self.conn_id = conn_id
        self.project_id = project_id
        self.poll_interval = poll_interval
        self.log_polling_interval = log_polling_interval
        self.job_dir = job_dir
        self.max_cost = max_cost
        self.hourly_usd = hourly_usd
        self.orphan_timeout = orphan_timeout  # the job's lease, renewed while waiting (``core.lease``)
        self.index = index  # its record in the bucket's running index (``lifecycle.running_entry``)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "conn_id": self.conn_id,
                "project_id": self.project_id,
                "poll_interval": self.poll_interval,
                "log_polling_interval": self.log_polling_interval,
                "job_dir": self.job_dir,
                "max_cost": self.max_cost,
                "hourly_usd": self.hourly_usd,
                "orphan_timeout": self.orphan_timeout,
                "index": self.index,
            },
        )

    @property
    def region(self) -> str:
        return self.job_name.split("/")[3]

    def _job_folder(self) -> RunFolder:
        from airflow_cloudtrain.hooks.vertex import VertexHook

        hook = VertexHook(gcp_conn_id=self.conn_id, project_id=self.project_id)
        folder: RunFolder = hook.run_folder(self.job_dir or "")
        return folder

    def _tail(self) -> JobLogTail:
        from airflow_cloudtrain.hooks.vertex import VertexHook
        from airflow_cloudtrain.lifecycle.vertex.logs import JobLogTail

        hook = VertexHook(gcp_conn_id=self.conn_id, project_id=self.project_id)  # the connection now
        folder = hook.run_folder(self.job_dir) if self.job_dir else None
        return JobLogTail(hook, self.job_name.rsplit("/", 1)[-1], folder)

    def _show(self, tail: JobLogTail | None) -> int:
        if tail is None:
            return 0
        lines = tail.poll()
        for line in lines:
            self.log.info("%s", line.render())
        if lines:
            tail.commit()
        return len(lines)

    def _watch(self, key: Key) -> AsyncIterator[dict[str, JobRecord]]:
        """The shared snapshots of the job's poll group (a failed describe is raised here)."""

        async def describe(names: list[str]) -> dict[str, JobRecord]:
            return await asyncio.to_thread(POLLERS.get(key).describe, names)

        return shared_poll.watch(
            key, [self.job_name], describe, self.poll_interval, close=POLLERS.closer(key)
        )

    def _key(self) -> Key:
        return ("vertex", self.conn_id, self.project_id, self.region)

    async def _confirm_gone(self, key: Key) -> JobRecord | None:
        """A job the shared poll no longer finds: asked for directly before the run is declared
        lost (a list that lags, or a describe of another moment, must not fail a live job). None:
        Vertex says it does not exist."""
        from airflow_cloudtrain.core.retry import call_with_retry

        poller = POLLERS.peek(key) or VertexPoller(self.conn_id, self.project_id, self.region)

        def get() -> JobRecord | None:
            return call_with_retry(
                lambda: poller.call(lambda jobs: jobs.get(self.job_name)), TransientBudget(budget_s=60.0)
            )

        try:
            return await asyncio.to_thread(get)
        finally:
            if poller is not POLLERS.peek(key):
                await asyncio.to_thread(poller.close)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_cloudtrain.lifecycle.vertex.logs import LogStream

        logs = LogStream(cast(logging.Logger, self.log), self.log_polling_interval)  # Airflow's task logger
        key = self._key()
        lease = LeaseRenewer(self._job_folder, self.orphan_timeout if self.job_dir else None, "vertex")
        index = RunningEntry.from_dict(self.index)
        stream: list[AsyncIterator[dict[str, JobRecord]]] = []  # the open watch, if any

        async def close_stream() -> None:
            while stream:
                aclose = getattr(stream.pop(), "aclose", None)  # an async generator: leave the group
                if aclose is not None:
                    await aclose()

        async def ended() -> dict[str, Any] | None:
            """One shared snapshot: the event once the job ended or is gone, else None. A failed
            describe leaves the group before ``apoll_until`` backs off (or gives up)."""
            if lease.due():  # the job's lease, in a worker thread (``core.lease``)
                await asyncio.to_thread(lease.renew)
            if index is not None and index.due(time.time()):  # the running index's sign of life
                await asyncio.to_thread(self._refresh, index)
            if not stream:
                stream.append(self._watch(key))
            try:
                snapshot = await anext(stream[0])
            except BaseException:
                await close_stream()
                raise
            job = snapshot.get(self.job_name)
            if job is None:
                job = await self._confirm_gone(key)
            if job is None:
                return {"status": "error", "message": f"Vertex AI job {self.job_name} no longer exists"}
            if logs.tail is None:
                logs.tail = await logs.aguard(asyncio.to_thread, self._tail)
            if job.terminal:
                return {"status": "done", "job": job.to_dict()}
            over = replicas_over_budget(
                self.max_cost, self.hourly_usd, job.started_at, time.time(), self.poll_interval
            )
            if over is not None:  # the task cancels the job on an "error" event, then fails with this
                return {"status": "error", "message": over}
            if logs.due():
                await logs.aguard(asyncio.to_thread, self._show, logs.tail)
            return None

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error polling (%s); retrying", err)

        event: dict[str, Any] | None = None
        try:
            try:
                budget = TransientBudget(base_s=self.poll_interval)
                event = await apoll_until(ended, 0.0, on_transient=transient, budget=budget)
            finally:
                await close_stream()
            if event["status"] == "done":  # out of the shared poll first: it polls no more for us
                await logs.adrain(lambda: asyncio.to_thread(self._show, logs.tail))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            event = {"status": "error", "message": f"waiting for {self.job_name} failed: {err}"}
        if index is not None and (event or {}).get("status") != "done":  # the task cancels the job
            await asyncio.to_thread(self._unindex, index)
        yield TriggerEvent(event or {"status": "error", "message": "the job watch ended"})

    def _refresh(self, index: RunningEntry) -> None:
        index.update(self._bucket_folder(index), cast(logging.Logger, self.log), time.time())

    def _unindex(self, index: RunningEntry) -> None:
        index.clear(self._bucket_folder(index), cast(logging.Logger, self.log))

    def _bucket_folder(self, index: RunningEntry) -> RunFolder:
        from airflow_cloudtrain.hooks.vertex import VertexHook

        folder: RunFolder = VertexHook(gcp_conn_id=self.conn_id, project_id=self.project_id).run_folder(
            index.bucket
        )
        return folder

    async def on_kill(self) -> None:
        """The user killed the deferred task (or marked it failed): cancel the job, through the
        run's ledger like every other teardown (the job, and any other job of its run key)."""
        if not await killed_by_user(self, self.log):
            return
        cancelled = await asyncio.to_thread(self._cancel)
        index = RunningEntry.from_dict(self.index)
        if index is not None:
            await asyncio.to_thread(self._unindex, index)
        self.log.info(
            "Released %s (a cancel; nothing to do for a job already ended) because the task was killed"
            if cancelled
            else "Nothing to cancel for %s",
            ", ".join(cancelled) or self.job_name,
        )

    def _cancel(self) -> list[str]:
        from airflow_cloudtrain.clouds.gcp.vertex import KIND
        from airflow_cloudtrain.contract.runs import TAG_RUN_KEY
        from airflow_cloudtrain.core.ledger import Resource, ResourceLedger
        from airflow_cloudtrain.core.retry import call_with_retry

        jobs = jobs_client(self.conn_id, self.project_id, self.region)  # the connection as it is now
        try:
            budget = TransientBudget(budget_s=25.0, cap_s=5.0)
            job = call_with_retry(lambda: jobs.get(self.job_name), budget)
            digest = (job.labels.get(TAG_RUN_KEY) if job else None) or ""
            ledger = ResourceLedger(digest, entries=[Resource(KIND, self.job_name, self.region)])
            released = call_with_retry(lambda: ledger.release(jobs, sweep=bool(digest)), budget)
            return [r.id or "" for r in released if r.id]
        finally:
            jobs.close()

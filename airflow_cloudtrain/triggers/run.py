"""The operator's deferred wait: until the agent's final status, or the instance ends without one.

Built for a thousand runs in one triggerer. Every watched run of one bucket is seen through the
bucket's live index (``triggers.run_index``): its ``ended/`` folder listed every ``END_POLL_S``, the
whole index every poll interval (heartbeats from LastModified, changes from ETags), objects read
only for what changed, in the index's own threads. Instances are watched
through one shared DescribeInstances per (connection, region) that asks only for stopped or ended
instances (GCE: one list per zone). All SDK work runs in worker threads with one client per poll
group, closed when the group ends. The decision is ``core.waiting.RunWatch``, the same one the
blocking wait makes.

What the task log shows: each job line once, in order, as ``[job 08:00:09.602] text`` with the time
the job wrote it; new lines arrive each poll interval (with more than about 150 chatty runs in one
triggerer, every few poll intervals: ``run_index.log_read_budget``); the job's last lines always
before the task ends, which comes within about ``END_POLL_S`` of the job's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.contract.runs import SPEC_KEY, STARTING, RunSpec, RunStatus, heartbeat_key, status_key
from airflow_cloudtrain.core.cloud import ENDED_STATES, STOPPED, Instance
from airflow_cloudtrain.core.engine import apoll_until
from airflow_cloudtrain.core.lease import LeaseRenewer
from airflow_cloudtrain.core.logstream import LogFollower, render_line
from airflow_cloudtrain.core.records import ERROR, LaunchRecord, Outcome
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry
from airflow_cloudtrain.core.waiting import PROBE_DUE, RunWatch, parse_heartbeat, read_heartbeat
from airflow_cloudtrain.triggers import shared_poll
from airflow_cloudtrain.triggers.handover import killed_by_user
from airflow_cloudtrain.triggers.heap import freeze_long_lived
from airflow_cloudtrain.triggers.instances import watch_instances
from airflow_cloudtrain.triggers.leases import BY, LEASES
from airflow_cloudtrain.triggers.run_index import LOG_EVERY, LiveIndex, LiveView

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.budget import BudgetWatch
    from airflow_cloudtrain.storage import RunFolder


def _make_index(key: Any) -> LiveIndex:
    _kind, conn_id, project_id, live_uri = key
    return LiveIndex(live_uri, conn_id, project_id)


async def _close_index(index: LiveIndex) -> None:
    await asyncio.to_thread(index.close)


# The live index's ``ended/`` folder is listed this often (or each poll_interval, if shorter): one
# small listing per bucket, whatever the number of runs, and a run's end reaches its task within
# about this. Log lines (the whole index) and the instance poll keep the run's poll_interval.
END_POLL_S = 2.0
# How long a gang's last log read retries transient errors once its outcome is decided.
LAST_LINES_BUDGET_S = 30.0
# A trigger cancelled while its worker thread logs a run's new lines waits this long for that thread
# (which cannot be stopped) to finish and move the cursor, so the group's last cursor save counts them.
SHOW_DRAIN_S = 10.0

# One LiveIndex (one storage client, the group's cursors) per (connection, live index) per triggerer.
INDEXES: shared_poll.Pool[LiveIndex] = shared_poll.Pool(_make_index, _close_index)


# Airflow cancels a trigger with this message when the user acted on the task (on_kill follows); any
# other cancellation is the triggerer stopping or handing the trigger over: the cloud work goes on.
USER_ACTION_CANCEL = "__airflow_user_action__"
STOPPING_LINE = (
    "Triggerer stopping: the run continues on the cloud (instance %s) and this task resumes waiting "
    "when a triggerer picks it up again"
)


class RunTrigger(BaseTrigger):
    """Waits for one run on one instance; yields its ``Outcome`` and where the log got to.

    Kwargs are plain JSON: the ``LaunchRecord`` as a dict, the connection, and the wait settings
    (including the agent watchdog's ``startup_timeout`` / ``heartbeat_timeout``, so a dead agent is
    noticed in deferrable mode exactly as in blocking mode). ``next_log_seq`` is where the task log
    was when the task deferred; a re-created trigger continues from the saved cursor when further.

    :param launch: The attempt's ``LaunchRecord`` as a dict (instance, run folder, cloud, location).
    :param conn_id: The Airflow connection of the run's provider.
    :param project_id: GCP project (GCE runs); the connection's by default.
    :param poll_interval: Seconds between polls of the live index and the instance.
    :param deadline: Unix time past which the run is declared over (``max_runtime`` plus a margin).
    :param startup_timeout: Seconds the agent may take to report after launch.
    :param heartbeat_timeout: Seconds the agent may stay silent before the run is declared lost.
    :param next_log_seq: The first log chunk not yet shown in the task log.
    :param log_nodes: A gang's (``launch["nodes"]``): whose logs reach the task log, ``"all"`` or ``"head"``.
    :param max_cost: ``max_cost`` in USD (``core.budget``): the wait ends ``over_budget`` before the run
        passes it. None: no budget.
    :param spent_usd: What the run's earlier attempts cost (the resume loop's ledger).
    :param probe_at: Unix time the wait ends ``probe_due`` (the run untouched), for the resume loop to
        ask its spot policy while an on-demand attempt runs. None: never.
    """

    def __init__(
        self,
        launch: dict[str, Any],
        conn_id: str | None,
        project_id: str | None = None,
        poll_interval: float = 10.0,
        deadline: float | None = None,
        startup_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        next_log_seq: int = 0,
        log_nodes: str = "all",
        max_cost: float | None = None,
        spent_usd: float = 0.0,
        orphan_timeout: float | None = None,
        probe_at: float | None = None,
    ) -> None:
        super().__init__()
        self.launch = launch
        self.conn_id = conn_id
        self.project_id = project_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.next_log_seq = next_log_seq
        self.log_nodes = log_nodes
        self.max_cost = max_cost
        self.spent_usd = spent_usd
        self.orphan_timeout = orphan_timeout  # renewed while waiting (``triggers.leases``); None: none
        self.probe_at = probe_at  # the resume loop's next look at spot (``core.waiting.RunWatch``)
        self._warned = False

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "launch": self.launch,
                "conn_id": self.conn_id,
                "project_id": self.project_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "startup_timeout": self.startup_timeout,
                "heartbeat_timeout": self.heartbeat_timeout,
                "next_log_seq": self.next_log_seq,
                "log_nodes": self.log_nodes,
                "max_cost": self.max_cost,
                "spent_usd": self.spent_usd,
                "orphan_timeout": self.orphan_timeout,
                "probe_at": self.probe_at,
            },
        )

    def _budget(self, launch: LaunchRecord) -> BudgetWatch | None:
        from airflow_cloudtrain.core.budget import budget_watch
        from airflow_cloudtrain.lifecycle.run.cost import hourly_usd

        hourly = hourly_usd(launch)
        return budget_watch(self.max_cost, self.spent_usd, hourly, launch.launched_at, self.poll_interval)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        freeze_long_lived()  # once per process: see triggers.heap
        launch = LaunchRecord.from_dict(self.launch)
        follower = LogFollower(launch.instance_id, self.next_log_seq)
        try:
            live_uri = launch.live_uri or await asyncio.to_thread(self._live_uri_from_spec, launch)
            if launch.nodes:
                result = await self._wait_gang(launch, live_uri, follower)
            else:
                result = await self._wait(launch, live_uri, follower)
        except asyncio.CancelledError as err:
            if not (err.args and err.args[0] == USER_ACTION_CANCEL):  # on_kill speaks for that case
                self.log.warning(STOPPING_LINE, launch.instance_id)
            raise
        except Exception as err:
            result = Outcome(ERROR, "wait_failed", message=f"waiting for the run failed: {err}")
        yield TriggerEvent(
            {"outcome": result.to_dict(), "launch": self.launch, "next_log_seq": follower.next_seq}
        )

    def _views(self, launch: LaunchRecord, live_uri: str | None, follower: LogFollower) -> Any:
        """What the run looks like after each poll: from the bucket's shared live index, or, for a
        run whose agent publishes none (launched by an older operator), from its own run folder."""
        if live_uri is None:
            return self._folder_views(launch, follower)
        key = ("live", self.conn_id, self.project_id, live_uri)

        async def poll(ids: list[str]) -> dict[str, LiveView]:
            # the index's own thread: the default executor is shared by every trigger's log work,
            # and an end must not queue behind it
            index = INDEXES.get(key)
            return await asyncio.get_running_loop().run_in_executor(index.executor, index.poll, ids)

        # polled every END_POLL_S, but this trigger wakes only when its run's view changed, or
        # each poll_interval (its timeouts): a thousand quiet runs cost the loop nothing meanwhile
        interval = min(self.poll_interval, END_POLL_S)
        return shared_poll.watch_with_retry(
            key,
            [launch.instance_id],
            poll,
            interval,
            self.log,
            close=INDEXES.closer(key),
            quiet=self.poll_interval,
        )

    async def _wait(self, launch: LaunchRecord, live_uri: str | None, follower: LogFollower) -> Outcome:
        """The blocking wait's decision over the shared views, through ``core.engine.apoll_until``.

        Each poll takes the next view of the run from the shared stream, which paces the polls
        (a trigger wakes only when its run's view changed, or each ``poll_interval``): so the loop
        adds no interval of its own (``interval_s=0``). A transient error reading what changed
        backs off within the budget, and the next poll takes the latest view."""
        iid = launch.instance_id
        key = ("live", self.conn_id, self.project_id, live_uri)
        instances: dict[str, Instance | None] = {}
        failed: list[BaseException] = []
        watcher = asyncio.ensure_future(self._follow_instance(launch, instances, failed))
        watch = RunWatch(self.deadline, launch.launched_at, self.startup_timeout, self.heartbeat_timeout)
        watch.budget = self._budget(launch)
        watch.probe_at = self.probe_at
        status: RunStatus | None = None
        stream = self._views(launch, live_uri, follower)
        LOG_EVERY[iid] = self.poll_interval
        if self.orphan_timeout is not None:  # the index's poll renews it (a run folder's: ``_folder_views``)
            LEASES[iid] = (launch.run_uri, float(self.orphan_timeout))

        async def poll() -> Outcome | None:
            nonlocal status
            try:
                snapshot = await anext(stream, None)
            except Exception as err:  # the shared poll retried already: not this loop's to retry
                return Outcome(ERROR, "wait_failed", message=f"waiting for the run failed: {err}")
            if snapshot is None:
                return Outcome(ERROR, "wait_failed", message="the run watch ended")
            if failed:  # the instance watch gave up (after its own retries): so does the wait
                return Outcome(ERROR, "wait_failed", message=f"waiting for the run failed: {failed[0]}")
            index = INDEXES.peek(key) if live_uri else None
            view = snapshot.get(iid) or LiveView()
            instance = instances.get(iid)
            status = await self._read(index, launch, follower, view, instance, status)
            result = watch.decide(status, instance, view.beacon_at)
            if result is not None and result.state != PROBE_DUE and index is not None:
                result = await self._confirm(index, launch, follower, watch, result, instance, view)
                if result is not None:
                    index.forget(iid)
            return result

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error reading the run's state (%s); retrying", err)

        try:
            async with aclosing(stream):
                return await apoll_until(poll, 0.0, on_transient=transient)
        finally:
            LOG_EVERY.pop(iid, None)
            LEASES.pop(iid, None)
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _read(
        self,
        index: LiveIndex | None,
        launch: LaunchRecord,
        follower: LogFollower,
        view: LiveView,
        instance: Instance | None,
        status: RunStatus | None,
    ) -> RunStatus | None:
        """The run's status after this poll, its new lines shown on the way."""
        follower.next_seq = max(follower.next_seq, view.cursor)
        if view.status is not None:  # read from the run folder (a run without a live index)
            status = view.status
        if view.beacon is not None and index is not None:
            status = view.beacon.run_status()
            await self._show(index, launch, follower, view.beacon, view.tag)
        if view.final is not None:
            return view.final
        if view.listed and status is None:
            status = RunStatus(STARTING, launch.instance_id)  # it reported; its beacon says what
        if _ended(instance) and view.listed and index is not None:
            # ended without a final status yet: the beacon tells an interruption, and has the lines
            beacon = await asyncio.to_thread(index.read_beacon, launch.instance_id)
            if beacon is not None:
                status = beacon.run_status()
                await self._show(index, launch, follower, beacon, None)
        return status

    async def _confirm(
        self,
        index: LiveIndex,
        launch: LaunchRecord,
        follower: LogFollower,
        watch: RunWatch,
        result: Outcome,
        instance: Instance | None,
        view: LiveView,
    ) -> Outcome | None:
        """Before the wait ends: show what the agent wrote last (the final beacon the poll read with
        the end marker, already shown; else read now); and before a run whose instance is
        alive is declared lost (no report, no heartbeat), ask its run folder too: an agent that
        could not write to the live index (an instance role scoped to the run folder) or whose
        final beacon failed still writes ``status.json`` and, then, its heartbeat file there."""
        if result.state == "lost" and not _ended(instance):
            status, beat = await asyncio.to_thread(self._folder_state, launch)
            second = watch.decide(status, instance, beat)
            if second is None or second.state != "lost":
                if second is None and not self._warned:
                    self._warned = True
                    self.log.warning(
                        "No heartbeat of %s in the live index %s, but its run folder has one: check "
                        "that the instance can write there",
                        launch.instance_id,
                        index.live_uri,
                    )
                return second
        if view.final is not None and view.beacon is not None and view.beacon.run_status().final:
            return result
        beacon = await asyncio.to_thread(index.read_beacon, launch.instance_id)
        if beacon is not None:
            await self._show(index, launch, follower, beacon, None)
        return result

    async def _wait_gang(self, launch: LaunchRecord, live_uri: str | None, head: LogFollower) -> Outcome:
        """A gang (``num_nodes`` > 1): the blocking wait's decision (``core.waiting.GangWatch``) over
        every node. The nodes' instances come from the shared describe (one per region per poll,
        whatever the number of nodes); each poll reads the nodes' status and heartbeats, and their
        new log lines (``[rank N]``), in a worker thread. ``head`` carries the task log's cursor."""
        from airflow_cloudtrain.core.waiting import GangWatch

        ids = launch.node_ids
        instances: dict[str, Instance | None] = {}
        failed: list[BaseException] = []
        watcher = asyncio.ensure_future(self._follow_instance(launch, instances, failed, ids))
        watch = GangWatch(
            ids, self.deadline, launch.launched_at, self.startup_timeout, self.heartbeat_timeout
        )
        watch.budget = self._budget(launch)
        folder = await asyncio.to_thread(self._folder, launch)
        live = await asyncio.to_thread(self._backend(launch).run_folder, live_uri) if live_uri else None
        lease = LeaseRenewer(folder, self.orphan_timeout, BY)  # every node reads the same lease
        followed = ids if self.log_nodes == "all" else ids[:1]
        followers = [(0, head)] + [(rank, LogFollower(iid)) for rank, iid in enumerate(followed) if rank]

        def stream() -> None:
            for rank, follower in followers:
                for line in follower.poll(folder.list, folder.get_bytes):
                    self.log.info("[rank %d] %s", rank, render_line(line))

        def read() -> tuple[list[RunStatus | None], list[float | None]]:
            lease.renew()  # when due
            stream()
            statuses: list[RunStatus | None] = []
            beats: list[float | None] = []
            for rank, iid in enumerate(ids):
                raw = folder.get_text(status_key(iid))
                status = RunStatus.from_json(raw) if raw else None
                statuses.append(status)
                # a few times per heartbeat_timeout, not every poll
                beats.append(
                    read_heartbeat(folder, live, iid) if watch.needs_heartbeat(rank, status) else None
                )
            return statuses, beats

        async def poll() -> Outcome | None:
            if failed:  # the instance watch gave up (after its own retries): so does the wait
                return Outcome(ERROR, "wait_failed", message=f"waiting for the gang failed: {failed[0]}")
            statuses, beats = await asyncio.to_thread(read)
            return watch.decide(statuses, [instances.get(iid) for iid in ids], beats)

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error reading the gang's state (%s); retrying", err)

        try:
            outcome = await apoll_until(poll, self.poll_interval, on_transient=transient)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        # A node's agent uploads its last log chunk just before its final status: a poll that listed
        # the chunks before that upload and read the status after it decided without the job's last
        # lines. So once more, as the blocking wait does; its lines still reach the task log (the
        # event is not yielded yet).
        try:
            await asyncio.to_thread(call_with_retry, stream, TransientBudget(budget_s=LAST_LINES_BUDGET_S))
        except Exception as err:
            self.log.warning("Could not read the gang's last log lines (%s)", err)
        return outcome

    def _backend(self, launch: LaunchRecord) -> RunBackend:
        from airflow_cloudtrain.clouds.registry import backend_for

        return backend_for(
            launch.cloud,
            region=launch.region,
            aws_conn_id=self.conn_id,
            gcp_conn_id=self.conn_id or "google_cloud_default",
            project_id=self.project_id,
        )

    def _folder(self, launch: LaunchRecord) -> RunFolder:
        return self._backend(launch).run_folder(launch.run_uri)

    def _folder_state(
        self, launch: LaunchRecord, folder: RunFolder | None = None, instance_id: str | None = None
    ) -> tuple[RunStatus | None, float | None]:
        """Blocking: ``status.json`` and the heartbeat file of the run folder (of the head, or of
        ``instance_id``, a gang's node)."""
        folder = folder or self._folder(launch)
        iid = instance_id or launch.instance_id
        raw = folder.get_text(status_key(iid))
        beat = parse_heartbeat(folder.get_text(heartbeat_key(iid)))
        return (RunStatus.from_json(raw) if raw else None), beat

    async def _folder_views(
        self, launch: LaunchRecord, follower: LogFollower
    ) -> AsyncIterator[dict[str, LiveView]]:
        """A run without a live index: its own run folder each poll (chunks listed, status and
        heartbeat read), in a worker thread; fine for the few runs an upgrade leaves behind."""
        folder = await asyncio.to_thread(self._folder, launch)
        lease = LeaseRenewer(folder, self.orphan_timeout, BY)

        def read() -> LiveView:
            lease.renew()  # when due
            for line in follower.poll(folder.list, folder.get_bytes):
                self.log.info("%s", render_line(line))
            status, beat = self._folder_state(launch, folder)
            final = status if status is not None and status.final else None
            return LiveView(listed=status is not None, beacon_at=beat, final=final, status=status)

        while True:
            yield {launch.instance_id: await asyncio.to_thread(read)}
            await asyncio.sleep(self.poll_interval)

    async def _follow_instance(
        self,
        launch: LaunchRecord,
        out: dict[str, Instance | None],
        failed: list[BaseException],
        ids: list[str] | None = None,
    ) -> None:
        """Keeps ``out`` at the latest shared snapshot of the instance (or of a gang's ``ids``; only
        when it stopped or ended, on EC2); a lasting describe error is handed to the wait."""
        ids = ids or [launch.instance_id]
        stream = (  # an async generator: aclosing closes it
            watch_instances(
                launch.cloud,
                self.conn_id,
                launch.location,
                ids,
                self.poll_interval,
                self.project_id,
                ended_only=True,
            )
        )
        try:
            async with aclosing(stream):
                async for snapshot in stream:
                    for iid in ids:
                        out[iid] = snapshot.get(iid)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            failed.append(err)

    async def _show(
        self, index: LiveIndex, launch: LaunchRecord, follower: LogFollower, beacon: Any, tag: str | None
    ) -> None:
        """Log the new lines (in a worker thread: a restart may bring 64 KiB of them per run), then
        move the saved cursor; a beacon read for an ended instance passes no tag. The cursor moves in
        that thread, right after the lines: a trigger cancelled (a triggerer stopping) while it waited
        for the thread would otherwise leave lines shown but not counted, shown again after the
        restart (seen at load 20-26)."""

        def show() -> None:
            for line in follower.from_beacon(beacon, launch.run_uri, index.read_uri):
                self.log.info("%s", render_line(line))
            index.advance(launch.instance_id, follower.next_seq, tag)

        work = asyncio.ensure_future(asyncio.to_thread(show))
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            # the thread cannot be stopped: let it finish (and count) what it shows before the group
            # saves its cursors on the way out, then let the cancellation go on
            await asyncio.wait([work], timeout=SHOW_DRAIN_S)
            raise

    def _live_uri_from_spec(self, launch: LaunchRecord) -> str | None:
        """A launch recorded without its live index: the run's spec names it (None: it has none)."""
        raw = self._folder(launch).get_bytes(SPEC_KEY)
        spec = RunSpec.from_json(raw.decode()) if raw else None
        return spec.live_uri if spec is not None else None

    async def on_kill(self) -> None:
        """The user killed the deferred task: release the run through its ledger (and tag sweep).

        The triggerer routes a trigger's lines to the task log only until it reports the trigger
        finished, and that report can overtake a line logged just before it: so what is about to
        happen is said first, while the task log surely still takes it, then the result."""
        if not await killed_by_user(self, self.log):
            return
        launch = LaunchRecord.from_dict(self.launch)
        self.log.warning(
            "The task was killed while deferred: terminating instance %s and releasing everything "
            "else of run %s",
            launch.instance_id,
            launch.run_id,
        )
        released = await asyncio.to_thread(self._release)
        self.log.warning("Released %s because the task was killed", ", ".join(released) or "nothing")

    def _release(self) -> list[str]:
        """The job's end will not be reported: ``lifecycle.run.abandon.abandon_run``, as the worker's
        ``RunAttempt.abandon``, retried within ~25 s, the time Airflow gives ``on_kill``."""
        from airflow_cloudtrain.core.ledger import Resource, ResourceLedger
        from airflow_cloudtrain.lifecycle.run.abandon import abandon_run

        launch = LaunchRecord.from_dict(self.launch)
        backend = self._backend(launch)
        nodes = [(n["instance_id"], n.get("zone")) for n in launch.nodes] or [(launch.instance_id, None)]
        ledger = ResourceLedger(
            launch.run_key,
            entries=[
                Resource("instance", iid, backend.location(zone) if zone else launch.location)
                for iid, zone in nodes
            ],
        )
        released = abandon_run(
            backend,
            backend.run_folder(launch.run_uri),
            ledger,
            self.log,
            try_number=launch.try_number,
            mark_budget=TransientBudget(5.0),
            release_budget=TransientBudget(budget_s=25.0, cap_s=5.0),
        )
        return [r.id or "" for r in released]


def _ended(instance: Instance | None) -> bool:
    return instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED)

"""One attempt of a run: launch or adopt, wait, read the outcome, release, account.

``RunAttempt`` is what ``CloudTrainOperator`` is made of, and what the operators of later issues
loop over. Every resource it creates is written to the ``ResourceLedger`` before the create call, and
every way an attempt ends (success, failure, ``on_kill``, a failed deferral, a retry) releases
through that ledger. A retried task first looks at what an earlier try left: a final status nobody
reported yet is delivered as the result, a live instance is adopted, and an ended one is deleted;
only a run with nothing alive and nothing final launches again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.errors import CloudError
from airflow_cloudtrain.contract.runs import RunStatus, join, status_key
from airflow_cloudtrain.core.cloud import ALIVE_STATES, ended
from airflow_cloudtrain.core.engine import poll_until
from airflow_cloudtrain.core.lease import LeaseRenewer, say_orphaned
from airflow_cloudtrain.core.ledger import ResourceLedger, store_get, store_set
from airflow_cloudtrain.core.records import Attempt, LaunchRecord, Outcome
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry
from airflow_cloudtrain.core.waiting import RunWatch, outcome
from airflow_cloudtrain.lifecycle.prepare import (
    GangOptions,
    JobOptions,
    LaunchOptions,
    WaitSettings,
    offers_for,
    price_from_tags,
    request_builder,
    root_disk_gib,
)
from airflow_cloudtrain.lifecycle.run.abandon import abandon_run, delivered, mark_delivered
from airflow_cloudtrain.lifecycle.run.cost import attempt_cost, hourly_usd

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.budget import BudgetWatch
    from airflow_cloudtrain.core.cloud import Instance, LaunchRequest
    from airflow_cloudtrain.core.engine import TriggerSpec
    from airflow_cloudtrain.spec import RunConfig
    from airflow_cloudtrain.storage import RunFolder

LAUNCH_KEY = "cloudtrain_launch"  # task_state_store: the LaunchRecord of the current attempt
DEADLINE_MARGIN_S = 600.0  # past max_runtime, the wait gives up on an agent that did not stop the job


class RunKilled(RuntimeError):
    """The task was killed while this attempt was launching or waiting."""


@dataclass
class RunContext:
    """Everything an attempt needs, rebuilt identically by every try and after every deferral."""

    config: RunConfig
    key: RunKey
    backend: RunBackend
    store: Any  # task_state_store, or None
    try_number: int
    options: LaunchOptions
    log: logging.Logger
    wait: WaitSettings
    conn_id: str | None = None  # the provider's connection, for the trigger
    project_id: str | None = None
    job: JobOptions | None = None  # checkpoint / watchdog settings for the spec (None: defaults)
    folder_uri: str | None = None  # another run folder to use (``resume_from``), else the key's own
    secret_env: dict[str, str] | None = None  # {VAR: reference}, parsed by the operator
    gang: GangOptions | None = None  # num_nodes > 1: launched, watched and released as one (``gang``)
    # ``(offer, zones_for's zones) -> the zones to try, in order``: the resume loop's zone ranking
    # (``lifecycle.resume.zones``); None: ``zones_for``'s order, as a single run launches
    zone_order: Callable[[Offer, list[str | None]], list[str | None]] | None = None

    @property
    def run_uri(self) -> str:
        return self.folder_uri or join(self.config.bucket, self.key.path())

    @property
    def live_uri(self) -> str:
        """The live index the agent publishes to: the bucket's, in the run folder's bucket (a
        trigger reads the run's older log chunks through the same client)."""
        from airflow_cloudtrain.contract.runs import live_index_uri, split_uri

        scheme, bucket, _ = split_uri(self.run_uri)
        same = split_uri(self.config.bucket)[:2] == (scheme, bucket)
        return live_index_uri(self.config.bucket if same else f"{scheme}://{bucket}")

    @classmethod
    def for_task(
        cls,
        config: RunConfig,
        task: Any,
        context: Any,
        options: LaunchOptions,
        wait: WaitSettings,
        secret_env: dict[str, str] | None = None,
    ) -> RunContext:
        """The context of one task instance: ``task`` carries ``dag_id``, ``task_id``, ``log`` and the
        ``aws_conn_id`` / ``gcp_conn_id`` / ``project_id`` of the official providers; ``secret_env`` is
        the task's ``{VAR: reference}``, rendered and parsed by the operator
        (``operators.secret_env.parse_secret_env``: the operator's floor, which this one never imports)."""
        from airflow_cloudtrain.clouds.registry import backend_for
        from airflow_cloudtrain.contract.clouds import conn_id_for
        from airflow_cloudtrain.contract.runs import RunKey
        from airflow_cloudtrain.lifecycle.run_secrets import sweep_secrets

        ti = context["ti"]
        key = RunKey.of_task(task, context, config.bucket)
        backend = backend_for(
            config.cloud,
            region=config.region or config.zone_region,
            aws_conn_id=task.aws_conn_id,
            gcp_conn_id=task.gcp_conn_id,
            project_id=task.project_id,
        )
        secret_env = secret_env or {}
        sweep_secrets(backend, secret_env)  # a teardown also finds the run's own secrets by name
        return cls(
            config=config,
            key=key,
            backend=backend,
            store=context.get("task_state_store"),
            try_number=getattr(ti, "try_number", 1) or 1,
            options=options,
            log=task.log,
            wait=wait,
            conn_id=conn_id_for(config.cloud, task.aws_conn_id, task.gcp_conn_id),
            project_id=task.project_id,
            secret_env=secret_env,
        )


class RunAttempt:
    def __init__(self, ctx: RunContext, ledger: ResourceLedger | None = None) -> None:
        """``ledger``: the run's resource ledger when the caller holds attempts of one run at once (a
        checkpoint-resume loop): a save writes the whole ledger back, so two copies of it would
        overwrite each other's entries. Without it, the attempt loads the store's."""
        self.ctx = ctx
        self.log = ctx.log
        self.ledger = (
            ledger if ledger is not None else ResourceLedger.load(ctx.key.digest, ctx.store, ctx.log)
        )
        self.killed = False
        self._folder: RunFolder | None = None
        self._live: RunFolder | None = None  # the live index, opened on first use
        # the run's lease (``core.lease``): written before the launch, renewed by every wait
        self.lease = LeaseRenewer(lambda: self.folder, ctx.wait.orphan_timeout, "worker", ctx.log)
        self.last_heartbeat: float | None = None  # read by ``finish``, before the entries go
        stored = store_get(ctx.store, LAUNCH_KEY)
        self.stored = (
            LaunchRecord.from_dict(stored) if stored and stored.get("run_uri") == ctx.run_uri else None
        )
        if self.stored and self.stored.region:  # an earlier try launched there: adopt and tear down there
            ctx.backend.bind_region(self.stored.region)

    @property
    def folder(self) -> RunFolder:
        if self._folder is None:
            self._folder = self.ctx.backend.run_folder(self.ctx.run_uri)
        return self._folder

    # --- start: deliver, adopt, or launch ------------------------------------------------------

    def start(self) -> tuple[LaunchRecord, Outcome | None]:
        """The attempt's instance, and its outcome when an earlier try's job already finished."""
        backend = self.ctx.backend
        if backend.region is None:  # nothing asked, nothing configured: the cheapest region it is
            backend.bind_region(offers_for(self.ctx.config, None, self.log)[0].region)
        # Reads are retried; an error here releases nothing: an adoptable instance must survive it.
        # A gang is never adopted: what an earlier try left goes, and one whole gang is launched.
        found = call_with_retry(self._earlier if self.ctx.gang is None else self._earlier_gang)
        if found is not None:
            return found
        try:
            launch = self._launch()
        except BaseException:  # a failed or timed-out launch: whatever it created goes (tag sweep too)
            self.abandon()
            raise
        self._index_running(launch)
        return launch, None

    def launch_beside(self) -> LaunchRecord:
        """A launch while another instance of the run still runs (the resume loop's make-before-break
        switch to spot): nothing is adopted (the running one would be), and a failed launch releases
        only what it created itself, never the instance it is meant to replace."""
        before = {id(e) for e in self.ledger.entries}
        try:
            launch = self._launch()
        except BaseException:
            made = [e for e in self.ledger.entries if id(e) not in before]
            if made:
                call_with_retry(lambda: self.ledger.release(self.ctx.backend, sweep=False, only=made))
            raise
        self._index_running(launch)
        return launch

    def _earlier(self) -> tuple[LaunchRecord, Outcome | None] | None:
        """What earlier tries left: an unreported final status, else a live instance to adopt."""
        backend = self.ctx.backend
        if not self.ledger.of_kind("instance"):
            self.ledger.sweep(backend, ["instance"])
        known = {r.id: r for r in self.ledger.of_kind("instance") if r.id}
        in_folder = {k.split("/")[1] for k in self.folder.list("instances/") if k.count("/") >= 2}
        ids = sorted(set(known) | in_folder)
        if not ids:
            return None
        say_orphaned(self.folder, self.log)  # an earlier try's run that ended itself, unwatched
        states = backend.cloud.describe(ids)
        for iid in ids:
            status = self.status_of(iid)
            if status is not None and status.final and not self._delivered(iid):
                self.log.info(
                    "The job already finished on %s (%s) in an earlier try: delivering that result",
                    iid,
                    status.state,
                )
                if iid not in known and not states[iid].missing:
                    self.ledger.add("instance", iid, backend.location(states[iid].zone))
                return self._adopted(states.get(iid), iid), outcome(status, None, True)
        alive = [iid for iid in ids if iid in known and states[iid].state in ALIVE_STATES]
        given_up = [iid for iid in alive if self._delivered(iid)]  # a teardown marked it, then failed
        if given_up:
            self.log.warning("Releasing instance(s) an earlier teardown gave up on: %s", given_up)
            self.ledger.release(backend, sweep=False, only=[known[i] for i in given_up])
            alive = [iid for iid in alive if iid not in given_up]
        if not alive:
            if known:  # ended without a final status (e.g. a powered-off GCE VM): delete, then launch again
                self.ledger.release(backend)
            return None
        chosen, extra = alive[0], alive[1:]
        if extra:
            self.log.warning("Terminating %d duplicate instance(s) of this run: %s", len(extra), extra)
            self.ledger.release(backend, sweep=False, only=[known[i] for i in extra])
        self.log.info("Adopting instance %s launched by an earlier try of this task", chosen)
        return self._adopted(states[chosen], chosen), None

    def _earlier_gang(self) -> None:
        """A gang whose earlier try left nodes (a worker killed mid-launch or mid-run): release them
        all (network too), so the run never holds two gangs; the launch then starts a whole one."""
        self.ledger.sweep(self.ctx.backend, ["instance"])
        left = [r.id for r in self.ledger.of_kind("instance") if r.id]
        if left:
            self.log.warning("Releasing the %d node(s) an earlier try of this gang left: %s", len(left), left)
            self.abandon()
        return None

    def status_of(self, instance_id: str) -> RunStatus | None:
        """The agent's ``status.json`` for ``instance_id`` in this run's folder, or None before its first."""
        raw = self.folder.get_text(status_key(instance_id))
        return RunStatus.from_json(raw) if raw else None

    def _delivered(self, instance_id: str) -> bool:
        """Was this instance's end already reported to Airflow (or given up on by a teardown)?"""
        return delivered(self.ctx.store, self.folder, instance_id)

    def _mark_delivered(self, instance_id: str, state: str) -> None:
        """Both in the run folder and in the store, so a retry never reports this end again."""
        mark_delivered(self.ctx.store, self.folder, instance_id, self.ctx.try_number, state, self.log)

    def mark_released(self, instance_id: str) -> None:
        """A teardown gave up on this instance's end (it is being released): no try adopts it or
        reports its final status as the run's."""
        self._mark_delivered(instance_id, "released")

    def _adopted(self, instance: Instance | None, instance_id: str) -> LaunchRecord:
        if self.stored and self.stored.instance_id == instance_id:
            return LaunchRecord.from_dict(
                {**self.stored.to_dict(), "adopted": True, "try_number": self.ctx.try_number}
            )
        tags = instance.tags if instance else {}
        return LaunchRecord(
            run_id=self.ctx.key.short_id,
            run_uri=self.ctx.run_uri,
            live_uri=self._spec_live_uri(),
            cloud=self.ctx.config.cloud,
            region=self.ctx.backend.region,
            instance_id=instance_id,
            instance_type=instance.instance_type if instance else None,
            zone=instance.zone if instance else None,
            spot=bool(instance and instance.spot),
            hourly_usd=price_from_tags(tags),
            location=self.ctx.backend.location(instance.zone if instance else None),
            launched_at=(instance.launch_time if instance else None) or time.time(),
            adopted=True,
            run_key=self.ctx.key.digest,
            try_number=self.ctx.try_number,
            disk_gib=root_disk_gib(self.ctx.config),
        )

    def _launch(self) -> LaunchRecord:
        from airflow_cloudtrain.core.launcher import launch_with_failover
        from airflow_cloudtrain.lifecycle.prepare import write_run_folder

        ctx, backend = self.ctx, self.ctx.backend
        if ctx.options.live_prices:
            backend.refresh_catalog()
        offers = offers_for(ctx.config, backend.region, self.log)
        chosen = offers[0]
        self.log.info(
            "Chosen offer: %s at $%s/h (%s); %d alternatives for failover",
            chosen.describe(),
            chosen.hourly,
            "spot" if chosen.is_spot else "on-demand",
            len(offers) - 1,
        )
        write_run_folder(
            ctx.config,
            ctx.key,
            ctx.run_uri,
            self.folder,
            bool(ctx.options.volume_id),
            self.log,
            ctx.job,
            live_uri=ctx.live_uri,
            secret_env=self._secret_env(),
            gang=ctx.gang,
            orphan_timeout_s=ctx.wait.orphan_timeout,
        )
        self._first_lease()
        build = request_builder(ctx.config, ctx.key, ctx.run_uri, ctx.options, ctx.try_number)
        self._protect_network()
        requested_at = time.time()
        if ctx.gang is not None:
            return self._launch_gang(offers, build, requested_at)
        instance, offer, tried = launch_with_failover(
            self._create_instance,
            offers,
            build,
            self._zones,
            ctx.options.max_launch_attempts,
            self.log,
        )
        launch = self._record(instance, offer, tried, requested_at)
        store_set(ctx.store, LAUNCH_KEY, launch.to_dict())
        self.log.info("Launched instance %s (%s in %s)", instance.id, offer.instance_type, instance.zone)
        if ctx.options.volume_id:  # a failure here is released by start(), as any launch error
            device = backend.cloud.attach_volume(instance.id, ctx.options.volume_id)
            self.log.info("Attached volume %s as %s", ctx.options.volume_id, device)
        return launch

    def _zones(self, offer: Offer) -> list[str | None]:
        """The zones to try ``offer`` in: the backend's (``zones_for``), in the context's order."""
        zones = self.ctx.backend.zones_for(self.ctx.config.zone, offer)
        order = self.ctx.zone_order
        return order(offer, zones) if order is not None else zones

    def _record(
        self,
        instance: Instance,
        offer: Offer,
        tried: Any,
        requested_at: float,
        nodes: list[dict[str, Any]] | None = None,
    ) -> LaunchRecord:
        """The launch just made (a gang's: ``instance`` is the head, ``nodes`` every node)."""
        ctx, backend = self.ctx, self.ctx.backend
        extra: dict[str, Any] = {} if nodes is None else {"nodes": nodes}
        return LaunchRecord(
            run_id=ctx.key.short_id,
            run_uri=ctx.run_uri,
            live_uri=ctx.live_uri,
            cloud=ctx.config.cloud,
            region=backend.region,
            instance_id=instance.id,
            instance_type=offer.instance_type,
            zone=instance.zone,
            spot=offer.is_spot,
            hourly_usd=offer.hourly,
            launched_at=time.time(),
            failover=[list(t) for t in tried],
            run_key=ctx.key.digest,
            location=backend.location(instance.zone),
            try_number=ctx.try_number,
            requested_at=requested_at,
            disk_gib=root_disk_gib(ctx.config),
            **extra,
        )

    def _launch_gang(self, offers: list[Offer], build: Any, requested_at: float) -> LaunchRecord:
        """``num_nodes`` instances, all or nothing (``lifecycle.run.gang``); the record's
        ``instance_id`` is the head's, ``nodes`` every node's."""
        from airflow_cloudtrain.lifecycle.run.gang import Gang

        ctx, backend = self.ctx, self.ctx.backend
        assert ctx.gang is not None
        gang = Gang(backend, self.folder, self.ledger, self.log, ctx.gang)
        extra = gang.prepare(ctx.key.digest, ctx.options, self._check_killed)
        nodes, offer, tried = gang.launch(
            self._create_instance,
            gang.usable(offers, ctx.config.cloud),
            build,
            self._zones,
            ctx.options.max_launch_attempts,
            extra,
        )
        head = nodes[0]
        launch = self._record(head, offer, tried, requested_at, gang.node_records(nodes))
        store_set(ctx.store, LAUNCH_KEY, launch.to_dict())
        gang.publish_ranks(nodes)
        self.log.info(
            "Launched a gang of %d x %s in %s: %s",
            len(nodes),
            offer.instance_type,
            head.zone,
            ", ".join(f"rank {n['rank']} {n['instance_id']} ({n['private_ip']})" for n in launch.nodes),
        )
        return launch

    def _first_lease(self) -> None:
        """Right before the launch: a task killed before its first poll still leaves a lease, whose
        lapse ends the run; with ``orphan_timeout=None``, say once what the run then relies on."""
        if self.ctx.wait.orphan_timeout is None:
            self.log.info(
                "orphan_timeout=None: no lease; if nobody watches this run any more, only max_runtime "
                "(%s) ends it",
                f"{self.ctx.config.max_runtime_s:g} s" if self.ctx.config.max_runtime_s else "unlimited",
            )
            return
        from airflow_cloudtrain.contract.lease import ORPHANED_KEY

        try:  # an earlier try's record describes that try's end, not this launch
            self.folder.delete_key(ORPHANED_KEY)
        except Exception as err:
            self.log.debug("could not remove an old %s: %s", ORPHANED_KEY, err)
        self.lease.renew(force=True)

    def _secret_env(self) -> dict[str, str]:
        """The spec's ``secret_env``: ``airflow_*`` references stored as the run's secrets first."""
        from airflow_cloudtrain.lifecycle.run_secrets import spec_secret_env

        ctx = self.ctx
        if not ctx.secret_env:
            return {}
        if self.killed:
            raise RunKilled("the task was killed before the launch")
        return spec_secret_env(
            ctx.secret_env, self.ledger, ctx.backend, ctx.key.digest, self.log, ctx.config.max_runtime_s
        )

    def _protect_network(self) -> None:
        """GCE: the run's firewall rule (no ingress to its VMs from outside), through the ledger,
        before any VM exists (``clouds.gcp_firewall``); released with everything else."""
        protect = getattr(self.ctx.backend, "protect_network", None)
        if protect is not None:
            protect(self.ledger, self.ctx.key.digest, self.ctx.options, self._check_killed, self.log)

    def _check_killed(self) -> None:
        if self.killed:
            raise RunKilled("the task was killed before the launch")

    def _create_instance(self, request: LaunchRequest) -> Instance:
        """The one create call for instances: ledger first, then the cloud, then the id."""
        backend = self.ctx.backend
        entry = self.ledger.intend("instance", backend.location(request.zone), token=request.client_token)
        if self.killed:
            self.ledger.discard(entry)
            raise RunKilled("the task was killed before the launch")
        try:
            instance = backend.cloud.launch(request)
        except CloudError:  # the cloud refused: nothing was created
            self.ledger.discard(entry)
            raise
        self.ledger.created(entry, instance.id, backend.location(instance.zone))
        if self.killed:  # on_kill ran while the create call was in flight; start() releases it
            raise RunKilled(f"the task was killed while launching {instance.id}")
        return instance

    # --- wait ----------------------------------------------------------------------------------

    def deadline(self) -> float | None:
        """When a wait gives up on a job the agent should have stopped at ``max_runtime``."""
        max_runtime_s = self.ctx.config.max_runtime_s
        return time.time() + max_runtime_s + DEADLINE_MARGIN_S if max_runtime_s else None

    def trigger(self, launch: LaunchRecord) -> TriggerSpec:
        """The deferred form of ``wait``: a ``RunTrigger`` (same decision, in the triggerer)."""
        from airflow_cloudtrain.core.engine import TriggerSpec

        return TriggerSpec(
            "airflow_cloudtrain.triggers.run.RunTrigger",
            {
                "launch": launch.to_dict(),
                "conn_id": self.ctx.conn_id,
                "project_id": self.ctx.project_id,
                "poll_interval": self.ctx.wait.poll_interval,
                "deadline": self.deadline(),
                "startup_timeout": self.ctx.wait.startup_timeout,
                "heartbeat_timeout": self.ctx.wait.heartbeat_timeout,
                "log_nodes": self.ctx.gang.log_nodes if self.ctx.gang else "all",
                "max_cost": self.ctx.wait.max_cost_usd,
                "spent_usd": self.ctx.wait.spent_usd,
                "orphan_timeout": self.ctx.wait.orphan_timeout,
                "probe_at": self.ctx.wait.probe_at,
            },
        )

    def over(self, launch: LaunchRecord) -> bool:
        """Is the run already over (a final status, or its instance ended)? Checked once just before
        deferring: a trigger that fires within seconds of the deferral hits Airflow's race in which
        the scheduler applies the stale "success" of the defer exit to the resumed try and fails the
        task (apache/airflow#66374), so a run that is already over is finished in the worker, by
        ``wait``, as the Amazon provider's operators do. Never raises: when in doubt, defer."""
        ids = launch.node_ids  # a gang: any node already over ends the gang soon

        def final_of() -> str | None:
            for iid in ids:
                raw = self.folder.get_text(status_key(iid))
                if raw and RunStatus.from_json(raw).final:
                    return iid
            return None

        try:
            done = call_with_retry(final_of)
            if done is not None:
                self.log.info("The job on %s already ended: finishing in the worker, not deferring", done)
                return True
            described = call_with_retry(lambda: self.ctx.backend.cloud.describe(ids))
        except Exception as err:
            self.log.warning("Could not check %s before deferring (%s); deferring", ", ".join(ids), err)
            return False
        for iid in ids:
            instance = described.get(iid)
            if instance is not None and ended(instance):
                self.log.info(
                    "Instance %s already %s: finishing in the worker, not deferring", iid, instance.state
                )
                return True
        return False

    def budget(self, launch: LaunchRecord) -> BudgetWatch | None:
        """The wait's ``max_cost`` check (``core.budget``), or None without a budget."""
        from airflow_cloudtrain.core.budget import budget_watch

        settings = self.ctx.wait
        hourly = hourly_usd(launch)
        return budget_watch(
            settings.max_cost_usd, settings.spent_usd, hourly, launch.launched_at, settings.poll_interval
        )

    def wait(self, launch: LaunchRecord) -> Outcome:
        """Block until the run ends, streaming the job's log; transient errors are waited out
        (``core.engine.poll_until``), a kill ends the wait within a second."""
        from airflow_cloudtrain.core.logstream import LogFollower, render_line

        if launch.nodes:
            return self._wait_gang(launch)
        iid, folder, cloud = launch.instance_id, self.folder, self.ctx.backend.cloud
        settings = self.ctx.wait
        follower = LogFollower(iid)
        by_kill = f"instance {iid} was terminated"
        watch = RunWatch(
            self.deadline(), launch.launched_at, settings.startup_timeout, settings.heartbeat_timeout
        )
        watch.budget = self.budget(launch)
        watch.probe_at = settings.probe_at

        def poll() -> Outcome | None:
            self._unless_killed(by_kill)  # not transient: out of the loop at once
            self.lease.renew()  # when due: at most every renew_interval_s
            for line in follower.poll(folder.list, folder.get_bytes):
                self.log.info("%s", render_line(line))
            raw = folder.get_text(status_key(iid))
            status = RunStatus.from_json(raw) if raw else None
            beat = self.heartbeat(launch) if watch.needs_heartbeat(status) else None
            instance = cloud.describe([iid]).get(iid)
            if (status is None or not status.final) and ended(instance):
                status = self._end_marker(launch) or status
            return watch.decide(status, instance, beat)

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error while waiting (%s); polling again in %.0f s", err, delay)

        event = poll_until(poll, settings.poll_interval, stopped=lambda: self.killed, on_transient=transient)
        self._unless_killed(by_kill)
        last_words = call_with_retry(lambda: follower.poll(folder.list, folder.get_bytes))
        for line in last_words:
            self.log.info("%s", render_line(line))
        return event

    def _unless_killed(self, what: str) -> None:
        """Raise ``RunKilled`` once ``on_kill`` ran: before each poll, and after the last one. Airflow
        calls it from its SIGTERM handler on this thread, mid-poll: the poll may then see the
        instances the kill just terminated and call that an interruption. The attempt was killed,
        and its ledger row must say so (``abandoned``), not what the kill did to it."""
        if self.killed:
            raise RunKilled(f"task killed: {what}")

    def _wait_gang(self, launch: LaunchRecord) -> Outcome:
        from airflow_cloudtrain.core.waiting import GangWatch
        from airflow_cloudtrain.lifecycle.prepare import GangOptions
        from airflow_cloudtrain.lifecycle.run.gang import Gang

        settings = self.ctx.wait
        options = self.ctx.gang or GangOptions(launch.num_nodes)
        by_kill = f"the gang's {launch.num_nodes} nodes were terminated"
        gang = Gang(self.ctx.backend, self.folder, self.ledger, self.log, options)
        watch = GangWatch(
            launch.node_ids,
            self.deadline(),
            launch.launched_at,
            settings.startup_timeout,
            settings.heartbeat_timeout,
        )
        watch.budget = self.budget(launch)

        def check() -> None:
            self._unless_killed(by_kill)  # not transient: out of the loop at once
            self.lease.renew()  # every node reads the same lease

        outcome = gang.wait(
            launch,
            watch,
            settings.poll_interval,
            check,
            lambda: self.killed,
            lambda iid: self.heartbeat(launch, iid),
            lambda iid: self._end_marker(launch, iid),
        )
        self._unless_killed(by_kill)
        return outcome

    def _end_marker(self, launch: LaunchRecord, instance_id: str | None = None) -> RunStatus | None:
        """The final status the agent wrote last, in the live index (``<instance>.end``): what an
        ended instance's (or gang node's) run says when its run folder refused the final
        ``status.json``."""
        from airflow_cloudtrain.contract.runs import end_name

        if not launch.live_uri:
            return None
        raw = self._live_folder(launch).get_text(end_name(instance_id or launch.instance_id))
        return RunStatus.from_json(raw) if raw else None

    def heartbeat(self, launch: LaunchRecord, instance_id: str | None = None) -> float | None:
        """The agent's last heartbeat: the live index's ``<instance>.beat`` (its unix time), or the
        run folder's heartbeat file (an agent without a live index, or one that could not write
        to it: the agent falls back to the file then)."""
        from airflow_cloudtrain.core.waiting import read_heartbeat

        live = self._live_folder(launch) if launch.live_uri else None
        return read_heartbeat(self.folder, live, instance_id or launch.instance_id)

    def _spec_live_uri(self) -> str | None:
        """The live index an adopted instance's agent publishes to: the one its spec named (the
        spec is rewritten only by a new launch, which adopting replaces)."""
        from airflow_cloudtrain.contract.runs import SPEC_KEY, RunSpec

        try:
            raw = call_with_retry(lambda: self.folder.get_text(SPEC_KEY))
        except Exception as err:
            self.log.warning("Could not read the run's spec (%s); assuming the bucket's live index", err)
            return self.ctx.live_uri
        return RunSpec.from_json(raw).live_uri if raw else self.ctx.live_uri

    def _live_folder(self, launch: LaunchRecord) -> RunFolder:
        if self._live is None:
            self._live = self.ctx.backend.run_folder(launch.live_uri or self.ctx.live_uri)
        return self._live

    def unpublish(self, launch: LaunchRecord) -> None:
        """The run's end was reported: take its entries out of the live index, so the index that
        triggers list each poll holds the runs in flight, not history. Best effort: the index also
        drops entries nobody watched for two days (``triggers.run_index``)."""
        from airflow_cloudtrain.contract.runs import beacon_name, beat_name, end_name

        if not launch.live_uri:
            return
        try:
            for iid in launch.node_ids:
                for name in (end_name(iid), beacon_name(iid), beat_name(iid)):
                    self._live_folder(launch).delete_key(name)
        except Exception as err:
            self.log.warning("Could not remove %s from the live index: %s", launch.instance_id, err)

    # --- end -----------------------------------------------------------------------------------

    def finish(self, launch: LaunchRecord, result: Outcome, keep_others: bool = False) -> Attempt:
        """Release everything, mark the outcome delivered, and account for the attempt.

        ``keep_others``: release this launch's instances only (the run's replacement instance, launched
        beside it by ``launch_beside``, keeps running)."""
        backend = self.ctx.backend
        if launch.region:  # resumed in a fresh worker: work where the instance was launched
            backend.bind_region(launch.region)
        own = [
            self.ledger.add("instance", launch.instance_id, launch.location or backend.location(launch.zone))
        ]
        for node in launch.nodes[1:]:  # a gang: every node goes, and each is marked
            own.append(self.ledger.add("instance", node["instance_id"], backend.location(node.get("zone"))))
        if keep_others:
            call_with_retry(lambda: self.ledger.release(backend, sweep=False, only=own))
        else:
            self.release()
        for iid in launch.node_ids:
            self._mark_delivered(iid, result.state)
        try:
            self.last_heartbeat = call_with_retry(lambda: self.heartbeat(launch))
        except Exception as err:  # only for the ledger's row
            self.log.warning("Could not read the last heartbeat of %s: %s", launch.instance_id, err)
        self.unpublish(launch)
        ended = time.time()
        if launch.adopted and result.ended_at:  # an earlier try's job: billed until its agent powered off
            ended = min(ended, result.ended_at)
        duration = ended - float(launch.launched_at or ended)
        cost, basis = attempt_cost(backend, launch, duration, self.ctx.config.hardware.gpus, self.log)
        attempt = Attempt(launch, result, ended, duration, cost, basis)
        self._index_cost(attempt)
        self.log.info(
            "Run %s ended: %s, exit code %s, %.0f s, cost $%s (%s)",
            launch.run_id,
            result.state,
            result.exit_code,
            duration,
            cost,
            basis,
        )
        return attempt

    def _index_cost(self, attempt: Attempt) -> None:
        """The attempt's row in the bucket's cost index (``lifecycle.cost_index``; best effort), and
        its in-flight record out."""
        from airflow_cloudtrain.lifecycle.cost_index import CostRecord, clear_running, write_record

        bucket = self.ctx.backend.run_folder(self.ctx.config.bucket)
        write_record(bucket, CostRecord.of(attempt, self.ctx.key), self.log)
        clear_running(bucket, attempt.launch.run_id, attempt.launch.instance_id, self.log)

    def _index_running(self, launch: LaunchRecord) -> None:
        """The launched attempt in the bucket's running index until it is released (best effort):
        what the Cloud training page shows as running now."""
        from airflow_cloudtrain.lifecycle.cost_index import CostRecord, write_record
        from airflow_cloudtrain.lifecycle.run.cost import hourly_usd

        try:
            bucket = self.ctx.backend.run_folder(self.ctx.config.bucket)
        except Exception as err:
            self.log.warning("Could not add the attempt to the bucket's running index (%s)", err)
            return
        write_record(bucket, CostRecord.in_flight(launch, self.ctx.key, hourly_usd(launch)), self.log)

    def release(self, sweep: bool = True) -> None:
        """Every resource of the run, through the ledger (and the tag sweep, unless just done)."""
        backend = self.ctx.backend
        call_with_retry(lambda: self.ledger.release(backend, sweep=sweep), TransientBudget(budget_s=120.0))

    def abandon(self) -> None:
        """Release after a kill, a timeout or a failed launch or wait, when the job's end is not
        reported (``lifecycle.run.abandon.abandon_run``, the triggerer's ``on_kill`` too)."""
        ctx = self.ctx
        abandon_run(
            ctx.backend, self.folder, self.ledger, self.log, try_number=ctx.try_number, store=ctx.store
        )

    def kill(self) -> None:
        """``on_kill``: stop launching and waiting, and release whatever exists (or is being made).

        Airflow calls this from its SIGTERM handler, on the main thread, wherever that thread was:
        possibly inside a storage client call holding the client's own locks (google-cloud-storage's
        bucket metadata cache holds a plain Lock while it starts a thread). Reading the run folder
        through that same client here would wait on that lock forever, so the release reads through
        a folder with a client of its own."""
        self.killed = True
        self._folder = None
        self.abandon()

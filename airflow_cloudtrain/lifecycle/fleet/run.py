"""A fleet run: a work queue, a launch template and a group of workers, made once and torn down once.

``FleetRun`` is what ``SpotFleetOperator`` and ``PreemptibleGroupOperator`` are made of, the same on
every provider: the provider's parts are a ``core.fleet.FleetBackend`` (``clouds.aws.fleet`` or
``clouds.gcp.fleet``, picked by ``clouds.registry.fleet_backend_for``). Every resource goes through
the ``ResourceLedger`` (``ensure``: find by name, else intend before the create call and record the id
after), and every name comes from the run key, so a retried task re-attaches to the queue and group an
earlier try made instead of making a second one; teardown (success, failure, ``on_kill``, a failed
deferral, a retry that finds the run over) is one ``release`` that also searches by name and tag, in
each kind's ``release_order`` (the group first: it would replace members deleted before it). The order
of ``start`` is what makes a kill at any point safe:

1. the queues (dead-letter first), 2. the run folder (spec with the worker settings), 3. the items,
then a marker ``fleet/enqueued.json`` tied to the queue's creation time, 4. the template (on GCE after
the workers' firewall rule), 5. the group. No worker exists before the marker, so a retry that finds
the queue but no marker drains it and sends the items again; a retry that finds a new queue (an
earlier try was torn down) sends only the items without a successful outcome.

The wait (``lifecycle.fleet.watch``) scales the group from the queue's backlog and decides when the
run is over; ``result`` turns the outcomes into the XCom.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.runs import join
from airflow_cloudtrain.core.fleet import FleetMaking, FleetQueues, GroupPlan
from airflow_cloudtrain.core.ledger import ResourceLedger
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry
from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle, FleetSettings
from airflow_cloudtrain.lifecycle.fleet.watch import read_outcomes
from airflow_cloudtrain.lifecycle.prepare import (
    JobOptions,
    LaunchOptions,
    offers_for,
    request_builder,
    write_run_folder,
)
from airflow_cloudtrain.lifecycle.running_entry import RunningEntry

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.cloud import LaunchRequest
    from airflow_cloudtrain.core.fleet import FleetBackend
    from airflow_cloudtrain.spec import RunConfig
    from airflow_cloudtrain.storage import RunFolder

__all__ = ["FleetContext", "FleetHandle", "FleetKilled", "FleetRun", "FleetSettings", "release_fleet"]

ENQUEUED_KEY = "fleet/enqueued.json"
MAX_OVERRIDES = 20  # instance types in the group's MixedInstancesPolicy (AWS allows up to 40)


@dataclass
class FleetContext:
    """Everything a fleet run needs, rebuilt identically by every try and after a deferral."""

    config: RunConfig
    fleet: FleetSettings
    key: RunKey
    backend: RunBackend
    store: Any  # task_state_store, or None
    try_number: int
    options: LaunchOptions
    job: JobOptions
    log: logging.Logger
    conn_id: str | None = None
    secret_env: dict[str, str] | None = None  # {VAR: reference}, checked (``operators.secret_env``)
    project_id: str | None = None
    operator: str = ""  # the operator's class name, shown by the Cloud training page

    @property
    def run_uri(self) -> str:
        return join(self.config.bucket, self.key.path())


class FleetKilled(RuntimeError):
    """The task was killed while the fleet was being made or waited on."""


class FleetRun:
    """One fleet, on whichever provider the backend is (``cloud``: its ``FleetBackend``)."""

    def __init__(self, ctx: FleetContext) -> None:
        self.ctx = ctx
        self.log = ctx.log
        self.ledger = ResourceLedger.load(ctx.key.digest, ctx.store, ctx.log)
        self.killed = False
        self._folder: RunFolder | None = None
        self._cloud: FleetBackend | None = None

    @property
    def provider(self) -> str:
        return self.ctx.backend.provider

    @property
    def folder(self) -> RunFolder:
        if self._folder is None:
            self._folder = self.ctx.backend.run_folder(self.ctx.run_uri)
        return self._folder

    @property
    def cloud(self) -> FleetBackend:
        if self._cloud is None:
            from airflow_cloudtrain.clouds.registry import fleet_backend_for

            self._cloud = fleet_backend_for(self.ctx.backend)
        return self._cloud

    def _check(self) -> None:
        if self.killed:
            raise FleetKilled("the task was killed while the fleet was being made")

    def _making(self) -> FleetMaking:
        tags = {**self.ctx.options.tags, **self.ctx.key.tags()}
        return FleetMaking(self.ledger, self.ctx.key.digest, tags, self._check, self.log)

    # --- start ---------------------------------------------------------------------------------

    def start(self) -> FleetHandle:
        """Make (or find) queue, items, template and group; returns the handle the wait uses."""
        ctx, backend = self.ctx, self.ctx.backend
        if backend.region is None:
            backend.bind_region(offers_for(ctx.config, None, self.log)[0].region)
        try:
            return self._start()
        except BaseException:
            self.release()
            raise

    def _start(self) -> FleetHandle:
        ctx, digest, cloud = self.ctx, self.ctx.key.digest, self.cloud
        if ctx.options.live_prices:
            try:
                ctx.backend.refresh_catalog()
            except Exception as err:  # the snapshot's prices still choose well
                self.log.warning("Live prices unavailable (%s); using the catalog snapshot", err)
        offers = offers_for(ctx.config, ctx.backend.region, self.log)
        types = list(dict.fromkeys(o.instance_type for o in offers))[:MAX_OVERRIDES]
        prices = {o.instance_type: o.hourly for o in offers if o.hourly is not None}
        self.log.info(
            "Workers: %s (%s), cheapest %s at $%s/h; %d instance types in the group",
            ctx.config.cloud,
            "spot" if offers[0].is_spot else "on-demand",
            offers[0].instance_type,
            offers[0].hourly,
            len(types),
        )
        queues = self._queues()
        cloud.place(ctx.config.zone, offers[0])
        group = cloud.group_name(digest)
        settings = workqueue.WorkerSettings(
            provider=self.provider,
            queue=queues.queue,
            dead_letter=queues.dead_letter,
            region=ctx.backend.region,
            group=group,
            lease_s=ctx.fleet.lease_s,
            heartbeat_s=max(1.0, ctx.fleet.lease_s / 4),
            item_timeout_s=ctx.fleet.item_timeout_s,
            max_item_attempts=ctx.fleet.max_item_attempts,
            # a worker waits for work about as long as the operator waits between polls, twice
            wait_s=max(1, min(20, round(ctx.fleet.poll_interval))),
        )
        settings = replace(settings, **cloud.worker_settings(queues, offers[0]))
        secret_env = self._secret_env()
        write_run_folder(
            ctx.config,
            ctx.key,
            ctx.run_uri,
            self.folder,
            False,
            self.log,
            ctx.job,
            settings.to_dict(),
            secret_env=secret_env,
            orphan_timeout_s=ctx.fleet.orphan_timeout_s,
        )
        from airflow_cloudtrain.core.lease import LeaseRenewer  # before any worker: a task killed now

        LeaseRenewer(self.folder, ctx.fleet.orphan_timeout_s, "fleet", self.log).renew(force=True)
        if ctx.fleet.orphan_timeout_s is None:
            self.log.info(
                "orphan_timeout=None: no lease; if nobody watches this fleet, only max_runtime ends it"
            )
        started_at, pending = self._enqueue(queues.queue, queues.send_to)
        self._check()
        request = request_builder(ctx.config, ctx.key, ctx.run_uri, ctx.options, ctx.try_number, worker=True)(
            offers[0], None, 0
        )
        template = self._template(request)
        self._group(
            GroupPlan(
                name=group,
                template=template,
                instance_types=types,
                spot=offers[0].is_spot,
                max_price=request.max_price,
                desired=min(ctx.fleet.num_workers, pending),
                max_workers=ctx.fleet.max_workers,
                offers=offers,
                subnet_id=ctx.options.subnet_id,
                tags={**ctx.options.tags, **ctx.key.tags()},
            )
        )
        index = self._index(group, offers[0].instance_type, offers[0].is_spot, started_at)
        return FleetHandle(
            index=index.to_dict(),
            run_id=ctx.key.short_id,
            run_uri=ctx.run_uri,
            run_key=digest,
            cloud=ctx.config.cloud,
            region=ctx.backend.region or cloud.region,
            queue=queues.queue,
            dead_letter=queues.dead_letter_source,
            group=group,
            item_ids=workqueue.item_ids(len(ctx.fleet.items)),
            prices=prices,
            num_workers=ctx.fleet.num_workers,
            max_workers=ctx.fleet.max_workers,
            started_at=started_at,
            try_number=ctx.try_number,
            zone=cloud.zone,
            max_cost_usd=ctx.fleet.max_cost_usd,
            poll_interval=ctx.fleet.poll_interval,
            orphan_timeout_s=ctx.fleet.orphan_timeout_s,
        )

    def _index(self, group: str, instance_type: str, spot: bool, started_at: float) -> RunningEntry:
        """The fleet in the bucket's running index from its launch (no worker running yet); its watch
        keeps the record current, ``release`` takes it out (``lifecycle.running_entry``)."""
        ctx = self.ctx
        entry = RunningEntry.of(
            ctx.config.bucket,
            ctx.key,
            operator=ctx.operator,
            run_id=ctx.key.short_id,
            run_uri=ctx.run_uri,
            cloud=ctx.config.cloud,
            name=group,
            instance_type=instance_type,
            nodes=0,
            spot=spot,
            hourly_usd=0.0,
            started_at=started_at,
        )
        entry.write(self.folder, self.log)
        return entry

    def _secret_env(self) -> dict[str, str]:
        """The spec's ``secret_env``: ``airflow_*`` references stored as the run's secrets first."""
        from airflow_cloudtrain.lifecycle.run_secrets import FLEET_LIFETIME_S, spec_secret_env

        ctx = self.ctx
        if not ctx.secret_env:
            return {}
        self._check()
        # workers keep joining and reading them as long as items are left: not max_runtime's lifetime
        return spec_secret_env(
            ctx.secret_env, self.ledger, ctx.backend, ctx.key.digest, self.log, FLEET_LIFETIME_S
        )

    # --- the steps (each found or made through the ledger by the provider's FleetBackend) ----------

    def _queues(self) -> FleetQueues:
        """The queues the workers receive from and the items are sent to (dead-letter first)."""
        return self.cloud.make_queues(
            self._making(), self.ctx.fleet.lease_s, self.ctx.fleet.max_item_attempts
        )

    def _template(self, request: LaunchRequest) -> str:
        """The workers' template; first the run's network protection where the backend has one (the GCE
        firewall rule: no member starts reachable from outside), as for a single run."""
        ctx = self.ctx
        protect = getattr(ctx.backend, "protect_network", None)
        if protect is not None:
            protect(self.ledger, ctx.key.digest, ctx.options, self._check, self.log)
        return self.cloud.make_template(self._making(), self.cloud.group_name(ctx.key.digest), request)

    def _group(self, plan: GroupPlan) -> None:
        self.cloud.make_group(self._making(), plan)

    def _enqueue(self, queue: str, send_to: str) -> tuple[float, int]:
        """Send the items once per queue (to ``send_to``: the queue, or its topic); returns (when the
        sweep started, items pending)."""
        cloud, folder, items = self.cloud, self.folder, self.ctx.fleet.items
        created = call_with_retry(lambda: cloud.queue_created(queue))
        raw = call_with_retry(lambda: folder.get_text(ENQUEUED_KEY))
        marker = json.loads(raw) if raw else {}
        ids = workqueue.item_ids(len(items))
        if marker.get("queue") == queue and marker.get("created") == created:
            done = self._succeeded_ids()
            return float(marker.get("started_at") or time.time()), len([i for i in ids if i not in done])
        if marker.get("queue") == queue:  # an earlier try died mid-send, before any worker existed
            self._drain(queue)
        done = self._succeeded_ids()
        for key in call_with_retry(lambda: folder.list(workqueue.OUTCOMES_PREFIX + "/")):
            item = key.rsplit("/", 1)[-1].removesuffix(".json")
            if item not in done:  # a failed item of an earlier try gets a fresh chance
                call_with_retry(partial(folder.delete_key, key))
        bodies = [
            (i, workqueue.encode_message(i, t)) for i, t in zip(ids, items, strict=True) if i not in done
        ]
        started_at = float(marker.get("started_at") or time.time())
        call_with_retry(
            lambda: folder.put_text(
                ENQUEUED_KEY, json.dumps({"queue": queue, "created": None, "started_at": started_at})
            )
        )  # before sending: a retry that finds this queue without ``created`` drains it first
        call_with_retry(lambda: cloud.send(send_to, bodies))
        note = {"queue": queue, "created": created, "started_at": started_at, "count": len(bodies)}
        call_with_retry(lambda: folder.put_text(ENQUEUED_KEY, json.dumps(note)))
        skipped = len(ids) - len(bodies)
        self.log.info(
            "Queued %d item(s)%s",
            len(bodies),
            f"; {skipped} already succeeded in an earlier try" if skipped else "",
        )
        return started_at, len(bodies)

    def _drain(self, queue: str) -> None:
        """Delete whatever a dead try sent (no worker exists yet, so nothing else receives)."""
        self.cloud.drain(queue)

    def _succeeded_ids(self) -> set[str]:
        return {o.id for o in read_outcomes(self.folder, set()).values() if o.state == workqueue.SUCCEEDED}

    # --- teardown --------------------------------------------------------------------------------

    def release(self, budget_s: float = 180.0, unindex: bool = True) -> None:
        """Tear the fleet down, then take it out of the bucket's running index (``unindex``; the
        delivery does that itself once the priced record is written)."""
        release_fleet(self.ledger, self.ctx.backend, TransientBudget(budget_s=budget_s), self.cloud)
        if unindex:
            self.unindex()

    def unindex(self) -> None:
        """The fleet's record out of the running index (best effort; its name comes from the run key,
        so a try that never saw the handle takes it out too)."""
        from airflow_cloudtrain.lifecycle.cost_index import clear_running

        ctx = self.ctx
        try:
            bucket = ctx.backend.run_folder(ctx.config.bucket)
        except Exception as err:
            self.log.warning("Could not take the fleet out of the bucket's running index (%s)", err)
            return
        clear_running(bucket, ctx.key.short_id, self.cloud.group_name(ctx.key.digest), self.log)

    def kill(self) -> None:
        self.killed = True
        self.release()


def release_fleet(
    ledger: ResourceLedger, backend: RunBackend, budget: TransientBudget, fleet: FleetBackend | None = None
) -> None:
    """Delete group, template, queues and any instance of the run: the ledger's entries plus a search
    by name and tag, so a store that was lost (or a triggerer, which has none) leaves nothing behind.
    Each kind goes in its ``release_order`` (the group first: deleting its members before it would
    only make it replace them)."""
    if fleet is None:
        from airflow_cloudtrain.clouds.registry import fleet_backend_for

        fleet = fleet_backend_for(backend)  # and its ledger kinds registered
    kinds = list(fleet.sweep_kinds)

    def release() -> None:
        # the backend's own kinds too (the GCE firewall rule, the run's secrets: ``run_secrets``)
        extra = [k for k in getattr(backend, "sweep_kinds", ()) if k not in kinds]
        ledger.sweep(backend, [*kinds, *extra])
        ledger.release(backend, sweep=False)

    call_with_retry(release, budget)

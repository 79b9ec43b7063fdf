"""A fleet run: a work queue, a launch template and a group of workers, made once and torn down once.

``FleetRun`` is what ``SpotFleetOperator`` is made of. Every resource goes through the
``ResourceLedger`` (intend before the create call, the id after), and every name comes from the run
key, so a retried task re-attaches to the queue and group an earlier try made instead of making a
second one; teardown (success, failure, ``on_kill``, a failed deferral, a retry that finds the run
over) is one ``release`` that also searches by name and tag. The order of ``start`` is what makes a
kill at any point safe:

1. the queues (dead-letter first), 2. the run folder (spec with the worker settings), 3. the items,
then a marker ``fleet/enqueued.json`` tied to the queue's creation time, 4. the launch template,
5. the group. No worker exists before the marker, so a retry that finds the queue but no marker
drains it and sends the items again; a retry that finds a new queue (an earlier try was torn down)
sends only the items without a successful outcome.

The wait (``lifecycle.fleet_watch``) scales the group from the queue's backlog and decides when the
run is over; ``result`` turns the outcomes into the XCom.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.runs import join
from airflow_cloudtrain.core.ledger import ResourceLedger
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry
from airflow_cloudtrain.lifecycle.prepare import (
    JobOptions,
    LaunchOptions,
    offers_for,
    request_builder,
    write_run_folder,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.spec import RunConfig

ENQUEUED_KEY = "fleet/enqueued.json"
MAX_OVERRIDES = 20  # instance types in the group's MixedInstancesPolicy (AWS allows up to 40)
SWEEP_ORDER = {  # kinds a sweep looks for, oldest first (released newest first, groups before all)
    "aws": ["sqs_queue", "launch_template", "asg", "instance"],
    "gcp": ["pubsub_topic", "pubsub_subscription", "instance_template", "mig", "instance"],
}
GROUP_KINDS = ("asg", "mig")  # deleted first: a group would replace members deleted before it


@dataclass
class FleetSettings:
    """The fleet's own arguments, parsed (``operators.fleet_config``)."""

    items: list[str]  # CLOUDTRAIN_WORK_ITEM of each item, in order
    num_workers: int = 1
    max_workers: int = 1
    item_timeout_s: float | None = None
    max_item_attempts: int = 3
    lease_s: int = 120
    allow_failed_items: bool = False
    poll_interval: float = 10.0


@dataclass
class FleetHandle:
    """What the wait needs, as plain JSON (it crosses into the trigger)."""

    run_id: str
    run_uri: str
    run_key: str
    cloud: str
    region: str
    queue: str  # SQS queue URL / Pub/Sub subscription path
    dead_letter: str  # SQS DLQ URL / Pub/Sub dead-letter subscription path (the watch reads it)
    group: str
    item_ids: list[str]
    prices: dict[str, float]  # instance type -> USD/h of the market the group buys
    num_workers: int
    max_workers: int
    started_at: float
    try_number: int = 1
    zone: str | None = None  # the managed instance group's zone (GCP)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetHandle:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass
class FleetContext:
    """Everything a fleet run needs, rebuilt identically by every try and after a deferral."""

    config: RunConfig
    fleet: FleetSettings
    key: RunKey
    backend: Any  # AwsRunBackend or GcpRunBackend
    store: Any
    try_number: int
    options: LaunchOptions
    job: JobOptions
    log: logging.Logger
    conn_id: str | None = None
    secret_env: dict[str, str] | None = None  # {VAR: reference}, checked (``operators.secret_env``)

    @property
    def run_uri(self) -> str:
        return join(self.config.bucket, self.key.path())


class FleetKilled(RuntimeError):
    """The task was killed while the fleet was being made or waited on."""


class FleetRun:
    """The AWS fleet (SQS, launch template, Auto Scaling group); ``GceFleetRun`` below is the GCP one.
    ``fleet_run(ctx)`` picks by the backend's provider."""

    provider = "aws"

    def __init__(self, ctx: FleetContext) -> None:
        self.ctx = ctx
        self.log = ctx.log
        self.names = fleet_module(self.provider)
        self.ledger = ResourceLedger.load(ctx.key.digest, ctx.store, ctx.log)
        self.killed = False
        self._folder: Any = None
        self._cloud: Any = None

    @property
    def folder(self) -> Any:
        if self._folder is None:
            self._folder = self.ctx.backend.run_folder(self.ctx.run_uri)
        return self._folder

    @property
    def cloud(self) -> Any:
        if self._cloud is None:
            self._cloud = self.names.fleet_of(self.ctx.backend)
        return self._cloud

    def _check(self) -> None:
        if self.killed:
            raise FleetKilled("the task was killed while the fleet was being made")

    # --- start -----------------------------------------------------------------------------------

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
        ctx, digest = self.ctx, self.ctx.key.digest
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
        queue, dead_letter, topic = self._queues()
        settings = workqueue.WorkerSettings(
            provider=self.provider,
            queue=queue,
            dead_letter=dead_letter,
            region=ctx.backend.region,
            group=self.names.group_name(digest),
            lease_s=ctx.fleet.lease_s,
            heartbeat_s=max(1.0, ctx.fleet.lease_s / 4),
            item_timeout_s=ctx.fleet.item_timeout_s,
            max_item_attempts=ctx.fleet.max_item_attempts,
            # a worker waits for work about as long as the operator waits between polls, twice
            wait_s=max(1, min(20, round(ctx.fleet.poll_interval))),
            **self._worker_extra(topic, offers[0]),
        )
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
        )
        started_at, pending = self._enqueue(queue, topic or queue)
        self._check()
        request = request_builder(ctx.config, ctx.key, ctx.run_uri, ctx.options, ctx.try_number, worker=True)(
            offers[0], None, 0
        )
        template = self._ensure_template(request)
        desired = min(ctx.fleet.num_workers, pending)
        self._ensure_group(template, types, offers[0].is_spot, request.max_price, desired, offers)
        return FleetHandle(
            run_id=ctx.key.short_id,
            run_uri=ctx.run_uri,
            run_key=digest,
            cloud=ctx.config.cloud,
            region=ctx.backend.region,
            queue=queue,
            dead_letter=self._dead_letter_source(dead_letter),
            group=self.names.group_name(digest),
            item_ids=workqueue.item_ids(len(ctx.fleet.items)),
            prices=prices,
            num_workers=ctx.fleet.num_workers,
            max_workers=ctx.fleet.max_workers,
            started_at=started_at,
            try_number=ctx.try_number,
            zone=getattr(self.cloud, "zone", None),
        )

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

    # --- the provider's parts (overridden by GceFleetRun) -----------------------------------------

    def _queues(self) -> tuple[str, str, str | None]:
        """(queue the workers receive from, where dead letters go, topic to publish to or None)."""
        digest = self.ctx.key.digest
        dead_letter = self._ensure_queue(self.names.queue_name(digest, dead_letter=True), None)
        return self._ensure_queue(self.names.queue_name(digest), dead_letter), dead_letter, None

    def _worker_extra(self, topic: str | None, offer: Any) -> dict[str, Any]:
        return {}

    def _dead_letter_source(self, dead_letter: str) -> str:
        return dead_letter

    def _ensure_queue(self, name: str, dead_letter: str | None) -> str:
        """The queue of that name: found (a retry), or made under the ledger."""
        cloud = self.cloud
        url = call_with_retry(lambda: cloud.queue_url(name))
        if url:
            self.ledger.add("sqs_queue", url, cloud.region)
            return url
        self._check()
        entry = self.ledger.intend("sqs_queue", cloud.region, token=name)
        arn = cloud.queue_arn(dead_letter) if dead_letter else None
        tags = {**self.ctx.options.tags, **self.ctx.key.tags()}
        url = call_with_retry(
            lambda: cloud.create_queue(
                name, tags, self.ctx.fleet.lease_s, arn, self.ctx.fleet.max_item_attempts
            )
        )
        self.ledger.created(entry, url)
        self.log.info("Created queue %s", url)
        return url

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
                call_with_retry(lambda k=key: folder.delete_key(k))
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
        from airflow_cloudtrain.lifecycle.fleet.watch import read_outcomes

        return {o.id for o in read_outcomes(self.folder, set()).values() if o.state == workqueue.SUCCEEDED}

    def _ensure_template(self, request: Any) -> str:
        cloud, name = self.cloud, self.names.group_name(self.ctx.key.digest)
        found = call_with_retry(lambda: cloud.template_id(name))
        if found:
            self.ledger.add("launch_template", name, cloud.region)
            return found
        self._check()
        aws = self.ctx.backend.cloud
        image = request.image_id or aws.default_image(request.offer.gpus)
        root = aws.root_device(image)
        entry = self.ledger.intend("launch_template", cloud.region, token=name)
        template_id = call_with_retry(lambda: cloud.create_template(name, request, image, root))
        self.ledger.created(entry, name)
        self.log.info("Created launch template %s (%s)", name, template_id)
        return template_id

    def _ensure_group(
        self,
        template: str,
        types: list[str],
        spot: bool,
        max_price: float | None,
        desired: int,
        offers: list[Any],
    ) -> None:
        cloud, ctx = self.cloud, self.ctx
        name = self.names.group_name(ctx.key.digest)
        if call_with_retry(lambda: cloud.group(name)) is not None:
            self.ledger.add("asg", name, cloud.region)
            self.log.info("Re-attached to group %s", name)
            return
        self._check()
        wanted = {z for o in offers for z in o.zones if o.instance_type in types}
        zones = [] if ctx.options.subnet_id else call_with_retry(lambda: cloud.zone_names(wanted))
        subnets = [ctx.options.subnet_id] if ctx.options.subnet_id else []
        tags = {**ctx.options.tags, **ctx.key.tags()}
        entry = self.ledger.intend("asg", cloud.region, token=name)
        call_with_retry(
            lambda: cloud.create_group(
                name, template, types, spot, max_price, desired, ctx.fleet.max_workers, zones, subnets, tags
            )
        )
        self.ledger.created(entry, name)
        self.log.info(
            "Created group %s: %d worker(s) to start, up to %d", name, desired, ctx.fleet.max_workers
        )

    # --- teardown --------------------------------------------------------------------------------

    def release(self, budget_s: float = 180.0) -> None:
        release_fleet(self.ledger, self.ctx.backend, TransientBudget(budget_s=budget_s))

    def kill(self) -> None:
        self.killed = True
        self.release()


def fleet_module(provider: str) -> Any:
    """``clouds.aws_fleet`` or ``clouds.gcp_fleet`` (importing it registers its ledger kinds)."""
    if provider == "gcp":
        from airflow_cloudtrain.clouds.gcp import fleet as gcp_fleet

        return gcp_fleet
    from airflow_cloudtrain.clouds.aws import fleet as aws_fleet

    return aws_fleet


def fleet_run(ctx: FleetContext) -> FleetRun:
    """The fleet of the backend's provider."""
    if ctx.backend.provider == "gcp":
        from airflow_cloudtrain.lifecycle.fleet.gce import GceFleetRun

        return GceFleetRun(ctx)
    return FleetRun(ctx)


def release_fleet(ledger: ResourceLedger, backend: Any, budget: TransientBudget) -> None:
    """Delete group, template, queues and any instance of the run: the ledger's entries plus a search
    by name and tag, so a store that was lost (or a triggerer, which has none) leaves nothing behind.
    The group goes first: deleting its members before it would only make it replace them."""
    fleet_module(backend.provider)

    def release() -> None:
        kinds = SWEEP_ORDER[backend.provider]  # and the run's own secrets (``run_secrets.sweep_secrets``)
        ledger.sweep(backend, [*kinds, *(k for k in getattr(backend, "sweep_kinds", ()) if k not in kinds)])
        groups = [e for e in ledger.entries if e.kind in GROUP_KINDS]
        if groups:
            ledger.release(backend, sweep=False, only=groups)
        ledger.release(backend, sweep=False)

    call_with_retry(release, budget)

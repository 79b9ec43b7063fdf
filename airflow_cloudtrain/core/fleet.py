"""What a work-queue fleet needs from a provider: the ``FleetBackend`` protocol and its shared records.

``lifecycle.fleet`` owns the order (queues, run folder, items, template, group; the teardown) and the
watch (scaling, the end, the result); a ``FleetBackend`` makes and reads the provider's parts:
``clouds.aws.fleet.AwsFleet`` (SQS + launch template + Auto Scaling group) and
``clouds.gcp.fleet.GcpFleet`` (Pub/Sub + instance template + managed instance group). Neither is the
base of the other; ``clouds.registry.fleet_backend_for`` is the one place that picks.

Each ``make_*`` call finds its resource by the name the run key gives it (a retried task re-attaches)
or makes it under the ledger (``ResourceLedger.ensure``), calling ``FleetMaking.check`` before any
create call so that a killed task stops making things.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

if TYPE_CHECKING:
    import logging

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.cloud import Instance, LaunchRequest
    from airflow_cloudtrain.core.ledger import ResourceLedger

T = TypeVar("T")


@dataclass
class Depth:
    """A queue's depth: visible (waiting), in flight (leased), delayed."""

    visible: int
    in_flight: int
    delayed: int = 0

    @property
    def backlog(self) -> int:
        return self.visible + self.in_flight

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


@dataclass
class GroupState:
    """What the watch needs of the worker group each poll."""

    name: str
    desired: int
    max_size: int
    members: dict[str, bool]  # instance id -> protected from scale-in


@dataclass
class FleetQueues:
    """The queues a fleet made: where workers receive, where items are sent, where dead letters go."""

    queue: str  # SQS queue URL / Pub/Sub subscription path (the workers receive from it)
    dead_letter: str  # SQS DLQ URL / Pub/Sub dead-letter topic (the workers' settings)
    send_to: str  # the queue itself (SQS) or its topic (Pub/Sub)
    dead_letter_source: str  # what the watch reads dead letters from (the DLQ / its subscription)
    topic: str | None = None  # Pub/Sub's items topic (the workers publish nothing else)


class WorkerPlace(TypedDict, total=False):
    """The provider's extra ``contract.workqueue.WorkerSettings`` fields (GCP's; none on AWS)."""

    topic: str | None
    zone: str | None
    project: str | None


@dataclass
class GroupPlan:
    """The worker group to make."""

    name: str
    template: str
    instance_types: list[str]  # cheapest first
    spot: bool
    max_price: float | None
    desired: int
    max_workers: int
    offers: list[Offer]  # the fitting offers (their zones)
    subnet_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class FleetMaking:
    """What every ``make_*`` call shares: the run's ledger, its tags, the kill check and the task log."""

    ledger: ResourceLedger
    digest: str
    tags: dict[str, str]
    check: Callable[[], None]  # raises once the task was killed
    log: logging.Logger

    def ensure(
        self,
        kind: str,
        location: str | None,
        name: str,
        find: Callable[[], T | None],
        create: Callable[[], T],
        record: str | None = None,
    ) -> tuple[T, bool]:
        """``ResourceLedger.ensure`` with this run's kill check: (the resource, made now?)."""
        return self.ledger.ensure(
            kind, location, name, find=find, create=create, before_create=self.check, record=record
        )


class FleetBackend(Protocol):
    """One provider's fleet parts, bound to a connection, region (and zone once known)."""

    provider: str
    region: str
    zone: str | None
    sweep_kinds: tuple[str, ...]  # the ledger kinds of a fleet, oldest first (a release searches them)

    def group_name(self, digest: str) -> str: ...

    # --- making (each through the ledger) ---------------------------------------------------------

    def make_queues(self, making: FleetMaking, lease_s: int, max_attempts: int) -> FleetQueues: ...

    def place(self, zone: str | None, offer: Offer) -> None:
        """Pin where the group goes: ``zone=``, else the cheapest offer's first zone (GCP's zonal
        group); nothing on AWS, whose group spans the region's fitting zones."""

    def worker_settings(self, queues: FleetQueues, offer: Offer) -> WorkerPlace:
        """The provider's extra ``WorkerSettings`` fields (GCP: topic, zone, project)."""

    def queue_created(self, queue: str) -> str:
        """The queue's creation stamp: a queue made again under the same name is another queue."""

    def send(self, to: str, bodies: list[tuple[str, str]]) -> None: ...

    def drain(self, queue: str) -> None:
        """Delete whatever a dead try sent (no worker exists yet, so nothing else receives)."""

    def make_template(self, making: FleetMaking, name: str, request: LaunchRequest) -> str: ...

    def make_group(self, making: FleetMaking, plan: GroupPlan) -> None: ...

    # --- the watch --------------------------------------------------------------------------------

    def depth(self, queue: str) -> Depth | None:
        """The backlog, or None where the queue cannot say (Pub/Sub)."""

    def group(self, name: str) -> GroupState | None: ...

    def members(self, digest: str) -> list[Instance]:
        """Every worker of the run, in any state."""

    def take_dead_letters(self, source: str) -> list[tuple[str, int]]:
        """(body, deliveries) of the items that reached the dead-letter queue, taken off it."""

    def set_desired(self, name: str, desired: int) -> None: ...

    def replace_member(self, name: str, instance_id: str) -> None:
        """End a member whose agent went silent (its machine runs on, but nothing works there) and
        let the group make another in its place: the group's size is kept."""

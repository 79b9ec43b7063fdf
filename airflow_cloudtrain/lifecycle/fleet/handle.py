"""The fleet's plain records: its parsed settings and the handle its wait (blocking or deferred) uses."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_cloudtrain.contract.records import load_known


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
    max_cost_usd: float | None = None  # ``max_cost``: the group stops growing, then ends, at the budget
    orphan_timeout_s: float | None = None  # the fleet's lease (``core.lease``); None: none


@dataclass
class FleetHandle:
    """What the wait needs, as plain JSON (it crosses into the trigger: keep its fields readable by
    the previous release's ``FleetHandle.from_dict``, and read theirs)."""

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
    max_cost_usd: float | None = None  # ``max_cost`` (``FleetWatch.within_budget``)
    poll_interval: float = 10.0  # the wait's: how far ahead the budget looks
    orphan_timeout_s: float | None = None  # the fleet's lease, renewed by its watch (None: none)
    # its record in the bucket's running index (``lifecycle.running_entry.RunningEntry.to_dict``),
    # kept by its watch; None: not indexed (a handle of an earlier release)
    index: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetHandle:
        return load_known(cls, data)

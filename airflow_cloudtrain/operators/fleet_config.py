"""The fleet operators' own arguments: checked at DAG parse time, again once templates are rendered.

Local and cheap like ``operators.config``: ``work_items`` that come from an upstream task (an XComArg)
or a template are checked when the task runs, everything else when the DAG file is parsed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.operators.checks import check_bool
from airflow_cloudtrain.operators.checks import check_whole as _count
from airflow_cloudtrain.operators.checks import is_deferred_value as is_deferred_value  # re-exported
from airflow_cloudtrain.operators.config import parse_duration

if TYPE_CHECKING:
    from airflow_cloudtrain.lifecycle.fleet.run import FleetSettings

MAX_ITEMS = 100_000
MAX_RECEIVES = 1000  # SQS's maxReceiveCount limit
MAX_LEASE_S = workqueue.SQS_MAX_LEASE_S  # SQS's longest visibility timeout (the default queue)


def parse_work_items(value: Any) -> list[str]:
    """The items as the job will see them (``CLOUDTRAIN_WORK_ITEM``): strings as they are, dicts
    (and other JSON values) as JSON; a rendered template that is a JSON list is accepted too."""
    given = value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(
                f"work_items={value[:80]!r} is not valid: give a list of strings or JSON-serialisable "
                "dicts (or an upstream task's output / a template that renders to one)"
            ) from None
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"work_items={str(repr(given))[:80]} is not valid: give a list of strings or JSON-serialisable dicts"
        )
    if not value:
        raise ValueError("work_items=[] is empty: give at least one item to run (nothing would run)")
    if len(value) > MAX_ITEMS:
        raise ValueError(f"work_items has {len(value)} items: at most {MAX_ITEMS} per task")
    out = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            text = item
        elif item is None:
            raise ValueError(
                f"work_items[{index}]=None is not valid: give each item as a string or a JSON-serialisable "
                "dict (an upstream task that returned None?)"
            )
        else:
            try:
                text = json.dumps(item, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"work_items[{index}]={item!r} is not valid ({err}): give each item as a string or a "
                    "JSON-serialisable dict (no NaN or infinity)"
                ) from None
        if len(text.encode()) > workqueue.MAX_MESSAGE_BYTES - 1000:
            raise ValueError(
                f"work_items[{index}] is {len(text.encode())} bytes: at most "
                f"{workqueue.MAX_MESSAGE_BYTES - 1000} per item (a queue message); put large inputs "
                "in the bucket and pass their URIs"
            )
        out.append(text)
    return out


def parse_fleet_args(
    args: dict[str, Any],
    items: list[str] | None,
    max_lease_s: float | None = None,
    lease_limit: str = "12 h",
) -> FleetSettings:
    """Everything but the items (``items=None``: not known yet); raises ValueError naming the field.
    ``max_lease_s`` is the queue's longest lease (``contract.workqueue``: SQS 12 h, the default;
    Pub/Sub's ack deadline, 600 s), the cap the agent's queue puts on the lease it asks for."""
    from airflow_cloudtrain.lifecycle.fleet.run import FleetSettings

    num_workers = _count(args.get("num_workers", 1), "num_workers", 1, 10_000)
    max_workers_arg = args.get("max_workers")
    max_workers = (
        num_workers if max_workers_arg is None else _count(max_workers_arg, "max_workers", 1, 10_000)
    )
    if max_workers < num_workers:
        raise ValueError(
            f"max_workers={max_workers} is less than num_workers={num_workers}: the group starts with "
            "num_workers and scales up to max_workers; give max_workers >= num_workers, or leave it out"
        )
    attempts = _count(args.get("max_item_attempts", 3), "max_item_attempts", 1, MAX_RECEIVES)
    lease = parse_duration(args.get("lease_timeout", 120), "lease_timeout") or 120.0
    longest = workqueue.SQS_MAX_LEASE_S if max_lease_s is None else max_lease_s
    if not workqueue.MIN_LEASE_S <= lease <= longest:
        raise ValueError(
            f"lease_timeout={args.get('lease_timeout')!r} is not valid: between {workqueue.MIN_LEASE_S} s "
            f"and {lease_limit} "
            "(how long an item stays leased to a worker that stopped renewing it)"
        )
    item_timeout = parse_duration(args.get("item_timeout"), "item_timeout")
    return FleetSettings(
        items=items or [],
        num_workers=num_workers,
        max_workers=max_workers,
        item_timeout_s=item_timeout,
        max_item_attempts=attempts,
        lease_s=int(lease),
        allow_failed_items=check_bool(args.get("allow_failed_items", False), "allow_failed_items"),
    )

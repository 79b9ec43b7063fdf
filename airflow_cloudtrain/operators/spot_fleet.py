"""SpotFleetOperator: a queue of work items on an EC2 Auto Scaling group of spot workers.

The studio tool's ``--cloud=ec2spot --num-workers N --bid 60%`` inside Airflow: an SQS queue of the
items, a group that starts with ``num_workers`` and grows with the backlog up to ``max_workers``,
workers that leave when the queue is empty. Everything else is ``WorkQueueOperator``'s.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.operators.work_queue import WorkQueueOperator


class SpotFleetOperator(WorkQueueOperator):
    """Run ``command`` once per item of ``work_items`` on a scaling group of EC2 (spot) workers.

    Takes the shared arguments of ``CloudTrainOperator`` (``cloud`` = ``ec2spot`` or ``ec2``,
    hardware, ``bid``, ``bucket``, ``code``, ``image``, ``setup_cmds``, ``env``, ``max_runtime``,
    ...) plus ``work_items`` (templated: a list of strings or JSON-serialisable dicts, e.g. an upstream
    task's output), ``num_workers`` (at start), ``max_workers`` (scale-up limit), ``item_timeout``
    (each item's ``max_runtime``), ``max_item_attempts`` (deliveries before an item is failed and
    dead-lettered), ``lease_timeout`` (how soon a vanished worker's item reappears),
    ``checkpoint_dir`` / ``checkpoint_interval`` (per-item checkpoint sync, restored when an item
    moves to another worker) and ``allow_failed_items``. Returns the XCom dict described in the README
    (``items_total``, ``items_succeeded``, ``items_failed``, ``items``, ``workers_launched``,
    ``interruptions``, ``cost_usd``, ...); fails listing the items that failed for good.
    """

    def __init__(self, *, work_items: Any, cloud: str = "ec2spot", **kwargs: Any) -> None:
        super().__init__(work_items=work_items, cloud=cloud, **kwargs)

    def _check_cloud(self, cloud: Any, bid: Any) -> None:
        from airflow_cloudtrain.operators.checks import is_deferred_value

        if is_deferred_value(cloud):
            return
        if cloud not in ("ec2spot", "ec2"):
            raise ValueError(
                f"cloud={cloud!r} is not valid for SpotFleetOperator: use 'ec2spot' or 'ec2' "
                "(PreemptibleGroupOperator runs the same work queue on GCE)"
            )
        if cloud == "ec2" and bid not in (None, ""):
            raise ValueError(
                f"bid={bid!r} is not valid with cloud='ec2': on-demand workers have no bid; "
                "use cloud='ec2spot' to bid for spot workers"
            )

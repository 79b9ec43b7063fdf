"""PreemptibleGroupOperator: the same work queue on a GCE managed instance group of Spot VMs.

The studio tool's ``--cloud=gcspot --num-workers N``: "the required number of workers has to be
specified via --num-workers (the default is 1), and Google group will try to keep it constant (if the
instances are taken away, it will try to spin up their replacements). When instances run out of work,
they automatically spin down and eventually the instance group is deleted." The items travel on a
Pub/Sub topic and pull subscription; the group is made from an instance template with the secure shape
of a single GCE run. Everything else (items, leases, outcomes, teardown, XCom) is
``WorkQueueOperator``'s, as for ``SpotFleetOperator``.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.operators.work_queue import WorkQueueOperator

CLOUDS = ("gcspot", "gcloud")


class PreemptibleGroupOperator(WorkQueueOperator):
    """Run ``command`` once per item of ``work_items`` on a constant-size group of GCE Spot VMs.

    Takes the shared arguments of ``CloudTrainOperator`` (``cloud`` = ``gcspot`` (default) or
    ``gcloud``, hardware, ``bucket`` (a ``gs://`` bucket), ``code``, ``image``, ``setup_cmds``,
    ``env``, ``max_runtime``, ``project_id``, ``zone`` / ``region``, ``gcp_conn_id``,
    ``provisioning`` = ``"spot"`` (default) or ``"preemptible"``, ...) and the work-queue arguments of
    ``SpotFleetOperator`` (``work_items``, ``num_workers``, ``item_timeout``, ``max_item_attempts``,
    ``lease_timeout``, ``checkpoint_dir``, ``checkpoint_interval``, ``allow_failed_items``).
    ``num_workers`` is the group's constant size (preempted VMs are recreated; workers with no work
    left remove themselves). There is no ``max_workers`` and no ``bid``: a MIG does not scale with the
    queue here, and Spot VMs have no bid. Returns the same XCom as ``SpotFleetOperator``.
    """

    max_lease_s = 600  # Pub/Sub's longest ack deadline: a longer lease cannot be held
    lease_limit = "600 s, Pub/Sub's longest ack deadline"

    def __init__(
        self,
        *,
        work_items: Any,
        cloud: str = "gcspot",
        num_workers: int = 1,
        provisioning: str | None = None,
        **kwargs: Any,
    ) -> None:
        for name in ("max_workers", "bid"):
            if kwargs.get(name) not in (None, ""):
                raise ValueError(
                    f"{name}={kwargs[name]!r} is not valid for PreemptibleGroupOperator: "
                    + (
                        "the group keeps num_workers constant (use SpotFleetOperator to scale with the queue)"
                        if name == "max_workers"
                        else "GCE Spot VMs have no bid: Google sets the Spot price and preempts a VM when it "
                        "needs the capacity back, not by price (to cap cost, ask for a cheaper machine, "
                        "or use SpotFleetOperator with cloud='ec2spot')"
                    )
                )
        if provisioning is None and cloud == "gcspot":
            provisioning = "spot"
        super().__init__(
            work_items=work_items, cloud=cloud, num_workers=num_workers, provisioning=provisioning, **kwargs
        )

    def _check_cloud(self, cloud: Any, bid: Any) -> None:
        from airflow_cloudtrain.operators.checks import is_deferred_value

        if is_deferred_value(cloud):
            return
        if cloud not in CLOUDS:
            raise ValueError(
                f"cloud={cloud!r} is not valid for PreemptibleGroupOperator: use 'gcspot' or 'gcloud' "
                "(SpotFleetOperator runs the same work queue on EC2)"
            )

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
    ``lease_timeout``, ``checkpoint_dir``, ``checkpoint_interval``, ``allow_failed_items``,
    ``idle_timeout``).
    ``num_workers`` is the group's constant size (preempted VMs are recreated; workers with no work
    left remove themselves). There is no ``max_workers`` and no ``bid``: a MIG does not scale with the
    queue here, and Spot VMs have no bid. Returns the same XCom as ``SpotFleetOperator``.

    :param cloud: ``gcspot`` (default: Spot VMs) or ``gcloud`` (standard VMs).
    :param provisioning: ``"spot"`` (the default with ``gcspot``) or ``"preemptible"``.
    :param max_workers: refused: the group keeps ``num_workers`` constant (``SpotFleetOperator``
        scales with the queue).
    :param bid: refused: GCE Spot VMs have no bid.
    :param work_items: the items (templated): a list of strings or JSON-serialisable dicts, e.g. an
        upstream task's output; each runs ``command`` once (``CLOUDTRAIN_WORK_ITEM``,
        ``CLOUDTRAIN_ITEM_ID``).
    :param num_workers: workers at the start: the group's constant size (preempted VMs are recreated).
    :param item_timeout: each item's ``max_runtime`` (a duration).
    :param max_item_attempts: deliveries before an item fails for good (and is dead-lettered).
    :param lease_timeout: how soon the item of a vanished worker reappears (at most 600 s, Pub/Sub's longest ack deadline).
    :param checkpoint_dir: the per-item checkpoint directory synced to the run folder and restored
        when an item moves to another worker.
    :param checkpoint_interval: how often that directory is synced.
    :param checkpoint_snapshots: keep files of that directory that match no framework layout too, each
        at its newest stable version (default True; see docs/checkpoints.md).
    :param allow_failed_items: succeed even when items failed for good (they are listed in the XCom).
    :param idle_timeout: the hung-job watchdog, per item (a duration; default None: off): an item whose
        job used no CPU (and no GPU) for this long is stopped and counts as a failed attempt of that
        item (retried up to ``max_item_attempts``); the worker goes on with the queue.

    Arguments shared with ``CloudTrainOperator`` (see its description for each; all templated ones
    are templated here too):

    :param command: the shell command each worker runs once per item (templated).
    :param bucket: the run folder's bucket and prefix (templated).
    :param code: a local directory or archive URI shipped to every worker (templated).
    :param image: a container image the command runs in (templated).
    :param setup_cmds: shell commands run once on each worker before its first item (templated).
    :param env: environment variables for the command (templated).
    :param secret_env: ``{VAR: reference}`` read at run time, never stored in the spec (templated).
    :param cpus: vCPUs per worker (templated).
    :param gpus: GPUs per worker (templated).
    :param gpu_type: the GPU model (templated).
    :param ram: memory per worker (templated).
    :param hdd: disk per worker (templated).
    :param instance_type: pin the worker type instead of choosing the cheapest (templated).
    :param region: the region to run in (templated).
    :param zone: the zone to run in (templated).
    :param max_runtime: the hard stop of one worker (templated).
    :param deferrable: wait in the triggerer (``FleetTrigger``) instead of the worker slot.
    :param poll_interval: seconds between two polls of the fleet.
    :param aws_conn_id: the AWS connection.
    :param gcp_conn_id: the Google Cloud connection.
    :param project_id: the GCP project (None: the connection's).
    :param image_id: the machine image of the workers.
    :param key_name: an EC2 key pair.
    :param subnet_id: the subnet the workers start in.
    :param security_group_ids: EC2 security groups.
    :param iam_instance_profile: the workers' instance profile.
    :param tags: tags / labels on everything the run makes.
    :param volume_id: not for fleets (one volume cannot attach to many workers).
    :param service_account: the GCE workers' service account.
    :param network: the GCE network.
    :param subnetwork: the GCE subnetwork.
    :param external_ip: whether GCE workers get an external IP.
    :param ssh_source_ranges: CIDR ranges allowed to SSH into GCE workers.
    :param max_launch_attempts: launch attempts across offers.
    :param live_prices: refresh shapes and prices from the cloud before choosing.
    :param startup_timeout: how long items may wait with no worker running before the task fails.
    :param heartbeat_timeout: how long a running worker may go without rewriting its record (every
        few seconds) before the group replaces it: its agent died while its machine runs on.
    :param orphan_timeout: the fleet's watch renews its lease; once nobody did for this long its workers
        stop taking items and leave, so the group drains to 0 (default 30 minutes; None: off).
    """

    lease_limit = "600 s, Pub/Sub's longest ack deadline"

    @property
    def max_lease_s(self) -> float:
        """Pub/Sub's longest ack deadline (``contract.workqueue``): a longer lease cannot be held."""
        from airflow_cloudtrain.contract.workqueue import PUBSUB_MAX_LEASE_S

        return PUBSUB_MAX_LEASE_S

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

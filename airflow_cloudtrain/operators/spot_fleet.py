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
    moves to another worker), ``idle_timeout`` (the hung-job watchdog, per item) and
    ``allow_failed_items``. Returns the XCom dict described in the README
    (``items_total``, ``items_succeeded``, ``items_failed``, ``items``, ``workers_launched``,
    ``interruptions``, ``cost_usd``, ``cost_basis``, ...); fails listing the items that failed for
    good.

    :param cloud: ``ec2spot`` (default: spot workers) or ``ec2`` (on-demand workers; no ``bid``).
    :param bid: the spot bid (``ec2spot`` only), as for ``CloudTrainOperator``.
    :param provisioning: GCE only (``gcspot``): refused here; the market comes from ``cloud``.
    :param work_items: the items (templated): a list of strings or JSON-serialisable dicts, e.g. an
        upstream task's output; each runs ``command`` once (``CLOUDTRAIN_WORK_ITEM``,
        ``CLOUDTRAIN_ITEM_ID``).
    :param num_workers: workers at the start.
    :param max_workers: the scale-up limit (the group grows with the backlog up to it).
    :param item_timeout: each item's ``max_runtime`` (a duration).
    :param max_item_attempts: deliveries before an item fails for good (and is dead-lettered).
    :param lease_timeout: how soon the item of a vanished worker reappears (at most 12 h).
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

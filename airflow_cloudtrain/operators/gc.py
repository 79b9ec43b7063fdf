"""``CloudTrainGcOperator``: ``cloudtrain gc`` as a task, so a deployment can sweep its clouds daily.

Its arguments are the command's (``cloud``, ``region``/``zone``, ``project_id``, ``bucket``,
``dry_run``, ``older_than``); it logs the same table and returns the listing (one JSON-safe dict per
resource: kind, id, location, digest, run_uri, age_s, state, hourly_usd, lease, action, why, result)
as its XCom. A delete that fails fails the task after the others went (the next day's run retries
it). The cloud SDKs are imported only when it runs: parsing a DAG that uses it stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator

CLOUDS = ("aws", "ec2", "ec2spot", "gcp", "gcloud", "gcspot")


def older_than_seconds(value: Any, field_name: str = "older_than") -> float:
    """``older_than`` in seconds: any duration the operators take (``1h``, ``90m``, 3600, a
    timedelta), or 0 (every age); a clear ValueError naming the field otherwise."""
    from airflow_cloudtrain.operators.checks import parse_duration

    zero = not isinstance(value, bool) and isinstance(value, (int, float, str)) and value in (0, "0", "0s")
    if zero or (isinstance(value, timedelta) and value == timedelta(0)):
        return 0.0
    seconds = parse_duration(value, field_name, extra_forms=", or 0 (every age)")
    if seconds is None:
        raise ValueError(f"{field_name}={value!r} is not a valid duration: give e.g. 1h, 90m or 0")
    return seconds


def check_arguments(
    cloud: Any, region: Any, zone: Any, project_id: Any, bucket: Any, aws_conn_id: Any, gcp_conn_id: Any
) -> None:
    """The operators' own rules for each argument (a template is checked once rendered, at run time)."""
    from airflow_cloudtrain.operators.checks import (
        check_zone_in_region,
        is_templated,
        parse_region,
        parse_zone,
    )
    from airflow_cloudtrain.operators.config import parse_bucket
    from airflow_cloudtrain.operators.launch_config import check_connection_args

    if not isinstance(cloud, str) or cloud not in CLOUDS:
        raise ValueError(f"cloud={cloud!r} is not valid: use one of {', '.join(CLOUDS)}")
    name = {"aws": "ec2", "gcp": "gcloud"}.get(cloud, cloud)  # the validators speak the cloud names
    check_connection_args(aws_conn_id, gcp_conn_id, None if is_templated(project_id) else project_id, name)
    if not is_templated(region):
        parse_region(region, name)
    if zone is not None and not is_templated(zone):
        if name.startswith("ec2"):
            raise ValueError(
                f"zone={zone!r} is not valid with cloud={cloud!r}: EC2 is swept per region; give region= "
                "(or leave both out for the connection's region)"
            )
        parse_zone(zone, name)
        if not is_templated(region):
            check_zone_in_region(name, region, zone)
    if bucket is not None and not is_templated(bucket):
        parse_bucket(bucket, name)


class CloudTrainGcOperator(BaseOperator):
    """List what runs left on one cloud region (zone) and delete what no run wants any more.

    A resource goes when its run finished, its lease lapsed, or (no lease to read: a release
    without leases, or no run folder) by age alone; nothing younger than ``older_than`` and nothing
    of a run whose lease is fresh is ever touched. ``dry_run=True`` only lists.

    :param cloud: ``aws`` / ``ec2`` / ``ec2spot`` or ``gcp`` / ``gcloud`` / ``gcspot``.
    :param region: where to sweep (default: the connection's region) (templated).
    :param zone: GCE only: sweep only this zone's VMs and groups (templated).
    :param project_id: the Google Cloud project (default: the connection's) (templated).
    :param bucket: where the run folders live: finds the run of a resource that carries only its run
        key (templated).
    :param dry_run: list only; nothing is changed.
    :param older_than: touch nothing younger than this (default ``1h``; 0: every age).
    """

    template_fields: Sequence[str] = ("region", "zone", "project_id", "bucket")
    ui_color = "#e8f0e0"

    def __init__(
        self,
        *,
        cloud: str,
        region: str | None = None,
        zone: str | None = None,
        project_id: str | None = None,
        bucket: str | None = None,
        dry_run: bool = False,
        older_than: Any = "1h",
        aws_conn_id: str | None = "aws_default",
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        from airflow_cloudtrain.operators.checks import check_bool

        super().__init__(**kwargs)
        check_arguments(cloud, region, zone, project_id, bucket, aws_conn_id, gcp_conn_id)
        self.cloud = cloud
        self.region = region
        self.zone = zone
        self.project_id = project_id
        self.bucket = bucket
        self.gc_dry_run = check_bool(dry_run, "dry_run")  # not ``dry_run``: BaseOperator has that method
        self.older_than_s = older_than_seconds(older_than)
        self.aws_conn_id = aws_conn_id
        self.gcp_conn_id = gcp_conn_id

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from airflow_cloudtrain.lifecycle.gc import format_table, gc

        found = gc(
            self.cloud,
            self.region,
            self.zone,
            self.project_id,
            self.bucket,
            self.gc_dry_run,
            self.older_than_s,
            self.aws_conn_id,
            self.gcp_conn_id,
        )
        self.log.info("cloudtrain gc%s:\n%s", " (dry run)" if self.gc_dry_run else "", format_table(found))
        doomed = [x for x in found if x.action == "delete"]
        deleted = [x for x in doomed if x.result == "deleted"]
        failed = [x for x in doomed if x.result.startswith("failed")]
        verb = "would delete" if self.gc_dry_run else "deleted"
        self.log.info("%s %d of %d resources", verb, len(doomed if self.gc_dry_run else deleted), len(found))
        if failed:
            raise RuntimeError(
                "cloudtrain gc could not delete: "
                + "; ".join(f"{x.kind} {x.id} ({x.result})" for x in failed)
            )
        return [x.to_dict() for x in found]

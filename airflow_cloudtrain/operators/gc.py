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
    if value in (0, 0.0, "0", "0s") or (isinstance(value, timedelta) and not value):
        return 0.0
    from airflow_cloudtrain.operators.checks import parse_duration

    seconds = parse_duration(value, field_name, extra_forms=", or 0 (every age)")
    if seconds is None:
        raise ValueError(f"{field_name}={value!r} is not a valid duration: give e.g. 1h, 90m or 0")
    return seconds


class CloudTrainGcOperator(BaseOperator):
    """List what runs left on one cloud region (zone) and delete what no run wants any more.

    A resource goes when its run finished, its lease lapsed, or (no lease to read: a release
    without leases, or no run folder) by age alone; nothing younger than ``older_than`` and nothing
    of a run whose lease is fresh is ever touched. ``dry_run=True`` only lists."""

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
        super().__init__(**kwargs)
        if cloud not in CLOUDS:
            raise ValueError(f"cloud={cloud!r} is not valid: use one of {', '.join(CLOUDS)}")
        if bucket is not None and not str(bucket).startswith(("s3://", "gs://", "{{")):
            raise ValueError(
                f"bucket={bucket!r} is not valid: give the run folders' s3://... or gs://... URI"
            )
        self.cloud = cloud
        self.region = region
        self.zone = zone
        self.project_id = project_id
        self.bucket = bucket
        self.gc_dry_run = bool(dry_run)  # not ``dry_run``: BaseOperator has a method of that name
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

"""The four cloud names, which provider serves each, and the run backend for a name.

This is the one place the names are listed. It is stdlib-only at import time because the agent on
the instance imports it too (it ships in the agent zip); the backends, which need the cloud SDKs
and Airflow's hooks, are imported only when ``backend_for`` is called on a worker or triggerer.
"""

from __future__ import annotations

from typing import Any

# The studio tool's names (see docs/design.md), mapped to the provider that serves them.
CLOUDS: dict[str, str] = {"ec2": "aws", "ec2spot": "aws", "gcloud": "gcp", "gcspot": "gcp"}
AWS_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "aws")
GCP_CLOUDS: frozenset[str] = frozenset(c for c, p in CLOUDS.items() if p == "gcp")
SPOT_CLOUDS: frozenset[str] = frozenset({"ec2spot", "gcspot"})


def provider_of(cloud: str) -> str:
    """``aws`` or ``gcp`` for a cloud name; raises naming the accepted names otherwise."""
    try:
        return CLOUDS[cloud]
    except KeyError:
        raise ValueError(f"cloud={cloud!r} is not valid: use one of {', '.join(CLOUDS)}") from None


def conn_id_for(cloud: str, aws_conn_id: str | None, gcp_conn_id: str | None) -> str | None:
    """The connection of the provider that serves ``cloud``."""
    return gcp_conn_id if provider_of(cloud) == "gcp" else aws_conn_id


def location_for(cloud: str, region: str | None, zone: str | None) -> str | None:
    """Where instances are described and deleted: EC2 per region, GCE per zone."""
    return zone if provider_of(cloud) == "gcp" else region


def backend_for(
    cloud: str,
    *,
    region: str | None = None,
    aws_conn_id: str | None = "aws_default",
    gcp_conn_id: str = "google_cloud_default",
    project_id: str | None = None,
) -> Any:
    """The ``RunBackend`` (see ``clouds.backend``) for a cloud name, bound to a connection and region."""
    if provider_of(cloud) == "aws":
        from airflow_cloudtrain.clouds.aws_backend import AwsRunBackend

        return AwsRunBackend(aws_conn_id, region)
    from airflow_cloudtrain.clouds.gcp_backend import GcpRunBackend

    return GcpRunBackend(gcp_conn_id, project_id, region)


def instance_cloud(
    cloud: str,
    conn_id: str | None,
    region: str | None,
    zone: str | None = None,
    project_id: str | None = None,
) -> Any:
    """A ``Cloud`` for direct instance calls (the sensor): EC2 in a region, GCE in a zone or region."""
    if provider_of(cloud) == "aws":
        from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

        return CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region).cloud()
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    return CloudTrainGcpHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id).cloud(
        region, zone
    )

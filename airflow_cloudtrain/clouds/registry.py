"""The four cloud names, which provider serves each, and the run backend for a name.

This is the one place the names are listed. It is stdlib-only at import time because the agent on
the instance imports it too (it ships in the agent zip); the backends, which need the cloud SDKs
and Airflow's hooks, are imported only when ``backend_for`` is called on a worker or triggerer.
"""

from __future__ import annotations

from typing import Any

# The studio tool's names (see ../shared/reference), mapped to the provider that serves them.
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


def is_spot(cloud: str) -> bool:
    return cloud in SPOT_CLOUDS


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

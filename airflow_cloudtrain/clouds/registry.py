"""The four cloud names, which provider serves each, and the run backend for a name.

The names themselves are listed in ``contract.clouds`` (stdlib-only: the agent reads them too). This
module is the one switch from a name to its provider's modules on the Airflow side; the backends,
which need the cloud SDKs and Airflow's hooks, are imported only when they are asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from airflow_cloudtrain.contract.clouds import provider_of

if TYPE_CHECKING:
    from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.fleet import FleetBackend


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
        from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend

        return AwsRunBackend(aws_conn_id, region)
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend

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


def fleet_backend_for(backend: RunBackend, zone: str | None = None) -> FleetBackend:
    """The work-queue ``FleetBackend`` on a run backend's connection and region (a GCE group's
    ``zone`` when it is known): SQS + Auto Scaling on AWS, Pub/Sub + a managed instance group on GCP.
    Importing the provider's module registers its ledger kinds."""
    if backend.provider == "aws":
        from airflow_cloudtrain.clouds.aws.fleet import fleet_of as aws_fleet

        return aws_fleet(cast("AwsRunBackend", backend), zone)
    from airflow_cloudtrain.clouds.gcp.fleet import fleet_of as gcp_fleet

    return gcp_fleet(cast("GcpRunBackend", backend), zone)

"""The one switch: a cloud name, a provider name or a bucket's URI scheme to its provider's face.

The cloud names themselves are listed in ``contract.clouds`` (stdlib-only: the agent reads them too).
This module is the one place on the Airflow side that maps a name or a scheme to the provider's
modules (``clouds.aws.provider.AWS``, ``clouds.gcp.provider.GCP``: ``core.provider.Provider``), and a
queue provider to its depth reader; everything else asks the face (``backend_for(...)`` is a
``core.backend.RunBackend``). The providers, which need the cloud SDKs and Airflow's hooks, are
imported only when they are asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from airflow_cloudtrain.contract.clouds import conn_id_for, provider_of

if TYPE_CHECKING:
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.cloud import Cloud
    from airflow_cloudtrain.core.provider import Provider
    from airflow_cloudtrain.hooks.depth import DepthReader

PROVIDERS = ("aws", "gcp")
SCHEMES: dict[str, str] = {"s3": "aws", "gs": "gcp"}  # an object store's URI scheme -> its provider


def provider(name: str) -> Provider:
    """The face of ``aws`` or ``gcp``."""
    if name == "aws":
        from airflow_cloudtrain.clouds.aws.provider import AWS

        return AWS
    if name == "gcp":
        from airflow_cloudtrain.clouds.gcp.provider import GCP

        return GCP
    raise ValueError(f"provider={name!r} is not valid: use one of {', '.join(PROVIDERS)}")


def provider_for_cloud(cloud: str) -> Provider:
    """The face of the provider that serves a cloud name (``ec2``, ``ec2spot``, ``gcloud``, ``gcspot``)."""
    return provider(provider_of(cloud))


def provider_for_scheme(scheme: str) -> Provider:
    """The face of the provider whose object store a URI scheme (``s3``, ``gs``) names."""
    try:
        return provider(SCHEMES[scheme])
    except KeyError:
        raise ValueError(f"scheme {scheme!r} is not valid: use one of {', '.join(SCHEMES)}") from None


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
) -> RunBackend:
    """The ``RunBackend`` for a cloud name, bound to its provider's connection and a region."""
    conn_id = conn_id_for(cloud, aws_conn_id, gcp_conn_id)
    return provider_for_cloud(cloud).backend(conn_id, region, project_id)


def instance_cloud(
    cloud: str,
    conn_id: str | None,
    region: str | None,
    zone: str | None = None,
    project_id: str | None = None,
) -> Cloud:
    """A ``Cloud`` for direct instance calls (the sensor): EC2 in a region, GCE in a zone or region."""
    return provider_for_cloud(cloud).instance_cloud(conn_id, region, zone, project_id)


def depth_reader(
    queue_provider: str, conn_id: str | None, region: str | None, project_id: str | None = None
) -> DepthReader:
    """The queue-depth reader for a queue provider (``hooks.depth.PROVIDERS``: "sqs", "pubsub"),
    bound to a connection and location (and, for Pub/Sub, the project bare subscription names are in)."""
    if queue_provider == "sqs":
        from airflow_cloudtrain.hooks.sqs import SqsDepthReader

        return SqsDepthReader(conn_id, region)
    if queue_provider == "pubsub":
        from airflow_cloudtrain.hooks.pubsub import PubSubDepthReader

        return PubSubDepthReader(conn_id, project_id, region)
    from airflow_cloudtrain.hooks.depth import PROVIDERS as QUEUE_PROVIDERS

    raise ValueError(f"provider={queue_provider!r} is not valid: use one of {', '.join(QUEUE_PROVIDERS)}")


def fleet_backend_for(backend: RunBackend, zone: str | None = None) -> FleetBackend:
    """The work-queue ``FleetBackend`` on a run backend's connection and region (a GCE group's
    ``zone`` when it is known): SQS + Auto Scaling on AWS, Pub/Sub + a managed instance group on GCP.
    Importing the provider's module registers its ledger kinds."""
    if backend.provider == "aws":
        from airflow_cloudtrain.clouds.aws.fleet import fleet_of as aws_fleet

        return aws_fleet(cast("AwsRunBackend", backend), zone)
    from airflow_cloudtrain.clouds.gcp.fleet import fleet_of as gcp_fleet

    return gcp_fleet(cast("GcpRunBackend", backend), zone)

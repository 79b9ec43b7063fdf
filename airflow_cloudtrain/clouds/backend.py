"""What a run needs from one cloud provider, whichever it is: the ``RunBackend`` protocol.

``clouds.registry.backend_for(cloud, ...)`` returns one (``aws_backend.AwsRunBackend`` or
``gcp_backend.GcpRunBackend``) bound to a connection and region. The lifecycle, the sensor and the
triggers speak only this protocol and ``Cloud``; no other module branches on the provider.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from airflow_cloudtrain.agent.storage import RunFolder
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.clouds.base import Cloud, Instance

AsyncDescribe = Callable[[list[str]], Awaitable[dict[str, "Instance"]]]


class RunBackend(Protocol):
    provider: str  # "aws" | "gcp"
    region: str | None

    @property
    def cloud(self) -> Cloud: ...

    def bind_region(self, region: str) -> None:
        """Work in ``region`` from now on (the catalog picked it, or an earlier try launched there)."""

    def run_folder(self, run_uri: str) -> RunFolder: ...

    def refresh_catalog(self) -> None:
        """Live shapes and prices for the bound region (best effort: the caller catches)."""

    def zones_for(self, zone: str | None, offer: Offer) -> list[str | None]:
        """Zones to try an offer in, in order, before moving to the next offer."""

    def location_of(self, instance: Instance) -> str | None:
        """Where the ledger records an instance (EC2: region; GCE: zone)."""

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        """Terminate / delete ``(id, location)`` pairs; unknown ids are already done."""


def async_describer(cloud: str, conn_id: str | None, location: str | None,
                    project_id: str | None = None) -> tuple[Hashable, AsyncDescribe]:  # fmt: skip
    """(poll-group key, async describe) for one connection and location, for the shared poll."""
    from airflow_cloudtrain.clouds.registry import provider_of

    if provider_of(cloud) == "aws":
        from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

        return ("aws", conn_id, location), CloudTrainAwsHook(aws_conn_id=conn_id, region_name=location).describe_async
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    hook = CloudTrainGcpHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id)

    async def describe(ids: list[str]) -> dict[str, Instance]:
        return await hook.describe_async(ids, zone=location)

    return ("gcp", conn_id, project_id, location), describe


def instance_cloud(cloud: str, conn_id: str | None, region: str | None, zone: str | None = None,
                   project_id: str | None = None) -> Cloud:  # fmt: skip
    """A ``Cloud`` for direct instance calls (the sensor): EC2 in a region, GCE in a zone or region."""
    from airflow_cloudtrain.clouds.registry import provider_of

    if provider_of(cloud) == "aws":
        from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

        return CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region).cloud()
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

    return CloudTrainGcpHook(gcp_conn_id=conn_id or "google_cloud_default", project_id=project_id).cloud(region, zone)

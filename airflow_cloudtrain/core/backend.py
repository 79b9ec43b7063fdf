"""What a run needs from one cloud provider, whichever it is: the ``RunBackend`` protocol.

``clouds.registry.backend_for(cloud, ...)`` returns one (``aws_backend.AwsRunBackend`` or
``gcp_backend.GcpRunBackend``) bound to a connection and region. The lifecycle, the sensor and the
triggers speak only this protocol and ``Cloud``; no other module branches on the provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.cloud import Cloud
    from airflow_cloudtrain.storage import RunFolder


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

    def location(self, zone: str | None) -> str | None:
        """Where the ledger records an instance in ``zone`` (EC2: the region; GCE: the zone)."""

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        """Terminate / delete ``(id, location)`` pairs; unknown ids are already done."""

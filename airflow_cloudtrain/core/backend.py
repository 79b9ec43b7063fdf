"""What a run needs from one cloud provider, whichever it is: the ``RunBackend`` protocol.

``clouds.registry.backend_for(cloud, ...)`` returns one (``clouds.aws.backend.AwsRunBackend`` or
``clouds.gcp.backend.GcpRunBackend``) bound to a connection and region; mypy checks that both satisfy
this protocol where the registry returns them. The engines, the sensor and the triggers speak only
this protocol, ``Cloud`` and ``core.provider.Provider``; the registry is the one switch from a cloud
name to a provider (see ``docs/design.md``, "One provider face").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from logging import Logger

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.billing import PriceHistory
    from airflow_cloudtrain.core.cloud import Cloud
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.storage import RunFolder


class RunBackend(Protocol):
    """One provider's instances, run folders, run secrets and catalog, for one connection and region."""

    provider: str  # "aws" | "gcp"
    region: str | None
    # the ledger kinds every teardown's tag sweep looks for (``run_secrets.sweep_secrets`` adds one)
    sweep_kinds: tuple[str, ...]

    @property
    def cloud(self) -> Cloud: ...

    @property
    def secret_kind(self) -> str:
        """The ledger kind of the run's own secrets (SSM parameters, Secret Manager secrets)."""
        ...

    def bind_region(self, region: str) -> None:
        """Work in ``region`` from now on (the catalog picked it, or an earlier try launched there)."""

    def run_folder(self, run_uri: str) -> RunFolder: ...

    def refresh_catalog(self) -> None:
        """Live shapes and prices for the bound region (best effort: the caller catches)."""

    def zones_for(self, zone: str | None, offer: Offer) -> list[str | None]:
        """Zones to try an offer in, in order, before moving to the next offer."""
        ...

    def location(self, zone: str | None) -> str | None:
        """Where the ledger records an instance in ``zone`` (EC2: the region; GCE: the zone)."""
        ...

    def spot_placement_scores(
        self, instance_type: str, nodes: int, zones: Sequence[str], logger: Logger | None
    ) -> dict[str, float] | None:
        """The cloud's forecast (higher: likelier) that a spot request for ``nodes`` instances of
        ``instance_type`` succeeds in each of ``zones`` now, for ranking them; None where the cloud
        has none (GCE) or would not say (EC2's Spot placement scores, best effort)."""
        ...

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        """Terminate / delete ``(id, location)`` pairs; unknown ids are already done."""

    def protect_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        check: Callable[[], None],
        logger: Logger | None,
    ) -> None:
        """Before the run's first instance: what keeps it unreachable from outside (GCE: a firewall
        rule through the ledger; EC2: nothing, its security groups are the user's)."""

    def gang_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        placement: str | None,
        check: Callable[[], None],
        logger: Logger | None,
    ) -> dict[str, Any]:
        """Before a gang's first node: its nodes reach each other and nothing else reaches them, with
        ``placement="cluster"`` close together; through the ledger. Returns the ``LaunchRequest``
        fields every node gets (EC2: security groups, placement group; GCE: resource policies)."""
        ...

    def charged_prices(
        self, instance_type: str, zone: str | None, spot: bool, gpus: int, start: float, end: float
    ) -> PriceHistory | None:
        """The hourly prices an instance of ``instance_type`` in ``zone`` was charged from ``start`` to
        ``end`` (EC2 spot: the zone's spot price history; GCE Spot without GPUs: the Billing catalog's
        current SKU price), or None when its launch price is what was charged (on-demand)."""
        ...

    def secret_name(self, digest: str, var: str) -> tuple[str, str | None]:
        """(name, location) of the run secret for ``var``: known before it exists, so the ledger
        records it write-ahead."""
        ...

    def put_secret(self, digest: str, var: str, value: str, ttl_s: float | None) -> str:
        """Store ``value`` as the run's secret for ``var`` (expiring by itself after ``ttl_s``);
        returns the reference the agent reads it by."""
        ...

"""The GCP ``RunBackend``: Compute Engine in the zones of one region, the GCS run folder and the
run's Secret Manager secrets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.gcp import firewall as gcp_firewall  # registers the ledger's "firewall" kind
from airflow_cloudtrain.clouds.gcp import gang_net as gcp_gang_net  # registers the gang's ledger kinds
from airflow_cloudtrain.clouds.gcp import secrets as gcp_secrets  # registers the ledger's "gcp_secret"
from airflow_cloudtrain.clouds.gcp.gce import GcpCloud, gcp_cloud, zones_of
from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Sequence

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.billing import PriceHistory
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.storage import RunFolder


class GcpRunBackend:
    """An instance's id is its name; the zone travels beside it (the ledger's location).

    Every teardown's tag sweep also looks for the run's firewall rules (``clouds.gcp_firewall``), in the
    connection's project and in any network project a launch named (``firewall_projects``)."""

    provider = "gcp"
    sweep_kinds: tuple[str, ...] = ("instance", gcp_firewall.KIND)
    firewall_projects: tuple[str, ...] = ()
    gang_kinds: tuple[str, ...] = gcp_gang_net.GANG_KINDS  # swept too for a gang's run (``abandon``)

    def __init__(self, conn_id: str, project_id: str | None, region: str | None) -> None:
        self.hook = CloudTrainGcpHook(gcp_conn_id=conn_id, project_id=project_id)
        self.conn_id = conn_id
        self.region: str | None = region or self.hook._get_field("region") or None
        self._cloud: GcpCloud | None = None

    @property
    def cloud(self) -> GcpCloud:
        if self._cloud is None:
            self._cloud = gcp_cloud(self.hook, self.region)
        return self._cloud

    def bind_region(self, region: str) -> None:
        """The catalog picked the region (none was asked for): work in its zones."""
        if region and self.region != region:
            self.region = region
            self._cloud = None

    def protect_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        check: Callable[[], None],
        logger: logging.Logger | None,
    ) -> None:
        """Before the run's first VM: the rule that keeps its VMs unreachable from outside (and the
        SSH rule ``ssh_source_ranges`` asks for), made through the ledger."""
        gcp_firewall.protect_run(self, ledger, digest, options, self.region, check, logger)

    def gang_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        placement: str | None,
        check: Callable[[], None],
        logger: logging.Logger | None,
    ) -> dict[str, Any]:
        """A gang's network before its first VM (``clouds.gcp.gang_net``), through the ledger: the
        tag-to-tag allow rule (the run's tag is on every VM already) and the compact placement policy,
        which every node's ``LaunchRequest`` names."""
        net = gcp_gang_net.ensure_gang_network(
            self,
            ledger,
            digest,
            self.region or "",
            network=options.network,
            subnetwork=options.subnetwork,
            placement=placement,
            check=check,
            logger=logger,
        )
        return {"resource_policies": [net.placement_policy] if net.placement_policy else []}

    def run_folder(self, run_uri: str) -> RunFolder:
        return self.hook.run_folder(run_uri)

    def refresh_catalog(self) -> None:
        """Live shapes (machineTypes, acceleratorTypes) and prices (Cloud Billing Catalog) for the region."""
        if not self.region:
            return
        from airflow_cloudtrain.catalog.live_gcp import BILLING_URL, billing_session, refresh_gcp

        def clients() -> tuple[Any, Any, Any]:
            # built inside the refresh's time budget: the compute_v1 import alone can take seconds
            from google.cloud import compute_v1

            kwargs = self.hook._client_kwargs("compute_endpoint")
            return (
                compute_v1.MachineTypesClient(**kwargs),
                compute_v1.AcceleratorTypesClient(**kwargs),
                billing_session(kwargs["credentials"]),
            )

        refresh_gcp(
            self.region,
            None,
            None,
            None,
            zones_of(self.region),
            self.hook.project,
            billing_url=self.hook._get_field("billing_endpoint") or BILLING_URL,
            clients=clients,
        )

    def charged_prices(
        self, instance_type: str, zone: str | None, spot: bool, gpus: int, start: float, end: float
    ) -> PriceHistory | None:
        """A Spot VM without GPUs: the Billing catalog's current Spot SKU price (``clouds.gcp.prices``)."""
        region = self.region or (zone.rsplit("-", 1)[0] if zone else None)
        if not spot or gpus or not region:
            return None
        from airflow_cloudtrain.catalog.live_gcp import BILLING_URL, billing_session
        from airflow_cloudtrain.clouds.gcp.prices import spot_sku_history

        session = billing_session(self.hook._client_kwargs("compute_endpoint")["credentials"])
        url = self.hook._get_field("billing_endpoint") or BILLING_URL
        return spot_sku_history(session, url, region, instance_type, start)

    def spot_placement_scores(
        self, instance_type: str, nodes: int, zones: Sequence[str], logger: logging.Logger | None
    ) -> dict[str, float] | None:
        """Compute Engine publishes no forecast of Spot capacity per zone: the ranking goes without."""
        return None

    def zones_for(self, zone: str | None, offer: Offer) -> list[str | None]:
        """A capacity error in one zone tries the offer's other zones before the next offer."""
        return [zone] if zone else list(offer.zones) or [None]

    def location(self, zone: str | None) -> str | None:
        return zone

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        by_zone: dict[str | None, list[str]] = {}
        for name, zone in instances:
            by_zone.setdefault(zone, []).append(name)
        for zone, names in by_zone.items():
            cloud = (
                self.cloud
                if zone is None
                else gcp_cloud(self.hook, self.region or zone.rsplit("-", 1)[0], zone)
            )
            cloud.terminate(names)

    @property
    def secret_kind(self) -> str:
        return gcp_secrets.KIND

    def secret_name(self, digest: str, var: str) -> tuple[str, str | None]:
        """Secret Manager secrets are global to the project: no location."""
        return gcp_secrets.secret_name(self, digest, var), None

    def put_secret(self, digest: str, var: str, value: str, ttl_s: float | None) -> str:
        return gcp_secrets.put_secret(self, digest, var, value, ttl_s)[2]

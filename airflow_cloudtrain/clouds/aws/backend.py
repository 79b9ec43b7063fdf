"""The AWS ``RunBackend``: EC2 in one region, the S3 run folder and the run's SSM secrets, from one
Airflow connection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.aws import gang_net as aws_gang_net  # registers the gang's ledger kinds
from airflow_cloudtrain.clouds.aws import secrets as aws_secrets  # registers the ledger's "ssm_parameter"
from airflow_cloudtrain.clouds.aws.ec2 import AwsCloud, aws_cloud
from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Sequence

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.billing import PriceHistory
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.storage import RunFolder


class AwsRunBackend:
    """EC2 clients are per region: the connection's region (or the one bound) is where runs go."""

    provider = "aws"
    sweep_kinds: tuple[str, ...] = ("instance",)
    gang_kinds: tuple[str, ...] = aws_gang_net.GANG_KINDS  # swept too for a gang's run (``abandon``)

    def __init__(self, conn_id: str | None, region: str | None) -> None:
        self.conn_id = conn_id
        self.hook = CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region)
        self.region: str | None = self.hook.conn_region_name
        self._cloud: AwsCloud | None = None
        self._s3: Any = None  # one S3 client for the run folders (thread-safe; a client costs ~50 ms)
        self._scores_refused = False  # GetSpotPlacementScores refused once: not asked again

    @property
    def cloud(self) -> AwsCloud:
        if self._cloud is None:
            self._cloud = aws_cloud(self.hook)
        return self._cloud

    def bind_region(self, region: str) -> None:
        if region and region != self.region:
            self.hook = CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=region)
            self.region = region
            self._cloud = None
            self._s3 = None

    def gang_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        placement: str | None,
        check: Callable[[], None],
        logger: logging.Logger | None,
    ) -> dict[str, Any]:
        """A gang's network before its first node (``clouds.aws.gang_net``), through the ledger; the
        ``LaunchRequest`` fields every node gets: the run's group (and the user's), the placement group."""
        net = aws_gang_net.ensure_gang_network(
            self,
            ledger,
            digest,
            subnet_id=options.subnet_id,
            peer_groups=list(options.security_group_ids),
            placement=placement,
            check=check,
            logger=logger,
        )
        groups = [
            net.security_group_id,
            *[g for g in options.security_group_ids if g != net.security_group_id],
        ]
        return {"security_group_ids": groups, "placement_group": net.placement_group}

    def run_folder(self, run_uri: str) -> RunFolder:
        from airflow_cloudtrain.storage import open_run_folder

        if self._s3 is None:
            self._s3 = self.hook.s3_client()
        return open_run_folder(run_uri, s3_client=self._s3)

    def refresh_catalog(self) -> None:
        from botocore.config import Config

        from airflow_cloudtrain.catalog.live import refresh_aws

        quick = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=20)
        pricing = self.hook.client("pricing", region="us-east-1", config=quick)  # Pricing lives in us-east-1
        region = self.region or self.hook.conn_region_name  # always set: the connection's at least
        refresh_aws(region, self.hook.client("ec2", config=quick), pricing)

    def charged_prices(
        self, instance_type: str, zone: str | None, spot: bool, gpus: int, start: float, end: float
    ) -> PriceHistory | None:
        """A spot instance: its zone's spot price history over its lifetime (``clouds.aws.prices``)."""
        if not spot or not zone:
            return None
        from airflow_cloudtrain.clouds.aws.prices import spot_price_history

        history = spot_price_history(self.hook.client("ec2"), instance_type, zone, start, end)
        return history if history.points else None

    def zones_for(self, zone: str | None, offer: Offer) -> list[str | None]:
        """EC2 places the instance itself when no zone is asked for; a capacity error moves on."""
        return [zone]

    def location(self, zone: str | None) -> str | None:
        return self.region

    def spot_placement_scores(
        self, instance_type: str, nodes: int, zones: Sequence[str], logger: logging.Logger | None
    ) -> dict[str, float] | None:
        """EC2's Spot placement score of each of ``zones`` for ``nodes`` instances of ``instance_type``
        (``clouds.aws.spot_scores``); None when not known: refused (then never asked again by this
        backend: the role or account gets none) or failed (said, and asked again next time)."""
        if self._scores_refused or not self.region:
            return None
        from airflow_cloudtrain.clouds.aws.spot_scores import ScoresRefused, spot_placement_scores

        try:
            found = spot_placement_scores(self.hook.client("ec2"), instance_type, nodes, zones, self.region)
        except ScoresRefused as err:
            self._scores_refused = True
            if logger is not None:
                logger.info("No Spot placement scores (the zones are ranked without them): %s", err)
            return None
        except Exception as err:  # best effort: the ranking goes on without scores
            if logger is not None:
                logger.warning("Spot placement scores not read this time: %s", err)
            return None
        return {zone: float(score) for zone, score in found.items()}

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        by_region: dict[str | None, list[str]] = {}
        for iid, region in instances:
            by_region.setdefault(region or self.region, []).append(iid)
        for region, ids in by_region.items():
            cloud = (
                self.cloud
                if region == self.region
                else aws_cloud(CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=region))
            )
            cloud.terminate(ids)

    def protect_network(
        self,
        ledger: ResourceLedger,
        digest: str,
        options: Any,
        check: Callable[[], None],
        logger: logging.Logger | None,
    ) -> None:
        """Nothing to make: an EC2 instance's security groups are the user's (``security_group_ids``)."""

    @property
    def secret_kind(self) -> str:
        return aws_secrets.KIND

    def secret_name(self, digest: str, var: str) -> tuple[str, str | None]:
        return aws_secrets.parameter_name(digest, var), self.region

    def put_secret(self, digest: str, var: str, value: str, ttl_s: float | None) -> str:
        return aws_secrets.put_secret(self, digest, var, value, ttl_s)[2]

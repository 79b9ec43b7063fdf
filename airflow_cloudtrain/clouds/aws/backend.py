"""The AWS ``RunBackend``: EC2 in one region and the S3 run folder, from one Airflow connection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.clouds.aws.ec2 import AwsCloud
    from airflow_cloudtrain.storage import RunFolder


class AwsRunBackend:
    """EC2 clients are per region: the connection's region (or the one bound) is where runs go."""

    provider = "aws"

    def __init__(self, conn_id: str | None, region: str | None) -> None:
        self.conn_id = conn_id
        self.hook = CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region)
        self.region: str | None = self.hook.conn_region_name
        self._cloud: AwsCloud | None = None

    @property
    def cloud(self) -> AwsCloud:
        if self._cloud is None:
            self._cloud = self.hook.cloud()
        return self._cloud

    def bind_region(self, region: str) -> None:
        if region and region != self.region:
            self.hook = CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=region)
            self.region = region
            self._cloud = None

    def run_folder(self, run_uri: str) -> RunFolder:
        from airflow_cloudtrain.storage import open_run_folder

        return open_run_folder(run_uri, s3_client=self.hook.s3_client())

    def refresh_catalog(self) -> None:
        from botocore.config import Config

        from airflow_cloudtrain.catalog.live import refresh_aws

        quick = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=20)
        pricing = self.hook.client("pricing", region="us-east-1", config=quick)  # Pricing lives in us-east-1
        refresh_aws(self.region, self.hook.client("ec2", config=quick), pricing)

    def zones_for(self, zone: str | None, offer: Offer) -> list[str | None]:
        """EC2 places the instance itself when no zone is asked for; a capacity error moves on."""
        return [zone]

    def location(self, zone: str | None) -> str | None:
        return self.region

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None:
        by_region: dict[str | None, list[str]] = {}
        for iid, region in instances:
            by_region.setdefault(region or self.region, []).append(iid)
        for region, ids in by_region.items():
            cloud = (
                self.cloud
                if region == self.region
                else CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=region).cloud()
            )
            cloud.terminate(ids)

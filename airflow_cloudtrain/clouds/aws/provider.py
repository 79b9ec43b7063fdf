"""AWS's provider face (``core.provider.Provider``): what the registry hands out for ``ec2`` /
``ec2spot`` runs and for ``s3://`` buckets."""

from __future__ import annotations

from collections.abc import Hashable

from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend
from airflow_cloudtrain.clouds.aws.ec2 import AwsCloud, aws_cloud
from airflow_cloudtrain.clouds.aws.pollers import Ec2Poller, S3LiveStore
from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook


class AwsProvider:
    """EC2 per region, S3, SSM; the connection is ``aws_conn_id`` (None: boto3's default chain)."""

    name = "aws"
    scheme = "s3"

    def conn(self, conn_id: str | None) -> str | None:
        return conn_id

    def backend(self, conn_id: str | None, region: str | None, project_id: str | None) -> AwsRunBackend:
        return AwsRunBackend(conn_id, region)

    def instance_cloud(
        self, conn_id: str | None, region: str | None, zone: str | None, project_id: str | None
    ) -> AwsCloud:
        return aws_cloud(CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region))

    def poll_key(
        self, conn_id: str | None, location: str | None, project_id: str | None, ended_only: bool
    ) -> tuple[Hashable, ...]:
        return (self.name, conn_id, location, ended_only)  # a run's wait asks only for ended ones

    def instance_poller(self, key: tuple[Hashable, ...]) -> Ec2Poller:
        _, conn_id, region, ended_only = key
        return Ec2Poller(_opt_str(conn_id), _opt_str(region), ended_only=bool(ended_only))

    def live_store(self, conn_id: str | None, project_id: str | None, bucket: str) -> S3LiveStore:
        return S3LiveStore(conn_id, bucket)


def _opt_str(value: Hashable) -> str | None:
    return None if value is None else str(value)


AWS = AwsProvider()

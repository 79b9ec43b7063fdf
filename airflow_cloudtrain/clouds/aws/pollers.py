"""What the triggerer polls on AWS, one SDK client per shared poll group: EC2 instances and the live
index's S3 bucket (``core.provider``: ``InstancePoller``, ``LiveStore``)."""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook


class Ec2Poller:
    """The EC2 side of one shared poll group: one boto3 client, built on first use in a worker
    thread (building a client loads botocore's service model: too slow for the event loop), used
    only from worker threads (the response of a thousand instances is parsed there too), and
    closed when the group ends. ``ended_only``: ask only for stopped/ended instances (a run's wait)."""

    def __init__(self, conn_id: str | None, region: str | None, ended_only: bool = False) -> None:
        self.conn_id = conn_id
        self.region = region
        self.ended_only = ended_only
        self._client: Any = None

    def _ec2(self) -> Any:
        if self._client is None:
            self._client = CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=self.region).client("ec2")
        return self._client

    def describe(self, ids: list[str]) -> dict[str, Instance]:
        """Blocking; up to 1,000 ids per call, the bad-id fallback of ``clouds.aws.ec2``."""
        from airflow_cloudtrain.clouds.aws.ec2 import describe_ended, describe_instances

        return (describe_ended if self.ended_only else describe_instances)(self._ec2(), ids)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


class S3LiveStore:
    """One S3 bucket through one boto3 client of the connection (the live index's reads)."""

    def __init__(self, conn_id: str | None, bucket: str) -> None:
        self.bucket = bucket
        self.client: Any = CloudTrainAwsHook(aws_conn_id=conn_id).client("s3")

    def listing(self, prefix: str) -> list[tuple[str, str | None, float | None]]:
        out: list[tuple[str, str | None, float | None]] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                out.append((obj["Key"][len(prefix) :], obj.get("ETag"), obj["LastModified"].timestamp()))
        return out

    def read(self, key: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            return None

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def close(self) -> None:
        self.client.close()

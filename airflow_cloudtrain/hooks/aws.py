"""The AWS hook: clients from the Airflow connection, sync for workers, aiobotocore for triggers."""

from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_cloudtrain.clouds.aws import (
    AwsCloud,
    id_chunks,
    id_filters,
    instances_of,
    rejects_an_id,
    with_missing,
)
from airflow_cloudtrain.clouds.base import Instance


class CloudTrainAwsHook(AwsBaseHook):
    """EC2 + S3 + SSM for one connection and region (``aws_conn_id``, as the Amazon provider)."""

    conn_name_attr = "aws_conn_id"
    default_conn_name = "aws_default"
    conn_type = "aws"
    hook_name = "Cloud Train (AWS)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "ec2"
        super().__init__(*args, **kwargs)

    def client(self, service: str, region: str | None = None, config: Any = None) -> Any:
        """A boto3 client for any service, from this connection (credentials, endpoint, config)."""
        session = self.get_session(region_name=region or self.conn_region_name)
        return session.client(
            service,
            endpoint_url=self.conn_config.get_service_endpoint_url(service_name=service),
            config=config or self.config,
            verify=self.verify,
        )

    def cloud(self) -> AwsCloud:
        from botocore.config import Config

        no_retries = (self.config or Config()).merge(
            Config(retries={"mode": "standard", "total_max_attempts": 1})
        )
        return AwsCloud(
            self.conn, self.conn_region_name, self.client("ssm"), self.client("ec2", config=no_retries)
        )

    @property
    def conn_region_name(self) -> str:
        return self.region_name or self.conn.meta.region_name

    def s3_client(self) -> Any:
        return self.client("s3")

    async def _ec2_async(self) -> Any:
        """One aiobotocore client per hook (per shared poll group), not one per poll."""
        if getattr(self, "_ec2_client", None) is None:
            self._ec2_client = await (await self.get_async_conn()).__aenter__()
        return self._ec2_client

    async def _close_ec2(self) -> None:
        client = getattr(self, "_ec2_client", None)
        self._ec2_client = None
        if client is not None:
            await client.__aexit__(None, None, None)

    async def describe_async(self, ids: list[str]) -> dict[str, Instance]:
        """DescribeInstances for up to 1,000 ids per call, without blocking the event loop; the same
        chunking and bad-id fallback as ``clouds.aws.describe_instances``."""
        out: dict[str, Instance] = {}
        client = await self._ec2_async()
        for chunk in id_chunks(ids):
            try:
                responses = [await client.describe_instances(InstanceIds=chunk)]
            except Exception as err:
                if not rejects_an_id(err):
                    await self._close_ec2()  # a fresh client next poll; this one's session is closed
                    raise
                responses = [await client.describe_instances(Filters=f) for f in id_filters(chunk)]
            out.update((i.id, i) for response in responses for i in instances_of(response))
        return with_missing(ids, out)

    async def s3_async(self) -> Any:
        hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, client_type="s3", region_name=self.conn_region_name)
        return await hook.get_async_conn()

"""The AWS hook: clients from the Airflow connection, sync for workers, aiobotocore for triggers."""

from __future__ import annotations

from typing import Any

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_cloudtrain.clouds.aws import AwsCloud, map_client_error, to_instance
from airflow_cloudtrain.clouds.base import TERMINATED, Instance


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
        return AwsCloud(self.conn, self.conn_region_name, self.client("ssm"))

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

    async def describe_async(self, ids: list[str]) -> dict[str, Instance]:
        """DescribeInstances for up to 1,000 ids per call, without blocking the event loop.

        An id EC2 rejects (malformed, or gone for over an hour) fails the whole call for every
        watcher of the group; then the ids are described by filter, 200 values a filter, which
        ignores such ids, and the ids still missing count as terminated.
        """
        out: dict[str, Instance] = {}
        unique = sorted(set(ids))
        client = await self._ec2_async()
        for start in range(0, len(unique), 1000):
            chunk = unique[start : start + 1000]
            try:
                responses = [await client.describe_instances(InstanceIds=chunk)]
            except Exception as err:
                if not getattr(map_client_error(err), "code", "").startswith("InvalidInstanceID"):
                    self._ec2_client = None
                    raise
                responses = [
                    await client.describe_instances(
                        Filters=[{"Name": "instance-id", "Values": chunk[i : i + 200]}]
                    )
                    for i in range(0, len(chunk), 200)
                ]
            for response in responses:
                for reservation in response["Reservations"]:
                    for raw in reservation["Instances"]:
                        out[raw["InstanceId"]] = to_instance(raw)
        for missing in set(unique) - set(out):
            out[missing] = Instance(missing, TERMINATED, "", None, False, state_reason="not found")
        return out

    async def terminate_async(self, ids: list[str]) -> None:
        async with await self.get_async_conn() as client:
            await client.terminate_instances(InstanceIds=ids)

    async def s3_async(self) -> Any:
        hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, client_type="s3", region_name=self.conn_region_name)
        return await hook.get_async_conn()


class AwsRunBackend:
    """What the operator needs from AWS for one run: the cloud, the run folder, live prices."""

    provider = "aws"

    def __init__(self, conn_id: str | None, region: str | None) -> None:
        self.hook = CloudTrainAwsHook(aws_conn_id=conn_id, region_name=region)
        self.conn_id = conn_id
        self.region = self.hook.conn_region_name
        self.cloud = self.hook.cloud()

    def run_folder(self, run_uri: str) -> Any:
        from airflow_cloudtrain.agent.storage import open_run_folder

        return open_run_folder(run_uri, s3_client=self.hook.s3_client())

    def refresh_catalog(self) -> None:
        from botocore.config import Config

        from airflow_cloudtrain.catalog.live import refresh_aws

        quick = Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=20)
        pricing = self.hook.client("pricing", region="us-east-1", config=quick)  # Pricing lives in us-east-1
        refresh_aws(self.region, self.hook.client("ec2", config=quick), pricing)

    def zones_for(self, zone: str | None, offer: Any) -> list[str | None]:
        """EC2 places the instance itself when no zone is asked for; a capacity error moves on."""
        return [zone]

    def bind_region(self, region: str) -> None:
        """EC2 clients are per region: the connection's region is where this run goes."""

    def trigger_args(self, launch: dict[str, Any]) -> dict[str, Any]:
        return {"conn_id": self.conn_id, "region": self.region}

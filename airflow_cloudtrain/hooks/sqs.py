"""SQS queue depth through the Airflow AWS connection: one boto3 client per hook, for the sensor's
poke and for the trigger (one per poll group, built and called in worker threads, closed with it:
building a client loads botocore's service model, which must not stall the triggerer's loop)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Hashable
from functools import cached_property
from typing import Any, ClassVar

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_cloudtrain.contract.botocore_logs import quiet_botocore
from airflow_cloudtrain.hooks.aws import CallerFromFrames
from airflow_cloudtrain.hooks.depth import DepthReader, QueueDepth, QueueNotFound

DEPTH_ATTRIBUTES = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]
# The JSON protocol's code, and the query protocol's (older botocore, some endpoints).
MISSING_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
MAX_CONCURRENT = 16  # GetQueueAttributes in flight at once for one poll of many queues

# https://sqs.us-west-2.amazonaws.com/123/q, https://sqs.cn-north-1.amazonaws.com.cn/123/q,
# legacy https://us-west-2.queue.amazonaws.com/123/q
_URL_REGION = re.compile(
    r"^https?://(?:sqs\.([a-z0-9-]+)\.amazonaws\.com|([a-z0-9-]+)\.queue\.amazonaws\.com)"
)


def is_url(queue: str) -> bool:
    return queue.startswith(("https://", "http://"))


def region_in_url(url: str) -> str | None:
    """The region an AWS queue URL names (None for other hosts, e.g. a local endpoint)."""
    match = _URL_REGION.match(url)
    return (match.group(1) or match.group(2)) if match else None


def is_missing_queue(err: BaseException) -> bool:
    error = (getattr(err, "response", None) or {}).get("Error", {})
    return error.get("Code") in MISSING_CODES or error.get("QueryErrorCode") in MISSING_CODES


def depth_of(url: str, attributes: dict[str, str]) -> QueueDepth:
    return QueueDepth(
        queue=url,
        visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
        in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
        delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
    )


class QueueDepthHook(CallerFromFrames, AwsBaseHook):
    """GetQueueUrl / GetQueueAttributes for one connection and region (``aws_conn_id``).

    :param aws_conn_id: the Airflow AWS connection (as ``AwsBaseHook``).
    :param region_name: the region (None: the connection's).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "sqs"
        super().__init__(*args, **kwargs)

    @cached_property
    def sync_client(self) -> Any:
        """boto3, one try per call: the sensor tries again on its next poke, within its budget."""
        from botocore.config import Config

        one_try = (self.config or Config()).merge(
            Config(retries={"mode": "standard", "total_max_attempts": 1})
        )
        with quiet_botocore():  # no "Found credentials/endpoint" INFO lines in the task log
            return self.get_client_type(region_name=self.region_name, config=one_try)

    def queue_url(self, name: str) -> str:
        """GetQueueUrl; ``QueueNotFound`` naming the queue when there is none."""
        try:
            return str(self.sync_client.get_queue_url(QueueName=name)["QueueUrl"])
        except Exception as err:
            if is_missing_queue(err):
                where = self.region_name or "the connection's region"
                raise QueueNotFound(
                    f"SQS queue {name!r} does not exist in {where} (a missing queue is never taken as empty)"
                ) from err
            raise

    def depth(self, url: str) -> QueueDepth:
        try:
            response = self.sync_client.get_queue_attributes(QueueUrl=url, AttributeNames=DEPTH_ATTRIBUTES)
        except Exception as err:
            if is_missing_queue(err):
                return QueueDepth(queue=url, missing=True)
            raise
        return depth_of(url, response.get("Attributes", {}))

    async def aclose(self) -> None:
        if "sync_client" in self.__dict__:
            client = self.__dict__.pop("sync_client")
            await asyncio.to_thread(client.close)

    def _depth_or_error(self, url: str) -> QueueDepth:
        try:
            return self.depth(url)
        except Exception as err:
            return QueueDepth(url, error=err)

    async def depths_async(self, urls: list[str]) -> dict[str, QueueDepth]:
        """GetQueueAttributes once per distinct URL, up to ``MAX_CONCURRENT`` at once, each in a
        worker thread: the event loop never builds the client, sends or parses."""
        await asyncio.to_thread(lambda: self.sync_client)  # built once, off the loop
        gate = asyncio.Semaphore(MAX_CONCURRENT)

        async def one(url: str) -> QueueDepth:
            async with gate:
                return await asyncio.to_thread(self._depth_or_error, url)

        depths = await asyncio.gather(*(one(u) for u in dict.fromkeys(urls)))
        return {d.queue: d for d in depths}


class SqsDepthReader(DepthReader):
    """Queue depths for one AWS connection and region; queues are read by URL.

    :param conn_id: the Airflow AWS connection (None: boto3's default chain).
    :param region: the region queue names are resolved in (None: the connection's).
    """

    provider: ClassVar[str] = "sqs"

    def __init__(self, conn_id: str | None, region: str | None) -> None:
        self.key: Hashable = ("sqs", conn_id, region)
        self.hook = QueueDepthHook(aws_conn_id=conn_id, region_name=region)

    def resolve(self, queue: str) -> str:
        """A URL as is; a name through GetQueueUrl."""
        return queue if is_url(queue) else self.hook.queue_url(queue)

    def read(self, queue: str) -> QueueDepth:
        return self.hook.depth(queue)

    async def read_async(self, queues: list[str]) -> dict[str, QueueDepth]:
        return await self.hook.depths_async(queues)

    async def aclose(self) -> None:
        await self.hook.aclose()

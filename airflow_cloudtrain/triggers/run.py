"""The operator's deferred wait: until the agent writes a final status or the instance ends.

Streams the job's log chunks into the task log as they arrive (the triggerer's log for a deferred
task is the task log). Instance state comes from the shared poll; the run folder is read per run.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.logstream import LogFollower
from airflow_cloudtrain.runs import RunStatus, heartbeat_key, join, split_uri, status_key
from airflow_cloudtrain.triggers.instances import watch_instances
from airflow_cloudtrain.waiting import RunWatch, parse_heartbeat


class AsyncRunFolder:
    """Just enough async reading of a run folder for the trigger (S3 via aiobotocore)."""

    def __init__(self, run_uri: str, cloud: str, conn_id: str | None, region: str | None) -> None:
        self.run_uri = run_uri
        self.scheme, self.bucket, self.prefix = split_uri(run_uri)
        self.cloud, self.conn_id, self.region = cloud, conn_id, region
        self._client: Any = None
        self._folder: Any = None

    def _key(self, key: str) -> str:
        return split_uri(join(self.run_uri, key))[2]

    async def _s3(self) -> Any:
        if self._client is None:
            from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

            hook = CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=self.region)
            self._client = await (await hook.s3_async()).__aenter__()
        return self._client

    async def _gcs_folder(self) -> Any:
        if self._folder is None:
            from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

            self._folder = await asyncio.to_thread(
                CloudTrainGcpHook(gcp_conn_id=self.conn_id or "google_cloud_default").run_folder, self.run_uri
            )
        return self._folder

    async def get(self, key: str) -> bytes | None:
        if self.scheme == "gs":
            folder = await self._gcs_folder()
            return await asyncio.to_thread(folder.get_bytes, key)
        client = await self._s3()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=self._key(key))
        except client.exceptions.NoSuchKey:
            return None
        async with response["Body"] as body:
            return await body.read()

    async def list(self, prefix: str) -> list[str]:
        if self.scheme == "gs":
            folder = await self._gcs_folder()
            return await asyncio.to_thread(folder.list, prefix)
        client = await self._s3()
        base = self._key("")
        keys: list[str] = []
        paginator = client.get_paginator("list_objects_v2")
        async for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(obj["Key"][len(base) :].lstrip("/") for obj in page.get("Contents", []))
        return sorted(keys)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.__aexit__(None, None, None)
            self._client = None


class RunTrigger(BaseTrigger):
    """Waits for one run on one instance; yields ``waiting.outcome`` plus where the logs got to."""

    def __init__(
        self,
        cloud: str,
        instance_id: str,
        run_uri: str,
        conn_id: str | None,
        region: str | None,
        poll_interval: float = 10.0,
        next_log_seq: int = 0,
        deadline: float | None = None,
        project_id: str | None = None,
        launch: dict[str, Any] | None = None,
        startup_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.cloud = cloud
        self.instance_id = instance_id
        self.launch = launch or {}  # the operator's launch record, handed back in the event
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.run_uri = run_uri
        self.conn_id = conn_id
        self.region = region
        self.poll_interval = poll_interval
        self.next_log_seq = next_log_seq
        self.deadline = deadline
        self.project_id = project_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "cloud": self.cloud,
                "instance_id": self.instance_id,
                "run_uri": self.run_uri,
                "conn_id": self.conn_id,
                "region": self.region,
                "poll_interval": self.poll_interval,
                "next_log_seq": self.next_log_seq,
                "deadline": self.deadline,
                "project_id": self.project_id,
                "launch": self.launch,
                "startup_timeout": self.startup_timeout,
                "heartbeat_timeout": self.heartbeat_timeout,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        folder = AsyncRunFolder(self.run_uri, self.cloud, self.conn_id, self.region)
        follower = LogFollower(self.instance_id, self.next_log_seq)
        stream = watch_instances(
            self.cloud, self.conn_id, self.region, [self.instance_id], self.poll_interval, self.project_id
        )
        watch = RunWatch(
            self.deadline, self.launch.get("launched_at"), self.startup_timeout, self.heartbeat_timeout
        )
        event: dict[str, Any] | None = None
        try:
            async with aclosing(stream):
                async for snapshot in stream:
                    event = await self._step(folder, follower, snapshot.get(self.instance_id), watch)
                    if event is not None:
                        break
        except asyncio.CancelledError:
            raise
        except Exception as err:
            event = {
                "status": "error",
                "state": "wait_failed",
                "message": f"waiting for the run failed: {err}",
            }
        finally:
            await folder.close()
        event = event or {"status": "error", "state": "wait_failed", "message": "instance watch ended"}
        event.update(instance_id=self.instance_id, next_log_seq=follower.next_seq, launch=self.launch)
        yield TriggerEvent(event)

    async def _step(self, folder: AsyncRunFolder, follower: LogFollower, instance: Any,
                    watch: RunWatch) -> dict[str, Any] | None:  # fmt: skip
        """One poll: show new log lines, read the status, decide (see ``waiting.RunWatch``)."""
        for line in await follower.apoll(folder.list, folder.get):
            self.log.info("[job] %s", line)
        raw = await folder.get(status_key(self.instance_id))
        beat = await folder.get(heartbeat_key(self.instance_id))
        event = watch.decide(
            RunStatus.from_json(raw.decode()) if raw else None, instance, parse_heartbeat(beat)
        )
        if event is not None:
            for line in await follower.apoll(folder.list, folder.get):  # what the agent wrote last
                self.log.info("[job] %s", line)
            event["instance"] = instance.to_dict() if instance else None
        return event

    async def on_kill(self) -> None:
        """The user killed the deferred task: the instance must not outlive it."""
        if self.cloud in ("ec2", "ec2spot"):
            from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

            await CloudTrainAwsHook(aws_conn_id=self.conn_id, region_name=self.region).terminate_async(
                [self.instance_id]
            )
        else:
            from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

            hook = CloudTrainGcpHook(
                gcp_conn_id=self.conn_id or "google_cloud_default", project_id=self.project_id
            )
            await hook.terminate_async([self.instance_id], zone=self.region)
        self.log.info("Terminated instance %s because the task was killed", self.instance_id)

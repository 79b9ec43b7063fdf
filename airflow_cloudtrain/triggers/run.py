"""The operator's deferred wait: until the agent writes a final status or the instance ends.

Streams the job's log chunks into the task log as they arrive (the triggerer's log for a deferred
task is the task log). Instance state comes from the shared poll; the run folder is read per run.
The decision is ``lifecycle.waiting.RunWatch``, the same one the blocking wait makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cloudtrain.clouds.base import Instance
from airflow_cloudtrain.lifecycle.logstream import LogFollower
from airflow_cloudtrain.lifecycle.records import ERROR, LaunchRecord, Outcome
from airflow_cloudtrain.lifecycle.retry import TransientBudget
from airflow_cloudtrain.lifecycle.waiting import RunWatch, parse_heartbeat
from airflow_cloudtrain.runs import RunStatus, heartbeat_key, join, split_uri, status_key
from airflow_cloudtrain.triggers.instances import watch_instances


class AsyncRunFolder:
    """Just enough async reading of a run folder for the trigger (S3 via aiobotocore)."""

    def __init__(self, run_uri: str, conn_id: str | None, region: str | None) -> None:
        self.run_uri = run_uri
        self.scheme, self.bucket, self.prefix = split_uri(run_uri)
        self.conn_id = conn_id
        self.region = region
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
    """Waits for one run on one instance; yields its ``Outcome`` and where the log got to.

    Kwargs are plain JSON: the ``LaunchRecord`` as a dict, the connection, and the wait settings
    (including the agent watchdog's ``startup_timeout`` / ``heartbeat_timeout``, so a dead agent is
    noticed in deferrable mode exactly as in blocking mode).
    """

    def __init__(
        self,
        launch: dict[str, Any],
        conn_id: str | None,
        project_id: str | None = None,
        poll_interval: float = 10.0,
        deadline: float | None = None,
        startup_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        next_log_seq: int = 0,
    ) -> None:
        super().__init__()
        self.launch = launch
        self.conn_id = conn_id
        self.project_id = project_id
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.next_log_seq = next_log_seq

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "launch": self.launch,
                "conn_id": self.conn_id,
                "project_id": self.project_id,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "startup_timeout": self.startup_timeout,
                "heartbeat_timeout": self.heartbeat_timeout,
                "next_log_seq": self.next_log_seq,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        launch = LaunchRecord.from_dict(self.launch)
        folder = AsyncRunFolder(launch.run_uri, self.conn_id, launch.region)
        follower = LogFollower(launch.instance_id, self.next_log_seq)
        stream = watch_instances(
            launch.cloud,
            self.conn_id,
            launch.location,
            [launch.instance_id],
            self.poll_interval,
            self.project_id,
        )
        watch = RunWatch(self.deadline, launch.launched_at, self.startup_timeout, self.heartbeat_timeout)
        budget = TransientBudget()
        result: Outcome | None = None
        try:
            async with aclosing(stream):
                async for snapshot in stream:
                    try:
                        result = await self._step(folder, follower, snapshot.get(launch.instance_id), watch)
                        budget.ok()
                    except Exception as err:
                        delay = budget.failed(err)  # re-raises when not transient or lasting too long
                        self.log.warning("Transient error reading the run folder (%s); retrying", err)
                        await asyncio.sleep(delay)
                        continue
                    if result is not None:
                        break
        except asyncio.CancelledError:
            raise
        except Exception as err:
            result = Outcome(ERROR, "wait_failed", message=f"waiting for the run failed: {err}")
        finally:
            await folder.close()
        result = result or Outcome(ERROR, "wait_failed", message="instance watch ended")
        yield TriggerEvent(
            {"outcome": result.to_dict(), "launch": self.launch, "next_log_seq": follower.next_seq}
        )

    async def _step(
        self, folder: AsyncRunFolder, follower: LogFollower, instance: Instance | None, watch: RunWatch
    ) -> Outcome | None:
        """One poll: show new log lines, read the status, decide (see ``lifecycle.waiting.RunWatch``)."""
        iid = follower.instance_id
        for line in await follower.apoll(folder.list, folder.get):
            self.log.info("[job] %s", line)
        raw = await folder.get(status_key(iid))
        beat = await folder.get(heartbeat_key(iid))
        result = watch.decide(
            RunStatus.from_json(raw.decode()) if raw else None, instance, parse_heartbeat(beat)
        )
        if result is not None:
            for line in await follower.apoll(folder.list, folder.get):  # what the agent wrote last
                self.log.info("[job] %s", line)
        return result

    async def on_kill(self) -> None:
        """The user killed the deferred task: release the run through its ledger (and tag sweep)."""
        released = await asyncio.to_thread(self._release)
        self.log.info("Released %s because the task was killed", released)

    def _release(self) -> list[str]:
        """As ``RunAttempt.abandon``: the job's end will not be reported, so mark the instance (its
        agent writes ``interrupted`` when terminated) before releasing; retried within ~25 s, the
        time Airflow gives ``on_kill``."""
        from airflow_cloudtrain.clouds.registry import backend_for
        from airflow_cloudtrain.lifecycle.attempt import has_final_status, mark_reported
        from airflow_cloudtrain.lifecycle.ledger import Resource, ResourceLedger
        from airflow_cloudtrain.lifecycle.retry import call_with_retry

        launch = LaunchRecord.from_dict(self.launch)
        backend = backend_for(
            launch.cloud,
            region=launch.region,
            aws_conn_id=self.conn_id,
            gcp_conn_id=self.conn_id or "google_cloud_default",
            project_id=self.project_id,
        )
        try:
            folder = backend.run_folder(launch.run_uri)
            if not has_final_status(folder, launch.instance_id):
                mark_reported(folder, launch.instance_id, launch.try_number, "released", TransientBudget(5.0))
        except Exception as err:  # releasing matters more
            self.log.warning("Could not mark %s before releasing it: %s", launch.instance_id, err)
        ledger = ResourceLedger(
            launch.run_key, entries=[Resource("instance", launch.instance_id, launch.location)]
        )
        budget = TransientBudget(budget_s=25.0, cap_s=5.0)
        released = call_with_retry(lambda: ledger.release(backend, sweep=bool(launch.run_key)), budget)
        return [r.id or "" for r in released]

"""The bucket's live index, polled once per cycle for every run one triggerer waits on.

Each agent keeps one small object per instance in ``<bucket>/_cloudtrain/live/`` (``runs.Beacon``),
rewritten on each change and, byte-identical, on each heartbeat, plus an end marker with its final
status (see ``runs``). So one listing of that prefix per poll (1,000 keys a page) tells, for every
watched run at once: the heartbeat (the beacon's LastModified), whether anything changed (its ETag
on S3, md5Hash on GCS) and whether it ended (the marker). Objects are read only for what changed:
an end marker once, and a changed beacon when that run's log lines are due.

Log lines have their own cadence at scale: at most ``LOG_READS_PER_POLL`` changed beacons are read
per poll, the runs shown longest ago first. With up to that many active runs every run's new lines
reach its task log each poll; with more, each run's lines arrive every ``runs / LOG_READS_PER_POLL``
polls, in order and complete (a beacon carries the last 64 KiB of lines; older chunks are read from
the run folder by key). A run's end is never delayed by this: end markers are read on the poll that
lists them.

The cursor (the next log chunk each run's task log lacks) is saved once per poll for the whole
group, in ``_cloudtrain/cursors/<triggerer>.json``, and when the group ends; a trigger re-created
by a triggerer restart (here or on another triggerer) continues from the highest saved cursor, so
lines are neither repeated nor lost. Everything here blocks: the group calls it in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.runs import (
    Beacon,
    RunStatus,
    beacon_name,
    cursors_uri,
    end_name,
    join,
    live_entry,
    split_uri,
)

LOG_READS_PER_POLL = 250  # beacon reads for log lines per poll and group: about 0.25 CPU-s
STALE_CURSORS_S = 2 * 86400  # a cursor file nobody rewrote for this long is a dead triggerer's
STALE_ENTRY_S = 2 * 86400  # a live entry unchanged this long belongs to a run nobody reported
PRUNE_PER_POLL = 100


@dataclass
class LiveView:
    """What one poll saw of one instance in the live index."""

    listed: bool = False  # the agent has published (it started and reached the bucket)
    beacon_at: float | None = None  # the beacon's LastModified: the agent's last heartbeat or change
    tag: str | None = None  # the beacon's ETag / md5: equal tags, equal contents
    final: RunStatus | None = None  # from the end marker
    beacon: Beacon | None = None  # read on this poll (it changed and its lines were due)
    cursor: int = 0  # the highest saved cursor for this instance (a restarted trigger starts there)


def triggerer_name() -> str:
    """This poll group's cursor file: host, process, and a token per group (a group that ended and
    started again in the same process reads the file of the one before like another's)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class LiveIndex:
    """One live index (``<bucket>/_cloudtrain/live``) seen through one client."""

    def __init__(self, live_uri: str, conn_id: str | None, project_id: str | None = None) -> None:
        self.live_uri = live_uri.rstrip("/")
        self.scheme, self.bucket, self.prefix = split_uri(self.live_uri)
        self.conn_id = conn_id
        self.project_id = project_id
        self.cursor_key = split_uri(join(cursors_uri(self.live_uri), f"{triggerer_name()}.json"))[2]
        self._client: Any = None
        self._lock = threading.Lock()
        self.cursors: dict[str, int] = {}  # instance -> next chunk its task log lacks (this group)
        self.restored: dict[str, int] = {}  # instance -> highest cursor found in saved files
        self.finals: dict[str, RunStatus] = {}
        self.shown: dict[str, tuple[str | None, float]] = {}  # instance -> (tag read, when)
        self.known: set[str] = set()  # instances whose saved cursors were looked up
        self.saved: dict[str, int] = {}

    # -- storage ---------------------------------------------------------------------------------
    def _storage(self) -> Any:
        if self._client is None:
            if self.scheme == "s3":
                from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

                self._client = CloudTrainAwsHook(aws_conn_id=self.conn_id).client("s3")
            else:
                from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook

                hook = CloudTrainGcpHook(
                    gcp_conn_id=self.conn_id or "google_cloud_default", project_id=self.project_id
                )
                self._client = hook.storage_client()
        return self._client

    def _list(self, prefix: str) -> list[tuple[str, str | None, float | None]]:
        """(name under ``prefix``, tag, modified) for every object, a page per 1,000."""
        client = self._storage()
        out: list[tuple[str, str | None, float | None]] = []
        if self.scheme == "s3":
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append((obj["Key"][len(prefix) :], obj.get("ETag"), obj["LastModified"].timestamp()))
            return out
        blobs = client.list_blobs(
            self.bucket, prefix=prefix, fields="items(name,md5Hash,updated),nextPageToken"
        )
        for blob in blobs:
            updated = blob.updated.timestamp() if blob.updated else None
            out.append((blob.name[len(prefix) :], blob.md5_hash, updated))
        return out

    def read_key(self, key: str) -> bytes | None:
        client = self._storage()
        if self.scheme == "s3":
            try:
                return client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except client.exceptions.NoSuchKey:
                return None
        from google.api_core.exceptions import NotFound

        try:
            return client.bucket(self.bucket).blob(key).download_as_bytes()
        except NotFound:
            return None

    def read_uri(self, uri: str) -> bytes | None:
        """An object of the same bucket by full URI (a run folder's log chunk)."""
        scheme, bucket, key = split_uri(uri)
        if (scheme, bucket) != (self.scheme, self.bucket):
            raise ValueError(f"{uri} is not in the live index's bucket {self.scheme}://{self.bucket}")
        return self.read_key(key)

    def _put(self, key: str, data: bytes) -> None:
        client = self._storage()
        if self.scheme == "s3":
            client.put_object(Bucket=self.bucket, Key=key, Body=data)
        else:
            client.bucket(self.bucket).blob(key).upload_from_string(data)

    def _delete(self, key: str) -> None:
        client = self._storage()
        if self.scheme == "s3":
            client.delete_object(Bucket=self.bucket, Key=key)
            return
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            client.bucket(self.bucket).blob(key).delete()

    # -- cursors -------------------------------------------------------------------------------------
    def _load_cursors(self) -> None:
        """Merge every triggerer's saved cursors (the highest wins); drop files of dead triggerers."""
        prefix = split_uri(cursors_uri(self.live_uri))[2] + "/"
        own = self.cursor_key[len(prefix) :]
        now = time.time()
        for name, _tag, modified in self._list(prefix):
            if name == own:
                continue
            if modified is not None and now - modified > STALE_CURSORS_S:
                self._delete(prefix + name)
                continue
            raw = self.read_key(prefix + name)
            try:
                saved = json.loads(raw or b"{}")
            except ValueError:
                continue
            for iid, seq in saved.items():
                if isinstance(seq, int) and seq > self.restored.get(iid, 0):
                    self.restored[iid] = seq

    def advance(self, instance_id: str, next_seq: int) -> None:
        """The trigger showed lines up to ``next_seq``: saved with this poll's cursor file."""
        with self._lock:
            self.cursors[instance_id] = max(next_seq, self.cursors.get(instance_id, 0))

    def forget(self, instance_id: str) -> None:
        """The run's wait is over: its cursor is no longer needed."""
        with self._lock:
            self.cursors.pop(instance_id, None)
            self.restored.pop(instance_id, None)
            self.finals.pop(instance_id, None)
            self.shown.pop(instance_id, None)
            self.known.discard(instance_id)

    def save_cursors(self) -> None:
        """One write per poll for the whole group, only when a cursor moved; none left: delete."""
        with self._lock:
            current = dict(self.cursors)
        if current == self.saved:
            return
        if current:
            self._put(self.cursor_key, json.dumps(current, sort_keys=True).encode())
        else:
            self._delete(self.cursor_key)
        self.saved = current

    # -- the poll ------------------------------------------------------------------------------------
    def poll(self, ids: list[str], now: float | None = None) -> dict[str, LiveView]:
        """One listing; end markers read once; changed beacons read for the runs shown longest ago."""
        now = time.time() if now is None else now
        if set(ids) - self.known:
            self._load_cursors()  # a trigger (re)started: where did its task log get to?
            self.known |= set(ids)
        wanted = set(ids)
        views: dict[str, LiveView] = {}
        ended: list[str] = []
        stale: list[str] = []
        for name, tag, modified in self._list(self.prefix + "/"):
            entry = live_entry(name)
            if entry is None:
                continue
            if entry[0] not in wanted:
                if modified is not None and now - modified > STALE_ENTRY_S:
                    stale.append(name)  # its operator never reported it (killed): keep listings small
                continue
            iid, is_end = entry
            view = views.setdefault(iid, LiveView())
            if is_end:
                ended.append(iid)
            else:
                view.listed, view.tag, view.beacon_at = True, tag, modified
        for iid in ended:
            if iid not in self.finals:
                raw = self.read_key(f"{self.prefix}/{end_name(iid)}")
                if raw:
                    self.finals[iid] = RunStatus.from_json(raw.decode())
            views[iid].final = self.finals.get(iid)
        due = [
            iid
            for iid, view in views.items()
            if view.listed and view.final is None and view.tag != self.shown.get(iid, (None, 0.0))[0]
        ]
        due.sort(key=lambda iid: self.shown.get(iid, (None, 0.0))[1])
        for iid in due[:LOG_READS_PER_POLL]:
            views[iid].beacon = self.read_beacon(iid)
            self.shown[iid] = (views[iid].tag, now)
        for iid, view in views.items():
            view.cursor = self.restored.get(iid, 0)
        self.save_cursors()
        for name in stale[:PRUNE_PER_POLL]:
            self._delete(f"{self.prefix}/{name}")
        return views

    def read_beacon(self, instance_id: str) -> Beacon | None:
        raw = self.read_key(f"{self.prefix}/{beacon_name(instance_id)}")
        return Beacon.from_bytes(raw) if raw else None

    def close(self) -> None:
        """The group ended: save the cursors of runs still waited on (a triggerer restart continues
        from them), then close the client."""
        try:
            self.save_cursors()
        finally:
            client, self._client = self._client, None
            if client is not None and hasattr(client, "close"):
                client.close()

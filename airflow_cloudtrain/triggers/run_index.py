"""The bucket's live index, polled once per cycle for every run one triggerer waits on.

Each agent keeps a small object per instance in ``<bucket>/_cloudtrain/live/`` (``runs.Beacon``),
rewritten on each change, a ``.beat`` object rewritten on each heartbeat, and at the end an end
marker with its final status (see ``runs``). So one listing of that prefix per poll (1,000 keys a
page) tells, for every watched run at once: the heartbeat (the beat's LastModified), whether
anything changed (the beacon's ETag on S3, md5Hash on GCS) and whether it ended (the marker). Objects are read only for what changed:
an end marker once, and a changed beacon when that run's log lines are due.

The listing runs every couple of seconds (``triggers.run.END_POLL_S``) so an end reaches its task
fast; a run's log lines keep its own ``poll_interval`` (``log_every``), and at scale at most
``LOG_READS_PER_POLL`` changed beacons are read per poll, the runs shown longest ago first. With up to that many active runs every run's new lines
reach its task log each poll; with more, each run's lines arrive every ``runs / LOG_READS_PER_POLL``
polls, in order and complete (a beacon carries the last 64 KiB of lines; older chunks are read from
the run folder by key). A run's end is never delayed by this: end markers are read on the poll that
lists them.

The cursor (the next log chunk each run's task log lacks) is saved once per poll for the whole
group, in ``_cloudtrain/cursors/<triggerer>.json``, and when the group ends; a trigger re-created
by a triggerer restart (here or on another triggerer) continues from the highest saved cursor. A
restart that stops triggers (as the triggerer does on SIGTERM) neither repeats nor loses a line; a
triggerer killed outright repeats at most the lines shown since its last poll. Everything here
blocks: the group calls it in a worker thread; the trigger moves its cursor from the loop, so the
shared tables are guarded by a lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.runs import (
    BEACON,
    END,
    Beacon,
    RunStatus,
    beacon_name,
    cursors_uri,
    end_name,
    join,
    live_entry,
    split_uri,
)

log = logging.getLogger(__name__)

LOG_READS_PER_POLL = 250  # beacon reads for log lines per poll and group: about 0.25 CPU-s
STALE_CURSORS_S = 2 * 86400  # a cursor file nobody rewrote for this long is a dead triggerer's
STALE_ENTRY_S = 2 * 86400  # a live entry unchanged this long belongs to a run nobody reported
PRUNE_PER_POLL = 100
# instance -> how often its trigger wants its lines (its poll_interval); set by the trigger while it
# waits: every trigger of a group sees the same process-wide table
LOG_EVERY: dict[str, float] = {}
CURSOR_KEEP_S = 3600  # a cursor outlives its watcher this long (a restart re-creates the trigger)
CURSORS_REFRESH_S = 6 * 3600  # the cursor file is rewritten at least this often, changed or not


@dataclass
class LiveView:
    """What one poll saw of one instance in the live index."""

    listed: bool = False  # the agent has published (it started and reached the bucket)
    beacon_at: float | None = None  # the newest LastModified of its entries: its last beat or change
    tag: str | None = None  # the beacon's ETag / md5: equal tags, equal contents
    final: RunStatus | None = None  # from the end marker
    beacon: Beacon | None = None  # read on this poll (it changed and its lines were due)
    cursor: int = 0  # the highest saved cursor for this instance (a restarted trigger starts there)
    status: RunStatus | None = None  # a run folder's status.json (runs without a live index only)


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
        self.saved_at = 0.0
        self.seen: dict[str, float] = {}  # instance -> when a poll last had a watcher for it

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
    def _load_cursors(self, new: set[str]) -> None:
        """For instances just joined: the highest cursor any triggerer saved (a trigger re-created
        after a restart, here or elsewhere). Files of dead triggerers are dropped."""
        prefix = split_uri(cursors_uri(self.live_uri))[2] + "/"
        own = self.cursor_key[len(prefix) :]
        now = time.time()
        found: dict[str, int] = {}
        for name, _tag, modified in self._list(prefix):
            if name == own:
                continue
            if modified is not None and now - modified > STALE_CURSORS_S:
                self._best_effort(f"deleting the stale cursor file {name}", self._delete, prefix + name)
                continue
            try:
                saved = json.loads(self.read_key(prefix + name) or b"{}")
            except ValueError:
                continue
            for iid, seq in saved.items():
                if iid in new and isinstance(seq, int) and seq > found.get(iid, 0):
                    found[iid] = seq
        with self._lock:
            self.restored.update(found)

    def advance(self, instance_id: str, next_seq: int, tag: str | None) -> None:
        """The trigger showed the lines of the beacon with ``tag``, up to chunk ``next_seq``: that
        beacon is not read again, and the cursor goes into this poll's cursor file."""
        with self._lock:
            self.cursors[instance_id] = max(next_seq, self.cursors.get(instance_id, 0))
            self.shown[instance_id] = (tag, time.time())

    def forget(self, instance_id: str) -> None:
        """The run's wait is over: its cursor is no longer needed."""
        with self._lock:
            for table in (self.cursors, self.restored, self.finals, self.shown, self.seen):
                table.pop(instance_id, None)
            self.known.discard(instance_id)

    def _drop_unwatched(self, wanted: set[str], now: float) -> None:
        """State of instances no trigger waits on any more (killed, timed out, moved): dropped at
        once, except their cursors, kept ``CURSOR_KEEP_S`` (a triggerer stopping cancels its triggers
        one by one: the last poll must still save every cursor)."""
        with self._lock:
            for iid in wanted:
                self.seen[iid] = now
            for table in (self.restored, self.finals, self.shown):
                for iid in [i for i in table if i not in wanted]:
                    del table[iid]
            self.known &= wanted
            for iid in [i for i, at in self.seen.items() if i not in wanted and now - at > CURSOR_KEEP_S]:
                self.cursors.pop(iid, None)
                del self.seen[iid]

    def save_cursors(self) -> None:
        """One write per poll for the whole group when a cursor moved (and at least every
        ``CURSORS_REFRESH_S``, so a live triggerer's file never looks stale); none left: delete."""
        with self._lock:
            current = dict(self.cursors)
        if current == self.saved and time.time() - self.saved_at < CURSORS_REFRESH_S:
            return
        if current:
            self._put(self.cursor_key, json.dumps(current, sort_keys=True).encode())
        elif self.saved:
            self._delete(self.cursor_key)
        self.saved, self.saved_at = current, time.time()

    def _best_effort(self, what: str, fn: Any, *args: Any) -> None:
        """Housekeeping never fails the watch of every run in the bucket."""
        try:
            fn(*args)
        except Exception as err:
            log.warning("Live index %s: %s failed: %s", self.live_uri, what, err)

    # -- the poll ------------------------------------------------------------------------------------
    def poll(self, ids: list[str], now: float | None = None) -> dict[str, LiveView]:
        """One listing; end markers read once; changed beacons read for the runs shown longest ago.

        A listing error is the poll's (the shared poll retries transient ones); an unreadable end
        marker or beacon only affects its own run, and cursor saves and pruning are best effort."""
        now = time.time() if now is None else now
        wanted = set(ids)
        self._drop_unwatched(wanted, now)
        new = wanted - self.known
        if new:
            self._load_cursors(new)  # a trigger (re)started: where did its task log get to?
            with self._lock:
                self.known |= new
        views: dict[str, LiveView] = {}
        stale: list[str] = []
        for name, tag, modified in self._list(self.prefix + "/"):
            entry = live_entry(name)
            if entry is None:
                continue
            iid, kind = entry
            if iid not in wanted:
                if modified is not None and now - modified > STALE_ENTRY_S:
                    stale.append(name)  # its operator never reported it (killed): keep listings small
                continue
            view = views.setdefault(iid, LiveView())
            view.listed = True
            if modified is not None:
                view.beacon_at = max(view.beacon_at or 0.0, modified)
            if kind == END:
                view.final = self._final(iid)
            elif kind == BEACON:
                view.tag = tag or f"modified:{modified}"  # no ETag / md5: the time tells a change
        with self._lock:
            shown = dict(self.shown)
            restored = dict(self.restored)
            log_every = dict(LOG_EVERY)
        due = [
            iid
            for iid, view in views.items()
            if view.tag is not None
            and view.final is None
            and view.tag != shown.get(iid, (None, 0.0))[0]
            and now - shown.get(iid, (None, 0.0))[1] >= log_every.get(iid, 0.0) - 0.05
        ]
        due.sort(key=lambda iid: shown.get(iid, (None, 0.0))[1])
        for iid in due[:LOG_READS_PER_POLL]:
            views[iid].beacon = self.read_beacon(iid)
        for iid, view in views.items():
            view.cursor = restored.get(iid, 0)
        self._best_effort("saving the log cursors", self.save_cursors)
        for name in stale[:PRUNE_PER_POLL]:
            self._best_effort(f"removing the stale entry {name}", self._delete, f"{self.prefix}/{name}")
        return views

    def _final(self, instance_id: str) -> RunStatus | None:
        with self._lock:
            if instance_id in self.finals:
                return self.finals[instance_id]
        try:
            raw = self.read_key(f"{self.prefix}/{end_name(instance_id)}")
            final = RunStatus.from_json(raw.decode()) if raw else None
        except (ValueError, TypeError) as err:
            log.warning("Unreadable end marker of %s in %s: %s", instance_id, self.live_uri, err)
            return None
        if final is not None:
            with self._lock:
                self.finals[instance_id] = final
        return final

    def read_beacon(self, instance_id: str) -> Beacon | None:
        """The beacon, or None when it is missing or unreadable (a run's own problem, not the
        group's: its trigger still has the end marker, the heartbeat and the instance)."""
        raw = self.read_key(f"{self.prefix}/{beacon_name(instance_id)}")
        try:
            return Beacon.from_bytes(raw) if raw else None
        except (ValueError, TypeError) as err:
            log.warning("Unreadable beacon of %s in %s: %s", instance_id, self.live_uri, err)
            return None

    def close(self) -> None:
        """The group ended: save the cursors of runs still waited on (a triggerer restart continues
        from them), then close the client."""
        try:
            self._best_effort("saving the log cursors", self.save_cursors)
        finally:
            client, self._client = self._client, None
            if client is not None and hasattr(client, "close"):
                client.close()

"""The bucket's live index, polled for every run one triggerer waits on.

Each agent keeps a small object per instance in ``<bucket>/_cloudtrain/live/`` (``runs.Beacon``),
rewritten on each change, a ``.beat`` object rewritten on each heartbeat, and at the end an end
marker with its final status in ``ended/`` (see ``runs``). Two listings, two cadences:

- every couple of seconds (``triggers.run.END_POLL_S``), the ``ended/`` folder: it holds only the
  runs that just ended, so it is one small request at any number of runs, and a run's end reaches
  its task within about that. A new end marker is read at once, and the run's final beacon with it
  (its last lines), in the same worker: an end never waits behind log reads.
- every poll interval (the smallest ``poll_interval`` of the runs watched, ``LOG_EVERY``), the whole
  folder, a page per 1,000 keys: the heartbeat of every run (the beat's LastModified), whether
  anything changed (the beacon's ETag on S3, md5Hash on GCS). The changed beacons are then read by
  the index's own reader thread, longest-unshown first, at most ``LOG_READS_PER_ROUND`` and about
  ``LOG_READ_CPU_SHARE`` of one core per round (``log_read_budget``); what it read reaches the
  triggers with the next poll. With up to a couple of hundred chatty runs in one triggerer each
  run's new lines reach its task log every poll interval; with more, every few poll intervals, in
  order and complete (a beacon carries the last 64 KiB of lines; older chunks are read from the
  run folder by key). That budget never delays an end.

The cursor (the next log chunk each run's task log lacks) is saved once per poll interval for the
whole group, in ``_cloudtrain/cursors/<triggerer>.json``, and when the group ends; a trigger
re-created by a triggerer restart (here or on another triggerer) continues from the highest saved
cursor. A restart that stops triggers (as the triggerer does on SIGTERM) neither repeats nor loses
a line; a triggerer killed outright repeats at most the lines shown since its last save.
Everything here blocks: the group calls ``poll`` in the index's own worker thread (not the event
loop's default executor, which a thousand triggers share); the trigger moves its cursor from the
loop, so the shared tables are guarded by a lock.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.contract.runs import (
    BEACON,
    END,
    ENDED_FOLDER,
    Beacon,
    RunStatus,
    beacon_name,
    cursors_uri,
    join,
    live_entry,
    split_uri,
)
from airflow_cloudtrain.core.provider import LiveStore, Provider
from airflow_cloudtrain.triggers.leases import LeaseBook

log = logging.getLogger(__name__)

LOG_READS_PER_ROUND = 250  # beacon reads for log lines per poll interval and group, at most
# and the reader's CPU per round, as a share of the poll interval: 3.5 % of one core (0.35 CPU-s at
# a 10 s interval, about 150 beacon reads), at least LOG_READ_MIN_CPU_S; and half the interval of
# wall time, so a busy machine reads fewer instead of falling behind
LOG_READ_CPU_SHARE = 0.035
LOG_READ_MIN_CPU_S = 0.1
LOG_READ_WALL_SHARE = 0.5
END_READERS = 4  # threads reading the final beacons of runs that just ended
STALE_CURSORS_S = 2 * 86400  # a cursor file nobody rewrote for this long is a dead triggerer's
STALE_ENTRY_S = 2 * 86400  # a live entry unchanged this long belongs to a run nobody reported
PRUNE_PER_POLL = 100
# instance -> how often its trigger wants its lines (its poll_interval); set by the trigger while it
# waits: every trigger of a group sees the same process-wide table
LOG_EVERY: dict[str, float] = {}
CURSOR_KEEP_S = 3600  # a cursor outlives its watcher this long (a restart re-creates the trigger)
CURSORS_REFRESH_S = 6 * 3600  # the cursor file is rewritten at least this often, changed or not


def log_read_budget(interval: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) the reader may spend on one round of beacon reads."""
    return max(LOG_READ_MIN_CPU_S, LOG_READ_CPU_SHARE * interval), LOG_READ_WALL_SHARE * interval


@dataclass
class Entry:
    """One instance in the last listing of the whole live index."""

    tag: str | None = None  # its beacon's ETag / md5
    at: float | None = None  # the newest LastModified of its entries: its last beat or change
    end: str | None = None  # its end marker's key under the index, when listed


@dataclass
class LiveView:
    """What one poll saw of one instance in the live index."""

    listed: bool = False  # the agent has published (it started and reached the bucket)
    beacon_at: float | None = None  # the newest LastModified of its entries: its last beat or change
    tag: str | None = None  # the ETag / md5 of ``beacon`` if one was read, else of the listed one
    final: RunStatus | None = None  # from the end marker
    beacon: Beacon | None = None  # read for the trigger (changed, lines due; or the final one)
    cursor: int = 0  # the highest saved cursor for this instance (a restarted trigger starts there)
    status: RunStatus | None = None  # a run folder's status.json (runs without a live index only)


def triggerer_name() -> str:
    """This poll group's cursor file: host, process, and a token per group (a group that ended and
    started again in the same process reads the file of the one before like another's)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class LiveIndex:
    """One live index (``<bucket>/_cloudtrain/live``) seen through one client.

    :param live_uri: the index's URI (``s3://bucket/_cloudtrain/live``, ``gs://...``): its scheme
        picks the provider (``clouds.registry.provider_for_scheme``).
    :param conn_id: the provider's Airflow connection (None: the provider's default).
    :param project_id: the Google project for a ``gs://`` index (None: the connection's).
    """

    def __init__(self, live_uri: str, conn_id: str | None, project_id: str | None = None) -> None:
        self.live_uri = live_uri.rstrip("/")
        self.scheme, self.bucket, self.prefix = split_uri(self.live_uri)
        self.conn_id = conn_id
        self.project_id = project_id
        self.cursor_key = split_uri(join(cursors_uri(self.live_uri), f"{triggerer_name()}.json"))[2]
        from airflow_cloudtrain.clouds.registry import provider_for_scheme
        from airflow_cloudtrain.hooks.follow import Following

        # the bucket's store (the provider's ``LiveStore``: S3 or GCS, picked by the registry from
        # the URI's scheme), made anew when the connection changed (``hooks.follow``: checked once a
        # minute and after a failed poll): a group lives as long as runs keep deferring
        self.provider: Provider = provider_for_scheme(self.scheme)
        self._clients: Following[LiveStore] = Following(
            self.provider.conn(conn_id), self._new_client, _close_client
        )
        self._lock = threading.Lock()
        self.cursors: dict[str, int] = {}  # instance -> next chunk its task log lacks (this group)
        self.restored: dict[str, int] = {}  # instance -> highest cursor found in saved files
        self.finals: dict[str, RunStatus] = {}
        self.shown: dict[str, tuple[str | None, float]] = {}  # instance -> (tag read, when)
        self.known: set[str] = set()  # instances whose saved cursors were looked up
        self.saved: dict[str, int] = {}
        self.saved_at = 0.0
        self.seen: dict[str, float] = {}  # instance -> when a poll last had a watcher for it
        self.entries: dict[str, Entry] = {}  # the last listing of the whole index, every instance
        self.listed_at: float | None = None  # when that was
        self.ended: dict[str, str] = {}  # instance -> its end marker's key, from the ``ended/`` listing
        self.ready: dict[str, tuple[Beacon, str | None]] = {}  # read for the trigger: (beacon, tag)
        self.final_beacons: dict[str, Beacon] = {}  # read with the end marker
        self.views: dict[str, LiveView] = {}  # the last view of each instance (only the poll's thread)
        self.rounds = 0  # reader rounds finished (tests, the benchmark)
        self.reads_left = 0  # beacons due but not read in the last round (over its budget)
        # poll runs in ``executor``; the beacon reads of a round in ``_reader``, one round at a time,
        # so that ends (listed by the next poll meanwhile) never wait behind them
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="cloudtrain-live-index")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="cloudtrain-live-logs")
        self._end_reader = ThreadPoolExecutor(END_READERS, thread_name_prefix="cloudtrain-live-ends")
        self._reading: Future[None] | None = None
        self._closing = False
        # the watched runs' leases, renewed when due in a thread of their own (``triggers.leases``)
        self.leases = LeaseBook(self.scheme, self.bucket, self._put)

    # -- storage ---------------------------------------------------------------------------------
    def _storage(self) -> LiveStore:
        return self._clients.get()

    def _new_client(self) -> LiveStore:
        return self.provider.live_store(self.conn_id, self.project_id, self.bucket)

    def _list(self, prefix: str) -> list[tuple[str, str | None, float | None]]:
        """(name under ``prefix``, tag, modified) for every object, a page per 1,000."""
        return self._storage().listing(prefix)

    def read_key(self, key: str) -> bytes | None:
        return self._storage().read(key)

    def read_uri(self, uri: str) -> bytes | None:
        """An object of the same bucket by full URI (a run folder's log chunk)."""
        scheme, bucket, key = split_uri(uri)
        if (scheme, bucket) != (self.scheme, self.bucket):
            raise ValueError(f"{uri} is not in the live index's bucket {self.scheme}://{self.bucket}")
        return self.read_key(key)

    def _put(self, key: str, data: bytes) -> None:
        self._storage().put(key, data)

    def _delete(self, key: str) -> None:
        self._storage().delete(key)

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
        beacon is not read again, and the cursor goes into the next cursor file."""
        with self._lock:
            self.cursors[instance_id] = max(next_seq, self.cursors.get(instance_id, 0))
            self.shown[instance_id] = (tag, time.time())
            ready = self.ready.get(instance_id)
            if ready is not None and ready[1] == tag:
                del self.ready[instance_id]

    def forget(self, instance_id: str) -> None:
        """The run's wait is over: its cursor is no longer needed."""
        with self._lock:
            for table in (
                self.cursors,
                self.restored,
                self.finals,
                self.shown,
                self.seen,
                self.ready,
                self.views,
            ):
                table.pop(instance_id, None)
            self.final_beacons.pop(instance_id, None)
            self.known.discard(instance_id)
        self.leases.forget(instance_id)

    def _drop_unwatched(self, wanted: set[str], now: float) -> None:
        """State of instances no trigger waits on any more (killed, timed out, moved): dropped at
        once, except their cursors, kept ``CURSOR_KEEP_S`` (a triggerer stopping cancels its triggers
        one by one: the last poll must still save every cursor)."""
        with self._lock:
            for iid in wanted:
                self.seen[iid] = now
            for table in (self.restored, self.finals, self.shown, self.ready, self.final_beacons, self.views):
                for iid in [i for i in table if i not in wanted]:
                    del table[iid]
            self.known &= wanted
            for iid in [i for i, at in self.seen.items() if i not in wanted and now - at > CURSOR_KEEP_S]:
                self.cursors.pop(iid, None)
                del self.seen[iid]

    def save_cursors(self) -> None:
        """One write per poll interval for the whole group when a cursor moved (and at least every
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
        """``_poll``; a failed one makes the next re-read the connection first."""
        try:
            return self._poll(ids, now)
        except Exception:
            self._clients.failed()
            raise

    def _poll(self, ids: list[str], now: float | None = None) -> dict[str, LiveView]:
        """What the triggers of ``ids`` need after this poll. One listing: the whole index when a
        poll interval passed since the last (then the due beacons go to the reader), else only
        ``ended/``. New end markers are read at once, with their final beacons.

        A listing error is the poll's (the shared poll retries transient ones); an unreadable end
        marker or beacon only affects its own run, and cursor saves and pruning are best effort."""
        now = time.time() if now is None else now
        wanted = set(ids)
        self._drop_unwatched(wanted, now)
        if not self._closing:
            self.leases.start_round(wanted)  # the due leases, in the lease thread (real time)
        new = wanted - self.known
        if new:
            self._load_cursors(new)  # a trigger (re)started: where did its task log get to?
            with self._lock:
                self.known |= new
        with self._lock:
            interval = min((LOG_EVERY.get(i, 0.0) for i in wanted), default=0.0)
        whole = self.listed_at is None or now - self.listed_at >= interval - 0.05
        if whole:
            self._list_whole(wanted, now)
        else:
            self._list_ended()
        entries, ended = self.entries, dict(self.ended)
        for iid, entry in entries.items():
            if entry.end is not None:
                ended.setdefault(iid, entry.end)
        fresh = sorted(i for i in wanted & ended.keys() if i not in self.finals)
        # the new ends' reads side by side: a burst of ends must not hold the next poll's listing
        list(self._end_reader.map(lambda iid: self._final(iid, ended[iid]), fresh))
        with self._lock:
            ready, restored = dict(self.ready), dict(self.restored)
            finals, final_beacons = dict(self.finals), dict(self.final_beacons)
        views: dict[str, LiveView] = {}
        for iid in wanted:
            listed, final = entries.get(iid), finals.get(iid)
            if listed is None and final is None:
                continue
            view = views[iid] = LiveView(listed=True, cursor=restored.get(iid, 0), final=final)
            if listed is not None:
                view.beacon_at, view.tag = listed.at, listed.tag
            if final is not None:
                view.beacon = final_beacons.get(iid)
            elif iid in ready:
                view.beacon, view.tag = ready[iid]
            last = self.views.get(iid)
            if last == view:
                views[iid] = last  # the same object: its trigger is not woken for it (shared_poll)
            else:
                self.views[iid] = view
        if whole:
            self._start_round(wanted, interval, now)
            self._best_effort("saving the log cursors", self.save_cursors)
        return views

    def _list_whole(self, wanted: set[str], now: float) -> None:
        """The whole index: every instance's entry (watched here or not), stale ones pruned."""
        entries: dict[str, Entry] = {}
        stale: list[str] = []
        for name, tag, modified in self._list(self.prefix + "/"):
            parsed = live_entry(name)
            if parsed is None:
                continue
            iid, kind = parsed
            if iid not in wanted and modified is not None and now - modified > STALE_ENTRY_S:
                stale.append(name)  # its operator never reported it (killed): keep listings small
                continue
            entry = entries.setdefault(iid, Entry())
            if modified is not None:
                entry.at = max(entry.at or 0.0, modified)
            if kind == END:
                entry.end = name
            elif kind == BEACON:
                entry.tag = tag or f"modified:{modified}"  # no ETag / md5: the time tells a change
        self.entries, self.listed_at = entries, now
        self.ended = {iid: e.end for iid, e in entries.items() if e.end is not None}
        for name in stale[:PRUNE_PER_POLL]:
            self._best_effort(f"removing the stale entry {name}", self._delete, f"{self.prefix}/{name}")

    def _list_ended(self) -> None:
        """Only ``ended/``: the runs that just ended (their operators remove the markers)."""
        ended: dict[str, str] = {}
        for name, _tag, _modified in self._list(f"{self.prefix}/{ENDED_FOLDER}/"):
            parsed = live_entry(f"{ENDED_FOLDER}/{name}")
            if parsed is not None:
                ended[parsed[0]] = f"{ENDED_FOLDER}/{name}"
        self.ended = ended

    def _start_round(self, wanted: set[str], interval: float, now: float) -> None:
        """Hand the changed beacons whose lines are due to the reader, unless it is still busy
        with the last round (then the next poll interval's listing brings them again)."""
        if self._reading is not None and not self._reading.done():
            return
        with self._lock:
            shown, log_every, ready = dict(self.shown), dict(LOG_EVERY), set(self.ready)
        never = (None, 0.0)
        due: list[tuple[str, str | None]] = [
            (iid, entry.tag)
            for iid, entry in self.entries.items()
            if iid in wanted
            and entry.tag is not None
            and entry.end is None
            and iid not in self.finals
            and iid not in ready
            and entry.tag != shown.get(iid, never)[0]
            and now - shown.get(iid, never)[1] >= log_every.get(iid, 0.0) - 0.05
        ]
        if not due:
            self.reads_left = 0
            return
        due.sort(key=lambda item: shown.get(item[0], never)[1])
        self._reading = self._reader.submit(self._read_round, due, interval)

    def _read_round(self, due: list[tuple[str, str | None]], interval: float) -> None:
        """Read the beacons ``due`` (longest-unshown first) within the round's budget."""
        cpu_budget, wall_budget = log_read_budget(interval)
        cpu0, wall0 = time.thread_time(), time.monotonic()
        done = 0
        for iid, tag in due[:LOG_READS_PER_ROUND]:
            if self._closing:
                break
            if time.thread_time() - cpu0 >= cpu_budget or time.monotonic() - wall0 >= wall_budget:
                break
            try:
                beacon = self.read_beacon(iid)
            except Exception as err:  # the round's (a transient storage error): the next round
                log.warning("Live index %s: reading beacons failed: %s", self.live_uri, err)
                break
            done += 1
            if beacon is None:
                continue
            with self._lock:
                if iid in self.seen:  # still watched
                    self.ready[iid] = (beacon, tag)
        self.reads_left = len(due) - done
        self.rounds += 1

    def _final(self, instance_id: str, key: str) -> RunStatus | None:
        """The run's final status, read once: from its final beacon, written just before the end
        marker ``key`` (one read, and the last lines with it); from the marker only when that beacon
        is not final (an unreadable one, or an earlier agent's)."""
        with self._lock:
            if instance_id in self.finals:
                return self.finals[instance_id]
        beacon = self.read_beacon(instance_id)
        if beacon is not None and beacon.run_status().final:
            final: RunStatus | None = beacon.run_status()
        else:
            beacon = None
            try:
                raw = self.read_key(f"{self.prefix}/{key}")
                final = RunStatus.from_json(raw.decode()) if raw else None
            except (ValueError, TypeError) as err:
                log.warning("Unreadable end marker of %s in %s: %s", instance_id, self.live_uri, err)
                return None
        if final is None:
            return None
        with self._lock:
            self.finals[instance_id] = final
            if beacon is not None:
                self.final_beacons[instance_id] = beacon
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
        """The group ended: stop the reader, save the cursors of runs still waited on (a triggerer
        restart continues from them), then close the client."""
        self._closing = True
        try:
            self._reader.shutdown(wait=True)
            self.executor.shutdown(wait=True)
            self._end_reader.shutdown(wait=True)
            self.leases.close()
            self._best_effort("saving the log cursors", self.save_cursors)
        finally:
            self._clients.close()


def _close_client(store: LiveStore) -> None:
    store.close()

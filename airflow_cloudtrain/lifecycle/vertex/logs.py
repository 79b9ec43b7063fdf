"""Follow a Vertex job's Cloud Logging entries into the task log: in order, each line once, across
triggerer restarts and task retries.

Entries are read with ``entries:list`` (``resource.type="ml_job"``, the job's numeric id), oldest first.
Cloud Logging can index an entry a little after later ones, so each read starts ``LATE_S`` (60 s) before
the newest timestamp shown and skips the ``insertId``s already shown in that window: a line indexed up
to a minute late still appears (after the lines around it), and none appears twice. After the job's end
the log is read until a read brings nothing new (at most ``DRAIN_S``), for the last lines -- often the
failure's traceback -- that Cloud Logging indexes after the job ended.

Reading the log never fails the task nor cancels the job (``LogStream``): a transient error is retried
on the next read, any other (no Logs Viewer permission, say) stops the streaming with a warning, and
the job goes on. The cursor (newest timestamp shown and the
window's ids) is saved in the job folder (``_cloudtrain/jobs/<numeric id>/log_cursor.json``) after each
batch is shown, so a re-created trigger or a retried task that re-attaches goes on where the last one
stopped. A trigger cannot update its own kwargs and the triggerer has no ``task_state_store``, so the
job folder is the one place both the worker and the triggerer can write. Saving after showing means a
triggerer killed between the two shows that one batch again; saving first could lose it instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

LATE_S = 60.0  # how far back each read looks for lines indexed late
DRAIN_S = 30.0  # after the job's end: keep reading while lines still arrive, at most this long
MAX_PAGES = 20  # pages (of 1,000 entries) per read: a very chatty job catches up over several polls
_FRACTION = re.compile(r"\.(\d+)")


def parse_time(text: str) -> datetime:
    """RFC 3339 with any number of fraction digits (Cloud Logging writes nanoseconds) -> aware datetime."""
    text = text.replace("Z", "+00:00")
    text = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    return datetime.fromisoformat(text)


def cursor_key(numeric_id: str) -> str:
    return f"_cloudtrain/jobs/{numeric_id}/log_cursor.json"


@dataclass
class LogLine:
    when: datetime
    replica: str  # workerpool0-0, ... ("service" for Vertex's own messages)
    text: str
    severity: str = "INFO"

    def render(self) -> str:
        stamp = self.when.astimezone(timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        return f"[{self.replica} {stamp}] {self.text}"


@dataclass
class LogCursor:
    newest: str | None = None  # RFC 3339 of the newest entry shown
    seen: dict[str, str] = field(default_factory=dict)  # insertId -> timestamp, within LATE_S of newest

    def to_dict(self) -> dict[str, Any]:
        return {"newest": self.newest, "seen": self.seen}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LogCursor:
        data = data or {}
        return cls(data.get("newest"), dict(data.get("seen") or {}))


def entry_line(entry: dict[str, Any]) -> LogLine:
    labels = (entry.get("resource") or {}).get("labels") or {}
    text = entry.get("textPayload")
    if text is None:
        payload = entry.get("jsonPayload") or {}
        text = (
            payload.get("message")
            if isinstance(payload, dict) and "message" in payload
            else json.dumps(payload)
        )
    return LogLine(
        parse_time(entry.get("timestamp") or "1970-01-01T00:00:00Z"),
        str(labels.get("task_name") or "service"),
        str(text).rstrip("\n"),
        str(entry.get("severity") or "INFO"),
    )


class JobLogTail:
    """New lines of one job since the cursor. Blocking (one HTTP call per page): the trigger runs
    ``poll`` in a worker thread."""

    def __init__(self, hook: Any, numeric_id: str, folder: RunFolder | None = None) -> None:
        self.hook = hook  # a VertexHook (list_log_entries)
        self.numeric_id = numeric_id
        self.folder = folder  # the job folder (RunFolder) holding the cursor; None: not persisted
        self.cursor = LogCursor()
        if folder is not None:
            raw = folder.get_text(cursor_key(numeric_id))
            if raw:
                self.cursor = LogCursor.from_dict(json.loads(raw))

    def _filter(self) -> str:
        clauses = ['resource.type="ml_job"', f'resource.labels.job_id="{self.numeric_id}"']
        if self.cursor.newest:
            since = parse_time(self.cursor.newest) - timedelta(seconds=LATE_S)
            clauses.append(f'timestamp>="{since.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}"')
        return " AND ".join(clauses)

    def poll(self) -> list[LogLine]:
        """Lines not shown yet, oldest first; the cursor moves past them (``commit`` saves it)."""
        entries: list[dict[str, Any]] = []
        token: str | None = None
        filter_ = self._filter()
        for _ in range(MAX_PAGES):
            page, token = self.hook.list_log_entries(filter_, token)
            entries.extend(page)
            if not token:
                break
        fresh = [e for e in entries if str(e.get("insertId")) not in self.cursor.seen]
        lines = []
        for entry in fresh:
            stamp = entry.get("timestamp") or "1970-01-01T00:00:00Z"
            self.cursor.seen[str(entry.get("insertId"))] = stamp
            if self.cursor.newest is None or parse_time(stamp) > parse_time(self.cursor.newest):
                self.cursor.newest = stamp
            lines.append(entry_line(entry))
        if self.cursor.newest:  # forget ids older than the window: the next read never returns them
            floor = parse_time(self.cursor.newest) - timedelta(seconds=LATE_S)
            self.cursor.seen = {k: v for k, v in self.cursor.seen.items() if parse_time(v) >= floor}
        return lines

    def commit(self) -> None:
        """Save the cursor in the job folder (after the lines were shown)."""
        if self.folder is not None:
            self.folder.put_text(cursor_key(self.numeric_id), json.dumps(self.cursor.to_dict()))


class LogStream:
    """When to read a job's log, and what a failed read does: lines are a courtesy, never a reason to
    fail the wait (which would cancel the job). Shared by the blocking wait and the trigger."""

    def __init__(self, log: logging.Logger, interval: float) -> None:
        self.log = log
        self.interval = interval
        self.tail: JobLogTail | None = None
        self.next_at = 0.0
        self.broken = False

    def due(self) -> bool:
        return self.tail is not None and not self.broken and time.monotonic() >= self.next_at

    def _failed(self, err: Exception) -> None:
        from airflow_cloudtrain.core.retry import is_transient

        if is_transient(err):
            self.log.warning("Reading the job's log failed (%s); trying again later", err)
            self.next_at = time.monotonic() + max(self.interval, 5.0)
            return
        self.broken = True
        self.log.warning(
            "Not streaming the job's log any more: %s. The job goes on; its log is in the console and "
            "in `cloudtrain jobs logs`",
            err,
        )

    def guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when the log is broken or the call failed (handled as above)."""
        if self.broken:
            return None
        try:
            value = fn(*args)
        except Exception as err:
            self._failed(err)
            return None
        self.next_at = time.monotonic() + self.interval
        return value

    async def aguard(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        if self.broken:
            return None
        try:
            value = await fn(*args)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._failed(err)
            return None
        self.next_at = time.monotonic() + self.interval
        return value

    def drain(self, read: Callable[[], int]) -> None:
        """After the end: read until nothing new comes (``read`` returns how many lines it showed)."""
        deadline = time.monotonic() + DRAIN_S
        while self.tail is not None and self.guard(read) and time.monotonic() < deadline:
            time.sleep(1.0)

    async def adrain(self, read: Callable[[], Awaitable[int]]) -> None:
        deadline = time.monotonic() + DRAIN_S
        while self.tail is not None and await self.aguard(read) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)

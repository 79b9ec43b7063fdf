"""Follow a Vertex job's Cloud Logging entries into the task log: in order, each line once, across
triggerer restarts and task retries.

Entries are read with ``entries:list`` (``resource.type="ml_job"``, the job's numeric id), oldest first.
Cloud Logging can index an entry a little after later ones, so each read starts ``LATE_S`` before the
newest timestamp shown and skips the ``insertId``s already shown in that window: a late line still
appears (after the lines around it), and none appears twice. The cursor (newest timestamp shown and the
window's ids) is saved in the job folder (``_cloudtrain/jobs/<numeric id>/log_cursor.json``) after each
batch is shown, so a re-created trigger or a retried task that re-attaches goes on where the last one
stopped. A trigger cannot update its own kwargs and the triggerer has no ``task_state_store``, so the
job folder is the one place both the worker and the triggerer can write. Saving after showing means a
triggerer killed between the two shows that one batch again; saving first could lose it instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

LATE_S = 10.0  # how far back each read looks for lines indexed late
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

    def __init__(self, hook: Any, numeric_id: str, folder: Any = None) -> None:
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

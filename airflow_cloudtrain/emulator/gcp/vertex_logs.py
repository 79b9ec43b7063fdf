"""The emulated Cloud Logging's ``entries.list`` for Vertex AI jobs: every replica's output lines and the
service's own entries, as the real API serves a CustomJob's logs.

Entries (``LogEntry`` JSON): ``logName`` (``projects/P/logs/workerpool0-0``; the service's:
``projects/P/logs/ml.googleapis.com%2F<job id>``), ``resource`` ``{"type": "ml_job", "labels":
{"job_id", "task_name", "project_id"}}`` (task_name ``"service"`` for the service's), ``textPayload``,
``timestamp`` (when the line was written: ``vertex_run`` stamps each as it reads it),
``receiveTimestamp`` (when it was read here), ``severity`` (stdout INFO, stderr ERROR, as Vertex
records them), ``insertId`` (unique, increasing in the order entries were read, so one replica's lines
stay in the order written when their timestamps are equal). Replica lines are read from the replicas'
log files whenever entries are listed.

``entries.list`` body: ``resourceNames`` (``projects/P``; required), ``filter``, ``orderBy``
(``"timestamp asc"``, the default, or ``"timestamp desc"``), ``pageSize`` (default 50, at most 1000),
``pageToken``. Results sort by (timestamp, insertId). The filter: comparisons joined by ``AND`` (or by
whitespace, which Logging reads as AND) of ``resource.type``, ``resource.labels.job_id|task_name|
project_id``, ``logName`` (``=``, ``!=``), ``timestamp`` (``>=``, ``>``, ``<=``, ``<``, ``=``, RFC 3339),
``severity`` (all comparisons, by level). Anything else (OR, NOT, parentheses, other fields, regular
expressions, ``:``) is a 400: better than a silent misread. The page token remembers the last entry
returned, so a page never repeats one; entries of an earlier time that arrive later are not seen by a
later page (Logging's ingestion delay has the same effect on a tail that pages).

Not emulated: structured payloads (``jsonPayload``), other resources and logs, ``labels``, the
``projectIds`` deprecated field beyond being read as resource names, exclusion/retention, tail
(streaming), the real API's ingestion delay.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["LogStore", "LogsInvalid", "micros", "parse_rfc3339", "rfc3339"]

SEVERITIES = {
    "DEFAULT": 0,
    "DEBUG": 100,
    "INFO": 200,
    "NOTICE": 300,
    "WARNING": 400,
    "ERROR": 500,
    "CRITICAL": 600,
    "ALERT": 700,
    "EMERGENCY": 800,
}
_TERM = re.compile(
    r"""\s*(?:AND\s+)?([A-Za-z_][\w.]*)\s*(>=|<=|!=|=|>|<)\s*("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"'()]+)\s*"""
)
_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", re.IGNORECASE)
_RESOURCE = {"resource.labels.job_id", "resource.labels.task_name", "resource.labels.project_id"}
_STRING_FIELDS = {"resource.type", "logName", *_RESOURCE}


class LogsInvalid(ValueError):
    """A request the API refuses with 400 INVALID_ARGUMENT."""


def micros(t: float) -> int:
    """Unix time -> integer microseconds (entries are kept and compared at the precision shown)."""
    return round(t * 1_000_000)


def rfc3339(us: int) -> str:
    """Microseconds -> UTC with a "Z" and six fractional digits (the real API writes up to nine)."""
    whole = datetime.fromtimestamp(us // 1_000_000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{us % 1_000_000:06d}Z"


def parse_rfc3339(text: str) -> int:
    """RFC 3339 -> microseconds (digits past the sixth are dropped)."""
    m = _TIME.fullmatch(text.strip())
    if not m:
        raise LogsInvalid(f"Invalid timestamp {text!r}: expected RFC 3339, e.g. 2024-05-01T12:00:00.5Z")
    zone = "+00:00" if m.group(3).upper() == "Z" else m.group(3)
    whole = int(datetime.fromisoformat(m.group(1) + zone).timestamp())
    return whole * 1_000_000 + int(((m.group(2) or "") + "000000")[:6])


@dataclass
class Entry:
    t: int  # microseconds
    insert_id: str
    received: int
    project: str
    job_id: str
    task: str
    severity: str
    text: str

    def key(self) -> tuple[int, str]:
        return (self.t, self.insert_id)

    def field(self, name: str) -> str:
        return {
            "resource.type": "ml_job",
            "resource.labels.job_id": self.job_id,
            "resource.labels.task_name": self.task,
            "resource.labels.project_id": self.project,
            "logName": self.log_name(),
        }[name]

    def log_name(self) -> str:
        log = f"ml.googleapis.com%2F{self.job_id}" if self.task == "service" else self.task
        return f"projects/{self.project}/logs/{log}"

    def show(self) -> dict[str, Any]:
        labels = {"job_id": self.job_id, "task_name": self.task, "project_id": self.project}
        return {
            "logName": self.log_name(),
            "resource": {"type": "ml_job", "labels": labels},
            "textPayload": self.text,
            "timestamp": rfc3339(self.t),
            "receiveTimestamp": rfc3339(self.received),
            "severity": self.severity,
            "insertId": self.insert_id,
        }


@dataclass
class _Source:
    """One replica's log file and how far it has been read."""

    path: Path
    project: str
    job_id: str
    task: str
    offset: int = 0


def _clauses(text: str) -> list[tuple[str, str, str]]:
    out, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TERM.match(text, pos)
        if not m or m.end() == pos:
            raise LogsInvalid(
                f'Unsupported filter "{text}": the emulated Cloud Logging reads AND-joined comparisons '
                "of resource.type, resource.labels.job_id|task_name|project_id, logName, severity and "
                "timestamp."
            )
        value = m.group(3)
        out.append((m.group(1), m.group(2), value[1:-1] if value[:1] in "\"'" else value))
        pos = m.end()
    return out


def _compare(left: Any, op: str, right: Any) -> bool:
    return {
        "=": left == right,
        "!=": left != right,
        ">": left > right,
        ">=": left >= right,
        "<": left < right,
        "<=": left <= right,
    }[op]


def _matcher(text: str) -> Any:
    """A filter -> a predicate on entries (``LogsInvalid`` for what is not read here)."""
    tests: list[Callable[..., bool]] = []
    for name, op, value in _clauses(text):
        if name in _STRING_FIELDS and op in ("=", "!="):
            tests.append(lambda e, n=name, o=op, v=value: _compare(e.field(n), o, v))
        elif name == "timestamp":
            t = parse_rfc3339(value)
            tests.append(lambda e, o=op, t=t: _compare(e.t, o, t))
        elif name == "severity" and value.upper() in SEVERITIES:
            level = SEVERITIES[value.upper()]
            tests.append(lambda e, o=op, v=level: _compare(SEVERITIES[e.severity], o, v))
        else:
            raise LogsInvalid(f'Unsupported filter comparison "{name} {op} {value}" in "{text}".')
    return lambda entry: all(test(entry) for test in tests)


def _token(key: tuple[int, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def _untoken(token: str) -> tuple[int, str]:
    try:
        t, insert_id = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(t), str(insert_id)
    except (ValueError, TypeError) as exc:
        raise LogsInvalid(f"Invalid page token {token!r}.") from exc


class LogStore:
    """Entries of every job, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        self._sources: list[_Source] = []
        self._ids = itertools.count(1)

    def watch(self, path: Path, project: str, job_id: str, task: str) -> None:
        """Serve the lines a replica writes to ``path`` (``vertex_run``'s records) from now on."""
        with self._lock:
            if not any(s.path == path for s in self._sources):
                self._sources.append(_Source(path, project, job_id, task))

    def add(self, project: str, job_id: str, task: str, text: str, severity: str = "INFO") -> None:
        """An entry written now (the service's: ``task="service"``)."""
        now = micros(time.time())
        with self._lock:
            self._append(now, now, project, job_id, task, severity, text)

    def _append(self, t: int, received: int, *fields: str) -> None:
        self._entries.append(Entry(t, f"{next(self._ids):016d}", received, *fields))

    def ingest(self, job_ids: set[str] | None = None) -> None:
        """Read what the replicas (of those jobs, or all) wrote since the last look (complete lines)."""
        with self._lock:
            now = micros(time.time())
            for src in self._sources:
                if job_ids is not None and src.job_id not in job_ids:
                    continue
                try:
                    with src.path.open("rb") as f:
                        f.seek(src.offset)
                        data = f.read()
                except FileNotFoundError:
                    continue
                end = data.rfind(b"\n") + 1
                src.offset += end
                for line in data[:end].splitlines():
                    try:
                        rec = json.loads(line)
                        t, stream, text = micros(float(rec["t"])), str(rec["s"]), str(rec["m"])
                    except (ValueError, KeyError, TypeError):
                        continue
                    severity = "ERROR" if stream == "stderr" else "INFO"
                    self._append(t, max(now, t), src.project, src.job_id, src.task, severity, text)

    def list(self, body: dict[str, Any]) -> dict[str, Any]:
        """``entries.list`` (module doc); ``LogsInvalid`` for a request the API refuses."""
        names = list(body.get("resourceNames") or []) + [
            f"projects/{p}" for p in body.get("projectIds") or []
        ]
        if not names:
            raise LogsInvalid(
                "Field resource_names is required: name at least one resource, e.g. projects/P."
            )
        order = (body.get("orderBy") or "timestamp asc").strip().lower()
        if order not in ("timestamp asc", "timestamp desc"):
            raise LogsInvalid(
                f'Invalid orderBy "{body.get("orderBy")}": "timestamp asc" or "timestamp desc".'
            )
        try:
            size = int(body.get("pageSize") or 0) or 50
        except (TypeError, ValueError) as exc:
            raise LogsInvalid(f"Invalid pageSize {body.get('pageSize')!r}.") from exc
        if not 0 < size <= 1000:
            raise LogsInvalid(f"Invalid pageSize {size}: it must be between 1 and 1000.")
        text = body.get("filter") or ""
        match = _matcher(text)
        after = _untoken(body["pageToken"]) if body.get("pageToken") else None
        desc = order.endswith("desc")
        named = {v for k, op, v in _clauses(text) if (k, op) == ("resource.labels.job_id", "=")}
        self.ingest(named or None)
        with self._lock:
            found = [e for e in self._entries if f"projects/{e.project}" in names and match(e)]
        found.sort(key=Entry.key, reverse=desc)
        if after is not None:
            found = [e for e in found if (e.key() < after if desc else e.key() > after)]
        page = found[:size]
        out: dict[str, Any] = {"entries": [e.show() for e in page]} if page else {}
        if len(found) > size:
            out["nextPageToken"] = _token(page[-1].key())
        return out

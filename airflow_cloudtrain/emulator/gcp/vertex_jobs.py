"""The emulated Vertex AI's CustomJob resource: its states, how it is written in JSON (camelCase, as the
REST API writes it), the ``customJobs.list`` filter, and the API's error shape. The lifecycle is
``vertex_state``'s.

The list filter reads ``labels.KEY="v"``, ``display_name="x"`` (or ``displayName``) and
``state="JOB_STATE_RUNNING"``, each with ``=`` or ``!=``, joined by AND; anything else (OR, NOT,
``create_time``, ``:``) is a 400 rather than a silent misread.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_cloudtrain.emulator.gcp.rest import GoogleError
from airflow_cloudtrain.emulator.gcp.vertex_cluster import Replica
from airflow_cloudtrain.emulator.gcp.vertex_logs import micros, rfc3339

__all__ = [
    "CANCELLED",
    "CANCELLING",
    "CHIEF",
    "FAILED",
    "Job",
    "PENDING",
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "TERMINAL",
    "VertexError",
    "timestamp",
    "job_filter",
    "matches",
]

QUEUED, PENDING, RUNNING = "JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING"
SUCCEEDED, FAILED = "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"
CANCELLING, CANCELLED = "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"
TERMINAL = {SUCCEEDED, FAILED, CANCELLED}
CHIEF = "workerpool0-0"
_CLAUSE = re.compile(r"""\s*([\w.-]+)\s*(!=|=)\s*("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"'()]+)\s*""")
_AND = re.compile(r"\s+AND\s+", re.IGNORECASE)


class VertexError(GoogleError):
    """An error in Google's JSON shape (``error.code``/``message``/``status``)."""


def timestamp(t: float) -> str:
    """Unix time -> RFC 3339 with "Z" and microseconds, as the API writes times."""
    return rfc3339(micros(t))


@dataclass
class Job:
    id: str
    project: str
    location: str
    display_name: str
    spec: dict[str, Any]
    labels: dict[str, str]
    seq: int
    create_t: float
    state: str = QUEUED
    state_t: float = 0.0  # when it entered its state
    start_t: float | None = None
    end_t: float | None = None
    error: dict[str, Any] | None = None
    replicas: dict[str, Replica] = field(default_factory=dict)
    rids: list[str] = field(default_factory=list)  # every replica machine it ever had

    @property
    def name(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/customJobs/{self.id}"

    @property
    def scheduling(self) -> dict[str, Any]:
        return self.spec.get("scheduling") or {}

    def show(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "displayName": self.display_name,
            "jobSpec": copy.deepcopy(self.spec),
            "state": self.state,
            "createTime": timestamp(self.create_t),
            "updateTime": timestamp(self.state_t),
            "webAccessUris": {},
        }
        if self.start_t is not None:
            out["startTime"] = timestamp(self.start_t)
        if self.end_t is not None:
            out["endTime"] = timestamp(self.end_t)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.error:
            out["error"] = dict(self.error)
        return out


def job_filter(text: str) -> list[tuple[str, str, str]]:
    """``labels.k="v" AND display_name="x" AND state!=JOB_STATE_RUNNING`` -> clauses; else a 400."""
    out = []
    for part in _AND.split(text.strip()) if text.strip() else []:
        m = _CLAUSE.fullmatch(part)
        key = m.group(1) if m else ""
        if not m or not (key in ("display_name", "displayName", "state") or key.startswith("labels.")):
            raise VertexError(
                400, f'Unsupported filter "{text}": AND-joined labels.KEY, display_name, state.'
            )
        value = m.group(3)[1:-1] if m.group(3)[:1] in "\"'" else m.group(3)
        out.append((key, m.group(2), value))
    return out


def matches(job: Job, clauses: Iterable[tuple[str, str, str]]) -> bool:
    for key, op, value in clauses:
        have = (
            job.state
            if key == "state"
            else job.labels.get(key[7:])
            if key.startswith("labels.")
            else job.display_name
        )
        if (have == value) != (op == "="):
            return False
    return True

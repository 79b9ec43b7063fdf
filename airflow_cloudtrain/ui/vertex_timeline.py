"""A Vertex AI job's timeline on the Cloud training page, from what its job folder already holds:
nothing here writes, and no request goes to Vertex AI (the page reads buckets only).

- The jobs: each job whose result reached Airflow left ``_cloudtrain/jobs/<numeric id>/delivered.json``
  in the job folder (``lifecycle.vertex.job.delivered_record``) with what the job itself told of its
  life: created, running from (``startTime``), ended (``endTime``) and how. A retry runs in the same
  folder and a ``resume_from`` job in the first job's, so the folder also holds the earlier jobs of
  the run: the run's own jobs are drawn with those created before them, each a bar from its creation
  to its end with its state changes as ticks (the queued part bills nothing: the cost counts from
  "running"). A run whose jobs left no such record (an older release, a job still running) keeps
  the cost index's bars.
- The checkpoints: the objects under the folder's ``checkpoints/`` (``AIP_CHECKPOINT_DIR``) whose
  names carry a step (``ckpt-000004.json``, ``ckpt-4.index``, ``checkpoint-500/...``), each step
  marked when its newest object was written, on the job running then. One listing, times included.

At most ``MAX_READS`` job records are read and ``MAX_READS`` checkpoint steps drawn (the newest).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.checkpoint import step_of
from airflow_cloudtrain.ui.runs import duration
from airflow_cloudtrain.ui.timeline import Bar, Mark

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

MAX_READS = 200  # job records read, checkpoint steps drawn
JOBS_PREFIX = "_cloudtrain/jobs/"  # lifecycle.vertex.job.delivered_key's folder
CHECKPOINTS = "checkpoints/"  # AIP_CHECKPOINT_DIR under the job folder
_SHARD = re.compile(r"\.data-\d+-of-\d+$")  # TensorFlow's ckpt-4.data-00000-of-00001


def checkpoint_step(rel: str) -> int | None:
    """The step of an object under ``checkpoints/``: its first path part that names one."""
    for part in rel.split("/"):
        step = step_of(_SHARD.sub("", part))
        if step is not None:
            return step
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def job_records(folder: RunFolder) -> list[dict[str, Any]]:
    """The delivered jobs of the folder that say when they ran, in creation order."""
    keys = [k for k in folder.list(JOBS_PREFIX) if k.endswith("/delivered.json")][-MAX_READS:]
    out = []
    for key in keys:
        try:
            record = json.loads(folder.get_text(key) or "null")
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("job_id"), str):
            continue  # written by a release before the times were kept
        end = _number(record.get("ended_at")) or _number(record.get("at"))
        start = _number(record.get("created_at")) or _number(record.get("started_at")) or end
        if start is not None and end is not None:
            out.append({**record, "_start": start, "_end": max(start, end)})
    return sorted(out, key=lambda r: r["_start"])


def _job_bar(n: int, record: dict[str, Any]) -> Bar:
    state = str(record.get("state") or "").removeprefix("JOB_STATE_").lower()
    marks = [Mark(record["_start"], "state", "created")] if _number(record.get("created_at")) else []
    started = _number(record.get("started_at"))
    if started is not None:
        marks.append(Mark(started, "state", "running"))
    if _number(record.get("ended_at")) is not None:
        marks.append(Mark(record["_end"], "state", state or "ended"))
    cost = record.get("cost_usd")
    ran = duration(record["_end"] - started) if started is not None else "never ran"
    return Bar(
        label=f"#{n} {record['job_id'][-17:]}",
        start=record["_start"],
        end=record["_end"],
        spot=bool(record.get("spot")),
        interrupted=False,
        detail=f"{record['job_id']} ({str(record.get('job_name') or '').rsplit('/', 1)[-1]}) "
        f"{'spot' if record.get('spot') else 'on-demand'}, {state}, ran {ran}, "
        f"{'?' if cost is None else f'${float(cost):.4f}'}",
        marks=tuple(marks),
        instance_id=str(record.get("job_name") or record["job_id"]),
    )


def checkpoint_times(folder: RunFolder) -> list[tuple[float, int]]:
    """(when its newest object was written, step) of the newest ``MAX_READS`` steps, in time order."""
    newest: dict[int, float] = {}
    for rel, at in folder.list_modified(CHECKPOINTS).items():
        step = checkpoint_step(rel[len(CHECKPOINTS) :])
        if step is not None and at:
            newest[step] = max(at, newest.get(step, 0.0))
    return sorted((at, step) for step, at in newest.items())[-MAX_READS:]


def vertex_bars(folder: RunFolder, key: str, bars: list[Bar]) -> list[Bar]:
    """The run's jobs (``key``: its job id) and the earlier jobs of its folder as bars with their
    state changes, and the checkpoints marked on the job that wrote them. ``bars``: the cost index's
    (and the running index's) bars of the run, kept where no record says more."""
    records = job_records(folder)
    mine = [r for r in records if r["job_id"] == key]
    running = [b for b in bars if b.running]
    ends = [r["_start"] for r in mine] + [b.start for b in running]
    cutoff = max(ends) if ends else min((b.start for b in bars), default=0.0)
    earlier = [r for r in records if r["job_id"] != key and r["_start"] <= cutoff]
    shown = [_job_bar(n + 1, r) for n, r in enumerate(earlier + mine)]  # records: in creation order
    if not mine:  # the index's bars stand for the run's own jobs
        shown = sorted(shown + [b for b in bars if not b.running], key=lambda b: b.start)
    shown += running
    marks: dict[int, list[Mark]] = {}
    for at, step in checkpoint_times(folder):
        on = [i for i, b in enumerate(shown) if b.start <= at <= b.end]
        if on:
            marks.setdefault(on[-1], []).append(Mark(at, "checkpoint", f"step {step}"))
    return [replace(b, marks=tuple(sorted(b.marks + tuple(marks.get(i, ())), key=lambda m: m.at)))
            for i, b in enumerate(shown)]  # fmt: skip

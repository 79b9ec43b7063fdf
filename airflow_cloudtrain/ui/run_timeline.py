"""A run's timeline on the Cloud training page (and ``make demo``'s ``timeline.svg``), with what its
run folder already holds: nothing here writes, and a run costs a handful of small reads.

- Checkpoints and restores: a checkpoint-resume run's ledger (``ledger/<run id>.json``: each attempt's
  last checkpoint and the step it restored, and the deadline policy's deadline), the manifests of the
  checkpoints still kept (the newest two: who uploaded them, when), and each attempt's
  ``status.json`` (a single run, or the attempt running now: every checkpoint it uploaded, its
  newest 200 from ``checkpoint_history``, the final one taken at an interruption notice, the step
  restored). A status written before the history existed gives its newest checkpoint only.
- A fleet: one bar per worker (``workers/<id>.json``) with the items it finished as ticks
  (``outcomes/<id>.json``), and above them the workers running and the items done over time. A big
  fleet's folder is read up to ``MAX_READS`` records of each kind.

Unreadable parts are left out, never a failed page: the cost index's rows are the page's backbone.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.ui.runs import duration
from airflow_cloudtrain.ui.timeline import Bar, Mark, Series, timeline_svg

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger(__name__)
MAX_READS = 200  # worker records and item outcomes read for one fleet's timeline
FLEET_OPERATORS = ("SpotFleetOperator", "PreemptibleGroupOperator")


def _add(
    marks: dict[str, list[Mark]], instance_id: str | None, at: Any, kind: str, step: Any, version: Any = None
) -> None:
    """One mark, once per (instance, kind, step): the ledger, the manifest, the status and its
    history may all say the same checkpoint (a snapshot without a step: once per version)."""
    if not instance_id or not isinstance(at, (int, float)):
        return
    label = f"step {step}" if step is not None else (f"version {version}" if version is not None else "")
    mine = marks.setdefault(instance_id, [])
    if not any(m.kind == kind and m.label == label for m in mine):
        mine.append(Mark(float(at), kind, label))


def checkpoint_marks(
    folder: RunFolder, run_id: str, instance_ids: list[str]
) -> tuple[dict[str, list[Mark]], float | None]:
    """({instance id: its checkpoint and restore marks}, the deadline or None)."""
    from airflow_cloudtrain.contract.runs import (
        CHECKPOINTS_PREFIX,
        Manifest,
        RunStatus,
        manifest_key,
        manifest_versions,
        status_key,
    )
    from airflow_cloudtrain.lifecycle.resume.history import RunHistory, ledger_key

    marks: dict[str, list[Mark]] = {}
    deadline = None
    raw = folder.get_text(ledger_key(run_id))
    if raw:  # a checkpoint-resume run
        history = RunHistory.from_dict(json.loads(raw))
        deadline = history.deadline_at
        for row in history.attempts:
            if row.restored_step is not None:
                _add(marks, row.instance_id, row.job_started_at, "restore", row.restored_step)
            if row.checkpoint_step is not None:
                _add(marks, row.instance_id, row.checkpoint_saved_at, "checkpoint", row.checkpoint_step)
    for version in manifest_versions(folder.list(f"{CHECKPOINTS_PREFIX}/"))[-2:]:
        text = folder.get_text(manifest_key(version))
        if text:
            manifest = Manifest.from_json(text)
            _add(marks, manifest.instance_id, manifest.created_at, "checkpoint", manifest.step, version)
    for iid in instance_ids:
        text = folder.get_text(status_key(iid))
        if not text:
            continue
        status = RunStatus.from_json(text)
        if status.restored_step is not None:
            _add(marks, iid, status.job_started_at, "restore", status.restored_step)
        for taken in status.checkpoint_history or []:
            if isinstance(taken, dict):
                _add(marks, iid, taken.get("at"), "checkpoint", taken.get("step"), taken.get("version"))
        if not status.checkpoint_history:  # an older agent's: its newest and its notice's final one
            newest, notice = status.checkpoint or {}, status.interruption or {}
            _add(marks, iid, newest.get("uploaded_at"), "checkpoint", newest.get("step"))
            _add(marks, iid, notice.get("checkpoint_at"), "checkpoint", notice.get("checkpoint_step"))
    return {iid: sorted(mine, key=lambda m: m.at) for iid, mine in marks.items()}, deadline


def _records(folder: RunFolder, prefix: str) -> list[str]:
    keys = [k for k in folder.list(f"{prefix}/") if k.endswith(".json")][:MAX_READS]
    return [text for k in keys if (text := folder.get_text(k))]


def fleet_parts(folder: RunFolder, spot: bool, now: float, in_flight: bool) -> tuple[list[Bar], list[Series]]:
    """A fleet's workers as bars (its finished items as ticks) and its workers running and items done
    over time."""
    from airflow_cloudtrain.contract.workqueue import (
        OUTCOMES_PREFIX,
        WORKERS_PREFIX,
        ItemOutcome,
        WorkerRecord,
    )

    workers = sorted(
        (WorkerRecord.from_json(t) for t in _records(folder, WORKERS_PREFIX)), key=lambda w: w.started_at
    )
    outcomes = [ItemOutcome.from_json(t) for t in _records(folder, OUTCOMES_PREFIX)]
    bars, changes = [], []
    for w in workers:
        end = w.ended_at or (now if in_flight else (w.updated_at or w.started_at))
        items = tuple(
            Mark(float(o.ended_at), "item", f"{o.id} {o.state}")
            for o in outcomes
            if o.instance_id == w.instance_id and o.ended_at is not None
        )
        bars.append(
            Bar(
                label=w.instance_id[-18:],
                start=w.started_at,
                end=end,
                spot=spot,
                interrupted=w.state == "interrupted",
                detail=f"{w.instance_id}: {w.state}, {len(items)} item(s), {duration(end - w.started_at)}",
                marks=items,
                running=w.ended_at is None and in_flight,
            )
        )
        changes.append((w.started_at, 1))
        if w.ended_at is not None:
            changes.append((w.ended_at, -1))
    running, counts = 0, []
    for t, delta in sorted(changes):
        running += delta
        counts.append((t, float(running)))
    finished = sorted(float(o.ended_at) for o in outcomes if o.ended_at is not None)
    series = [
        Series("workers running", tuple(counts)),
        Series("items done", tuple((t, float(n + 1)) for n, t in enumerate(finished))),
    ]
    return bars, series


def _attempt_bars(detail: dict[str, Any] | None, running: list[dict[str, Any]], now: float) -> list[Bar]:
    """The released attempts in launch order, then those running now (drawn up to ``now``)."""
    bars = []
    for a in detail["attempts_detail"] if detail else []:
        start = a["launched_at"] if a["launched_at"] is not None else a["released_at"]
        cost = "?" if a["cost_usd"] is None else f"${float(a['cost_usd']):.4f}"
        bars.append(
            Bar(
                label=f"#{a['attempt']} {a['instance_type'] or ''}".strip(),
                start=float(start),
                end=float(a["released_at"]),
                spot=bool(a["spot"]),
                interrupted=bool(a["interrupted"]),
                detail=f"{a['instance_id']} {'spot' if a['spot'] else 'on-demand'}, {a['ended']}, "
                f"{duration(float(a['released_at']) - float(start))}, {cost}",
                instance_id=a["instance_id"],
            )
        )
    for r in running:
        cost = "?" if r["cost_so_far_usd"] is None else f"${float(r['cost_so_far_usd']):.4f} so far"
        bars.append(
            Bar(
                label=f"#{len(bars) + 1} {r['instance_type'] or ''}".strip(),
                start=float(r["launched_at"]),
                end=max(now, float(r["launched_at"])),
                spot=bool(r["spot"]),
                interrupted=False,
                detail=f"{r['instance_id']} {'spot' if r['spot'] else 'on-demand'}, running, "
                f"{duration(now - float(r['launched_at']))}, {cost}",
                running=True,
                instance_id=r["instance_id"],
            )
        )
    return bars


def timeline_of(
    detail: dict[str, Any] | None,
    running: list[dict[str, Any]] | None = None,
    now: float | None = None,
    read: bool = True,
) -> str:
    """The run's timeline as SVG: its attempts (or a fleet's workers) with the marks its run folder
    holds. ``detail``: ``ui.runs.run_detail`` (None: only its first attempt runs); ``running``: its
    rows of ``ui.runs.load_running``; ``read`` False: the bars alone, without reading the run folder."""
    from airflow_cloudtrain.storage import open_run_folder

    now = time.time() if now is None else now
    running = running or []
    head: dict[str, Any] = detail or running[0]
    title = f"{head['dag_id']}.{head['task_id']} {head['key']}"
    run_uri = head.get("run_uri") or ""
    bars = _attempt_bars(detail, running, now)
    if not read or not run_uri:
        return timeline_svg(bars, title)
    try:
        folder = open_run_folder(run_uri)
        if head.get("cloud") == "vertex":  # its job folder: the jobs' records and checkpoints
            from airflow_cloudtrain.ui.vertex_timeline import vertex_bars

            return timeline_svg(vertex_bars(folder, head["key"], bars), title)
        if head.get("operator") in FLEET_OPERATORS:
            workers, series = fleet_parts(folder, bool(head.get("spot")), now, bool(running))
            return timeline_svg(workers or bars, title, series=series)
        marks, deadline = checkpoint_marks(folder, head["key"], [b.instance_id for b in bars])
    except Exception as err:  # the bars alone: the index's rows are what the page stands on
        log.warning("Could not read the marks of %s from %s: %s", head["key"], run_uri, err)
        return timeline_svg(bars, title)
    marked = [replace(b, marks=tuple(marks.get(b.instance_id, ()))) for b in bars]
    return timeline_svg(marked, title, deadline=deadline)

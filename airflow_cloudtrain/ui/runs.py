"""The runs the page shows, from the bucket's cost index: the records ``cloudtrain costs`` adds up,
grouped by run, so the page's totals and the command's agree by construction (``grand_total`` and
``totals`` are the command's own functions).

A run is what one task instance's operator ran (its ``ct-...`` run id): a ``CloudTrainOperator``
run has one attempt, a ``CheckpointResumeOperator`` run one record per launch (a gang's nodes
together), a fleet or a Vertex AI job one record for the whole run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.core.billing import billed_usd
from airflow_cloudtrain.lifecycle.cost_index import (
    CostRecord,
    grand_total,
    live_markers,
    read_records,
    read_running,
    select,
    stale_reason,
    totals,
)
from airflow_cloudtrain.lifecycle.running_entry import cost_so_far

BUCKETS_ENV = "CLOUDTRAIN_BUCKET"
TAIL_LINES = 40  # the lines of a running job's log the page shows


def configured_buckets(setting: str | None) -> list[str]:
    """``[cloudtrain] ui_buckets`` (comma or whitespace separated), else ``$CLOUDTRAIN_BUCKET``."""
    text = setting or os.environ.get(BUCKETS_ENV, "")
    return [b.strip().rstrip("/") for b in text.replace(",", " ").split() if b.strip()]


@dataclass(frozen=True)
class Filters:
    """What the page's form narrows to: the period and, when set, one DAG, state and cloud (the same
    filters as ``cloudtrain costs --since --dag --state --cloud``, applied by the same function)."""

    since: str
    dag: str = ""
    state: str = ""
    cloud: str = ""

    def apply(self, records: Iterable[CostRecord]) -> list[CostRecord]:
        return select(records, self.dag, self.state, self.cloud)


def choices(records: list[CostRecord]) -> dict[str, list[str]]:
    """The values the form offers for each filter: those the period's runs have (a run's state is its
    last attempt's; its clouds are every attempt's)."""
    runs = list_runs(records)
    return {
        "dag": sorted({row["dag_id"] for row in runs}),
        "state": sorted({row["state"] for row in runs}),
        "cloud": sorted({r.cloud for r in records}),
    }


def load_records(buckets: Iterable[str], since: float) -> list[CostRecord]:
    """Every bucket's records of the days since ``since`` (what ``cloudtrain costs --bucket`` reads)."""
    from airflow_cloudtrain.storage import open_run_folder

    out: list[CostRecord] = []
    for bucket in buckets:
        out.extend(read_records(open_run_folder(bucket), since))
    return out


def load_running(buckets: Iterable[str], now: float | None = None) -> list[dict[str, Any]]:
    """The attempts in flight of every bucket, newest first: the running index's records whose agent
    has not ended (the live index has no end marker for the instance), each with its cost so far at
    its price per hour (every node, per second with the 60 s minimum, as it will be billed); a fleet's
    or a Vertex AI job's while its wait keeps refreshing it, its cost so far what was spent by the last
    refresh plus its price per hour since (``lifecycle.running_entry``)."""
    from airflow_cloudtrain.contract.runs import BEACON
    from airflow_cloudtrain.storage import open_run_folder

    now = time.time() if now is None else now
    rows = []
    for bucket in buckets:
        folder = open_run_folder(bucket)
        records = read_running(folder)
        if not records:
            continue
        seen = live_markers(folder)
        for r in records:
            if stale_reason(r, seen, now) is not None:
                continue  # its agent ended, or a launch a killed task left behind
            started = float(r.launched_at or r.released_at)
            running_s = max(0.0, now - started)
            if r.updated_at is not None:  # a fleet or a Vertex job: spent by its last write, and since
                so_far = cost_so_far(r, now)
            else:
                so_far = (
                    None if r.hourly_usd is None else round(billed_usd(float(r.hourly_usd), running_s), 6)
                )
            rows.append(
                {
                    "key": r.run_id,
                    "dag_id": r.dag_id,
                    "task_id": r.task_id,
                    "airflow_run_id": r.airflow_run_id,
                    "map_index": r.map_index,
                    "cloud": r.cloud,
                    "instance_id": r.instance_id,
                    "instance_type": r.instance_type,
                    "nodes": r.num_nodes,
                    "spot": r.spot,
                    "launched_at": started,
                    "running_s": round(running_s, 1),
                    "operator": r.operator or "",
                    "hourly_usd": r.hourly_usd,
                    "run_uri": r.run_uri,
                    "cost_so_far_usd": so_far,
                    "bucket": bucket,
                    "live": r.instance_id in seen.get(BEACON, set()),
                }
            )
    return sorted(rows, key=lambda row: -row["launched_at"])


def live_tail(bucket: str, instance_id: str, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a running job's log, from its agent's beacon in the live index
    (one small read; the beacon carries the newest chunks)."""
    from airflow_cloudtrain.contract.runs import Beacon, beacon_name, live_index_uri, strip_stamps
    from airflow_cloudtrain.storage import open_run_folder

    raw = open_run_folder(bucket).at(live_index_uri(bucket)).get_bytes(beacon_name(instance_id))
    if not raw:
        return []
    beacon = Beacon.from_bytes(raw)
    text = strip_stamps("".join(line + "\n" for line in beacon.lines_from(beacon.tail_from) or []))
    return text.splitlines()[-lines:]


def _ordered(records: Iterable[CostRecord]) -> list[CostRecord]:
    return sorted(records, key=lambda r: (r.launched_at or r.released_at, r.released_at, r.instance_id))


def _run_row(run_id: str, attempts: list[CostRecord]) -> dict[str, Any]:
    last = attempts[-1]
    cost = sum(float(r.cost_usd or 0.0) for r in attempts)
    return {
        "key": run_id,
        "dag_id": last.dag_id,
        "task_id": last.task_id,
        "airflow_run_id": last.airflow_run_id,
        "map_index": last.map_index,
        "cloud": last.cloud,
        "operator": last.operator or "",
        "run_uri": last.run_uri,
        "instance_types": sorted({r.instance_type for r in attempts if r.instance_type}),
        "nodes": max(int(r.num_nodes or 1) for r in attempts),
        "attempts": len(attempts),
        "interruptions": sum(int(r.interrupted) for r in attempts),
        "spot": any(r.spot for r in attempts),
        "state": last.state,
        "started_at": min((r.launched_at or r.released_at) for r in attempts),
        "ended_at": max(r.released_at for r in attempts),
        "cost_usd": round(cost, 6),
        "basis": sorted({r.cost_basis for r in attempts if r.cost_basis}),
    }


def list_runs(records: Iterable[CostRecord]) -> list[dict[str, Any]]:
    """One row per run, newest first."""
    by_run: dict[str, list[CostRecord]] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(r)
    rows = [_run_row(run_id, _ordered(attempts)) for run_id, attempts in by_run.items()]
    return sorted(rows, key=lambda row: -row["ended_at"])


def run_detail(records: Iterable[CostRecord], key: str) -> dict[str, Any] | None:
    """A run's row and its attempts in launch order (None: the index has no record of it)."""
    attempts = _ordered(r for r in records if r.run_id == key)
    if not attempts:
        return None
    return {
        **_run_row(key, attempts),
        "attempts_detail": [
            {
                "attempt": i + 1,
                "instance_id": r.instance_id,
                "instance_type": r.instance_type,
                "nodes": r.num_nodes,
                "spot": r.spot,
                "launched_at": r.launched_at,
                "released_at": r.released_at,
                "ended": r.state,
                "interrupted": r.interrupted,
                "cost_usd": r.cost_usd,
                "basis": r.cost_basis,
            }
            for i, r in enumerate(attempts)
        ],
    }


def find_task_run(
    records: Iterable[CostRecord], dag_id: str, airflow_run_id: str, task_id: str, map_index: int
) -> str | None:
    """The run key of a task instance (its newest run when retries made several), for its tab."""
    found = [
        r
        for r in records
        if (r.dag_id, r.airflow_run_id, r.task_id, r.map_index)
        == (dag_id, airflow_run_id, task_id, map_index)
    ]
    return max(found, key=lambda r: r.released_at).run_id if found else None


def summary(records: list[CostRecord]) -> dict[str, Any]:
    """Totals per DAG, per day and per ISO week, and the grand total: ``cloudtrain costs``'s rows."""
    return {
        "by_dag": totals(records, "dag"),
        "by_day": totals(records, "day"),
        "by_week": totals(records, "week"),
        "total": grand_total(records, "dag"),
    }


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def day(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))

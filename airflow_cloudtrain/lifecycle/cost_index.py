"""The bucket's cost index: one small record per attempt, what ``cloudtrain costs`` adds up.

Every attempt that ran an instance (a single run, each launch of a checkpoint-resume run, a gang's
nodes together) writes, when it is released and priced, one JSON record under its bucket::

    _cloudtrain/costs/<YYYY-MM-DD>/<run id>-<instance id>.json     (the day it ended, UTC)

so totals per DAG, task, day, ISO week or cloud come from listing the days asked for, without Airflow's
database and without reading every run folder. Written best effort: a bucket that refuses the write
costs the index one row, never the run. The run folder's own ledger stays the full account.

An attempt in flight has a record of its own from its launch to its release, with its price per hour
and no cost yet, so the Cloud training page can show what runs now::

    _cloudtrain/running/<run id>-<instance id>.json

Released, it is deleted (after the priced record is written). One left by a task killed mid-way is
told apart by the reader (``ui.runs.load_running``: the live index says its agent ended, or it never
started one). A fleet or a Vertex AI job has a record there too, its group or job standing in for the
instance, kept by its wait (``lifecycle.running_entry``: stale once the wait stops refreshing it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.core.records import Attempt, LaunchRecord
    from airflow_cloudtrain.storage import RunFolder

COSTS_PREFIX = "_cloudtrain/costs/"
RUNNING_PREFIX = "_cloudtrain/running/"
RUNNING = "running"  # the state of an attempt in flight
# an in-flight record whose agent never published to the live index stands for a running attempt this
# long after its launch (the instance boots and its agent starts), then for one a killed task left
STARTUP_GRACE_S = 1800.0
AGENT_ENDED, NEVER_STARTED = "its agent ended", "no agent published since its launch"  # stale_reason
WATCH_SILENT = "its wait stopped refreshing it"  # a fleet's or a Vertex job's (``running_entry``)
REFRESH_S = 600.0  # a fleet's or Vertex job's record is rewritten at least this often by its wait
SILENT_AFTER_S = 3 * REFRESH_S  # not rewritten for this long: nobody watches its run any more
BY = ("dag", "task", "day", "week", "cloud")
CHRONOLOGICAL = ("day", "week")  # groups listed in time order; the others costliest first


@dataclass(frozen=True)
class CostRecord:
    """One attempt's cost, with what a team filters and groups by."""

    dag_id: str
    task_id: str
    airflow_run_id: str
    map_index: int
    run_id: str  # ct-...
    run_uri: str
    cloud: str
    instance_id: str
    instance_type: str | None
    num_nodes: int
    spot: bool
    state: str
    interrupted: bool
    launched_at: float | None
    released_at: float
    cost_usd: float | None
    cost_basis: str
    hourly_usd: float | None = None  # every node's price per hour, root volumes included (in flight)
    operator: str = ""  # a fleet's or a Vertex AI job's operator (an instance's attempt: empty)
    # a watched in-flight record (a fleet, a Vertex job: ``lifecycle.running_entry``): its last write,
    # with ``cost_usd`` what was spent by then; None for an instance's attempt (its agent tells it live)
    updated_at: float | None = None

    @property
    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.released_at))

    @property
    def week(self) -> str:
        """The ISO week the attempt ended in (UTC), e.g. ``2026-W48``: Monday to Sunday."""
        return time.strftime("%G-W%V", time.gmtime(self.released_at))

    def key(self) -> str:
        if self.state == RUNNING:
            return running_key(self.run_id, self.instance_id)
        return f"{COSTS_PREFIX}{self.day}/{self.run_id}-{self.instance_id}.json"

    @classmethod
    def in_flight(cls, launch: LaunchRecord, key: RunKey, hourly_usd: float | None) -> CostRecord:
        """A launched attempt's record until it is released: no cost yet, its price per hour."""
        started = float(launch.launched_at or time.time())
        return cls._of_launch(launch, key, RUNNING, False, started, started, None, "", hourly_usd)

    @classmethod
    def of(cls, attempt: Attempt, key: RunKey) -> CostRecord:
        """A released attempt's record: how it ended and what it cost."""
        return cls._of_launch(
            attempt.launch,
            key,
            attempt.outcome.state,
            bool(attempt.outcome.interrupted),
            attempt.launch.launched_at,
            attempt.released_at,
            attempt.cost_usd,
            attempt.cost_basis,
        )

    @classmethod
    def _of_launch(
        cls,
        launch: LaunchRecord,
        key: RunKey,
        state: str,
        interrupted: bool,
        launched_at: float | None,
        released_at: float,
        cost_usd: float | None,
        cost_basis: str,
        hourly_usd: float | None = None,
    ) -> CostRecord:
        return cls(
            dag_id=key.dag_id,
            task_id=key.task_id,
            airflow_run_id=key.run_id,
            map_index=key.map_index,
            run_id=launch.run_id,
            run_uri=launch.run_uri,
            cloud=launch.cloud,
            instance_id=launch.instance_id,
            instance_type=launch.instance_type,
            num_nodes=launch.num_nodes,
            spot=bool(launch.spot),
            state=state,
            interrupted=interrupted,
            launched_at=launched_at,
            released_at=released_at,
            cost_usd=cost_usd,
            cost_basis=cost_basis,
            hourly_usd=hourly_usd,
        )

    @classmethod
    def from_json(cls, text: str) -> CostRecord:
        data = json.loads(text)
        return cls(
            **{f.name: data.get(f.name, None if f.default is MISSING else f.default) for f in fields(cls)}
        )


def write_record(bucket: RunFolder, record: CostRecord, log: logging.Logger) -> None:
    """Best effort: the index loses a row, the run goes on."""
    try:
        bucket.put_text(record.key(), json.dumps(asdict(record), sort_keys=True))
    except Exception as err:
        log.warning("Could not add the attempt to the bucket's cost index (%s)", err)


def running_key(run_id: str, instance_id: str) -> str:
    return f"{RUNNING_PREFIX}{run_id}-{instance_id}.json"


def clear_running(bucket: RunFolder, run_id: str, instance_id: str, log: logging.Logger) -> None:
    """The attempt was released: out of the in-flight records (best effort, as every index write)."""
    try:
        bucket.delete_key(running_key(run_id, instance_id))
    except Exception as err:
        log.warning("Could not take the attempt out of the bucket's running index (%s)", err)


def read_running(bucket: RunFolder) -> list[CostRecord]:
    """Every in-flight record of the bucket (some may be of attempts whose task was killed)."""
    out = []
    for key in sorted(bucket.list(RUNNING_PREFIX)):
        text = bucket.get_text(key) if key.endswith(".json") else None
        if text:
            out.append(CostRecord.from_json(text))
    return out


def live_markers(bucket: RunFolder) -> dict[str, set[str]]:
    """The bucket's live index as {marker: instance ids}: which agents published (``BEACON``) and
    which ended (``END``). One listing of the index, no reads."""
    from airflow_cloudtrain.contract.runs import live_entry, live_index_uri

    seen: dict[str, set[str]] = {}
    for name in bucket.at(live_index_uri(bucket.uri)).list(""):
        entry = live_entry(name)
        if entry is not None:
            seen.setdefault(entry[1], set()).add(entry[0])
    return seen


def stale_reason(record: CostRecord, live: dict[str, set[str]], now: float) -> str | None:
    """Why an in-flight record no longer stands for an attempt in flight, or None while it does:
    its agent ended (the release, which deletes the record, was cut short or is about to come), or
    no agent ever published within ``STARTUP_GRACE_S`` of the launch (a launch a killed task left).
    The page drops such records; ``cloudtrain gc --bucket`` deletes them. A fleet's or a Vertex job's
    record has no agent of its own: it is stale once its wait stopped rewriting it (``updated_at``
    older than ``running_entry.SILENT_AFTER_S``)."""
    from airflow_cloudtrain.contract.runs import BEACON, END

    if record.updated_at is not None:
        return WATCH_SILENT if now - float(record.updated_at) > SILENT_AFTER_S else None
    if record.instance_id in live.get(END, set()):
        return AGENT_ENDED
    started = float(record.launched_at or record.released_at)
    if record.instance_id not in live.get(BEACON, set()) and now - started > STARTUP_GRACE_S:
        return NEVER_STARTED
    return None


def read_records(bucket: RunFolder, since: float, until: float | None = None) -> list[CostRecord]:
    """The records of the days from ``since`` to ``until`` (unix times; the days' whole records)."""
    first = time.strftime("%Y-%m-%d", time.gmtime(since))
    last = time.strftime("%Y-%m-%d", time.gmtime(until if until is not None else time.time()))
    out = []
    for key in sorted(bucket.list(COSTS_PREFIX)):
        day = key[len(COSTS_PREFIX) :].split("/", 1)[0]
        if not first <= day <= last or not key.endswith(".json"):
            continue
        text = bucket.get_text(key)
        if text:
            out.append(CostRecord.from_json(text))
    return out


def select(
    records: Iterable[CostRecord], dag: str = "", state: str = "", cloud: str = ""
) -> list[CostRecord]:
    """The records of the runs that match, whole: ``dag`` (the DAG id), ``state`` (how the run's last
    attempt ended: ``succeeded``, ``failed``, ``interrupted``, ...) and ``cloud`` (a run matches when
    any of its attempts ran there, so a spot run that fell back to on-demand is found under both,
    and its totals keep every attempt). Empty: no filter. ``cloudtrain costs`` and the Cloud training
    page both filter here, so their totals agree."""
    records = list(records)
    by_run: dict[str, list[CostRecord]] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(r)
    keep = set()
    for run_id, attempts in by_run.items():
        last = max(attempts, key=lambda r: (r.released_at, r.launched_at or 0.0))
        if dag and last.dag_id != dag:
            continue
        if state and last.state != state:
            continue
        if cloud and all(r.cloud != cloud for r in attempts):
            continue
        keep.add(run_id)
    return [r for r in records if r.run_id in keep]


def totals(records: Iterable[CostRecord], by: str) -> list[dict[str, Any]]:
    """Rows per ``by`` (dag, task, day, week or cloud): attempts, runs, interruptions, cost; costliest
    first, or in time order for days and weeks."""
    groups: dict[str, dict[str, Any]] = {}
    for r in records:
        name = {
            "dag": r.dag_id,
            "task": f"{r.dag_id}.{r.task_id}",
            "day": r.day,
            "week": r.week,
            "cloud": r.cloud,
        }[by]
        row = groups.setdefault(
            name, {by: name, "runs": set(), "attempts": 0, "interruptions": 0, "cost_usd": 0.0}
        )
        row["runs"].add(r.run_id)
        row["attempts"] += 1
        row["interruptions"] += int(r.interrupted)
        row["cost_usd"] += float(r.cost_usd or 0.0)
    rows = [
        {**row, "runs": len(row["runs"]), "cost_usd": round(row["cost_usd"], 6)} for row in groups.values()
    ]
    key = (lambda row: row[by]) if by in CHRONOLOGICAL else (lambda row: -row["cost_usd"])
    return sorted(rows, key=key)


def grand_total(records: Iterable[CostRecord], by: str) -> dict[str, Any]:
    """The TOTAL row under ``totals``: what ``cloudtrain costs`` prints last and the Cloud training page
    shows (one function, so the two agree)."""
    records = list(records)
    return {
        by: "TOTAL",
        "runs": len({r.run_id for r in records}),
        "attempts": len(records),
        "interruptions": sum(int(r.interrupted) for r in records),
        "cost_usd": round(sum(float(r.cost_usd or 0.0) for r in records), 6),
    }


def fleet_record(result: dict[str, Any], key: RunKey, ended_at: float, operator: str = "") -> CostRecord:
    """A fleet's (or group's) whole run as one record: its group stands in for the instance."""
    return CostRecord(
        dag_id=key.dag_id,
        task_id=key.task_id,
        airflow_run_id=key.run_id,
        map_index=key.map_index,
        run_id=str(result["run_id"]),
        run_uri=str(result.get("run_uri") or ""),
        cloud=str(result.get("cloud") or ""),
        instance_id=str(result.get("group") or "group"),
        instance_type=result.get("instance_type"),
        num_nodes=int(result.get("workers_launched") or 0),
        spot=str(result.get("cloud") or "").endswith("spot"),
        state="failed" if result.get("items_failed") else "succeeded",
        interrupted=bool(result.get("interruptions")),
        launched_at=ended_at - float(result.get("duration_s") or 0.0),
        released_at=ended_at,
        cost_usd=result.get("cost_usd"),
        cost_basis=str(result.get("cost_basis") or ""),
        operator=operator,
    )


def vertex_record(result: dict[str, Any], key: RunKey, ended_at: float) -> CostRecord:
    """A Vertex AI job as one record: its replicas stand in for the instances (an estimate). Its
    "instance" is the job's numeric id: a retry's job has the same job id (display name) as the
    failed one before it, and each must keep its own row."""
    replicas = result.get("replicas") or []
    numeric = str(result.get("job_name") or "").rsplit("/", 1)[-1]
    return CostRecord(
        dag_id=key.dag_id,
        task_id=key.task_id,
        airflow_run_id=key.run_id,
        map_index=key.map_index,
        run_id=str(result.get("job_id") or ""),
        run_uri=str(result.get("job_dir") or ""),
        cloud="vertex",
        instance_id=numeric or str(result.get("job_id") or "job"),
        instance_type=(replicas[0].get("machine_type") if replicas else None),
        num_nodes=sum(int(r.get("count") or 0) for r in replicas),
        spot=bool(result.get("spot")),
        state=str(result.get("state") or ""),
        interrupted=False,
        launched_at=ended_at - float(result.get("duration_s") or 0.0),
        released_at=ended_at,
        cost_usd=result.get("cost_usd"),
        cost_basis=str(result.get("cost_basis") or ""),
        operator="MLEngineTrainOperator",
    )

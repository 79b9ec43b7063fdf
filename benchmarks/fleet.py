"""Queue-driven scaling vs a fixed group: what does SpotFleetOperator's scaling save, and what does it cost?

One DAG run per mode on the emulated EC2 (moto's SQS, Auto Scaling and S3 on loopback; each worker is
the real agent as a local process), inside real Airflow (``dag.test()``). ``--items`` items (default
100; 20 with ``--quick``), each the command ``sleep --length`` (default 2 s), run under
``SpotFleetOperator`` (ec2spot, ``poll_interval=--poll-interval``, ``live_prices=False``):

  (a) queue-driven scaling: ``num_workers=1, max_workers=8``. The operator raises the group's desired
      capacity to min(8, visible + in-flight messages) each poll; a worker that finds the queue empty
      (two empty receives in a row) leaves with "decrement desired capacity".
  (b) a fixed group of 8: ``num_workers=8, max_workers=8``. The operator cannot keep idle workers (they
      leave by themselves), so the run is the same eight workers from the start, and a true fixed
      group (one that keeps its workers until the queue is drained) is accounted for from it: every
      one of its eight workers is counted from its own start until the queue is drained (and, in a
      second row, until the operator deletes the group).

Everything is read back from the run, not from the script's clock: the run folder's
``fleet/enqueued.json`` (``started_at``: the items were queued), ``outcomes/<id>.json`` (each item's
``started_at``/``ended_at`` on its worker) and ``workers/<instance-id>.json`` (each worker's
``started_at``/``ended_at``: its agent's start, and its leaving), and the XCom (``workers_launched``,
``duration_s``, ``cost_usd``).

  time to drain     last outcome's ended_at - enqueued started_at (queue, template and group made,
                    workers booted, every item run)
  worker-seconds    (a) and (b) as run: the sum of each worker's ended_at - started_at (a worker the
                    teardown ended before it could leave: until the operator's DeleteAutoScalingGroup);
                    fixed group, kept until drained: the sum over its 8 workers of (queue drained - the
                    worker's started_at), i.e. 8 x the time to drain less the time before the group's
                    workers were up: a lower bound, since a real fixed group also lives on from the
                    drain until the operator notices it (next poll) and deletes the group;
                    fixed group, kept until the group is deleted: the same up to the operator's
                    DeleteAutoScalingGroup request (what a fixed group under this operator costs)
  workers launched  the XCom's workers_launched (the run's EC2 instances the operator's polls saw); when
                    more workers wrote a record than that (one launched after the last poll), the
                    cell says how many ran
  AWS calls / min   requests per minute while the operator waited (its first to its last poll, i.e.
                    GetQueueAttributes), split between the operator and the workers (below); the
                    one-off setup and teardown calls are in the per-operation table the script prints
                    (over the whole DAG run), and so is each side's count per operation
  per-item overhead item run - job: mean of an outcome's ended_at - started_at, less the job's length
                    (the agent's work around one item: spec, folder, logs, outcome, lease);
                    worker-s / item - job: worker-seconds / items, less the job's length (what an item
                    costs beyond its own run: boot, per-item work, idle waits, the tail)

Calls by whom: ``emu.request_counts()`` counts requests per operation from all clients, so it cannot
split the S3 operations both sides make (ListObjectsV2, GetObject, PutObject). The script therefore
tags the operator's clients: after the emulator has started (the workers' environment is fixed then)
it sets ``AWS_SDK_UA_APP_ID`` in its own process, so every botocore client the operator makes sends
``app/cloudtrain-fleet-operator`` in its User-Agent, and it tallies each request by (caller, operation)
in front of moto's app. Requests without the tag are the workers'. The tallies are checked against
``request_counts()`` (same totals); should the tap be unavailable, the split falls back to the
operations only one side makes (operator: GetQueueAttributes, DescribeAutoScalingGroups,
DescribeInstances, SetDesiredCapacity, ...; workers: ReceiveMessage, ChangeMessageVisibility,
DeleteMessage, ...) with S3 as "shared", and the rates are over the whole DAG run, as the output then
says.

The emulator boots a worker in well under a second; on EC2 every launch adds about a minute of billed
boot, which counts against the mode that launches more workers. Worker-seconds here start at the
agent's start, so boot is not in them.

    python benchmarks/fleet.py [--items 100] [--length 2] [--quick] [--poll-interval 1] [--verbose]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import textwrap
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BUCKET = "s3://cloudtrain-emulated/fleet-bench"
MAX_WORKERS = 8
OPERATOR_APP_ID = "cloudtrain-fleet-operator"  # sent as "app/<id>" in the operator's User-Agent
MODES = {  # key -> (label, num_workers, max_workers)
    "scaling": ("(a) queue-driven scaling, 1 -> 8", 1, MAX_WORKERS),
    "fixed": ("(b) fixed group of 8", MAX_WORKERS, MAX_WORKERS),
}
# Operations only one side makes (the fallback split when the client tap is unavailable).
OPERATOR_OPS = frozenset(
    {
        "GetQueueAttributes",
        "DescribeAutoScalingGroups",
        "DescribeInstances",
        "SetDesiredCapacity",
        "CreateQueue",
        "GetQueueUrl",
        "DeleteQueue",
        "SendMessageBatch",
        "CreateLaunchTemplate",
        "DescribeLaunchTemplates",
        "DeleteLaunchTemplate",
        "CreateAutoScalingGroup",
        "UpdateAutoScalingGroup",
        "DeleteAutoScalingGroup",
        "DescribeAvailabilityZones",
        "DescribeImages",
        "TerminateInstances",
    }
)
WORKER_OPS = frozenset(
    {
        "ReceiveMessage",
        "ChangeMessageVisibility",
        "DeleteMessage",
        "SendMessage",
        "SetInstanceProtection",
        "TerminateInstanceInAutoScalingGroup",
    }
)


# -- who made a request ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    at: float  # when it arrived (time.time())
    who: str  # "operator" or "workers"
    operation: str
    status: int  # the HTTP status of the answer (0: none seen)


class ClientTap:
    """Records the emulated AWS's requests as (time, caller, operation, status), caller "operator"
    when the User-Agent carries the operator's app id, else "workers". It wraps the app behind the
    emulator's counting middleware and skips the emulator's own requests, so it sees what
    ``request_counts()`` counts (nothing is throttled here)."""

    def __init__(self, emu: Any) -> None:
        from airflow_cloudtrain.emulator.aws import wire
        from airflow_cloudtrain.emulator.faults import is_own

        self.wire, self.is_own = wire, is_own
        self.lock = threading.Lock()
        self.requests: list[Request] = []
        self.middleware = emu.moto.middleware
        self.inner = self.middleware.app
        self.middleware.app = self

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        agent = environ.get("HTTP_USER_AGENT", "")
        if self.is_own(agent):
            return self.inner(environ, start_response)
        at, operation = time.time(), "?"
        with contextlib.suppress(Exception):  # counting must never break a request
            operation = self._operation(environ)
        who = "operator" if OPERATOR_APP_ID in agent else "workers"
        seen: list[int] = []

        def start(status: str, headers: Any, exc_info: Any = None) -> Any:
            with contextlib.suppress(ValueError, IndexError):
                seen.append(int(status.split()[0]))
            return start_response(status, headers, exc_info)

        try:
            return self.inner(environ, start)
        finally:
            with self.lock:
                self.requests.append(Request(at, who, operation, seen[-1] if seen else 0))

    def _operation(self, environ: dict[str, Any]) -> str:
        form: dict[str, list[str]] = {}
        stream = environ.get("wsgi.input")
        if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded") and hasattr(
            stream, "getvalue"
        ):  # the middleware read the body and left a BytesIO: read it without consuming it
            form = urllib.parse.parse_qs(stream.getvalue().decode(errors="replace"))
        return self.wire.classify(environ, form).operation

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    def snapshot(self) -> list[Request]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.middleware.app = self.inner


def split_by_operation(counts: dict[str, int]) -> Counter[tuple[str, str]]:
    """The fallback: (caller, operation) from the operations only one side makes; the rest "shared"."""
    out: Counter[tuple[str, str]] = Counter()
    for operation, n in counts.items():
        if operation.startswith("throttled:"):
            continue
        who = "operator" if operation in OPERATOR_OPS else "workers" if operation in WORKER_OPS else "shared"
        out[(who, operation)] += n
    return out


# -- one run ------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    mode: str
    state: str
    wall_s: float  # the DAG run, setup to teardown
    xcom: dict[str, Any]
    calls: Counter[tuple[str, str]]  # (caller, operation) -> requests over the DAG run
    counted_total: int  # emu.request_counts() over the same window
    tapped: bool  # calls split by the client tap (else by operation)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # answered 5xx
    wait_s: float | None = None  # first to last operator poll (GetQueueAttributes)
    wait_calls: Counter[str] = field(default_factory=Counter)  # caller -> requests within the wait
    group_deleted_at: float | None = None  # the operator's DeleteAutoScalingGroup request
    enqueued_at: float | None = None
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    left: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def dag_source(dag_id: str, mode: str, args: argparse.Namespace) -> str:
    _, num_workers, max_workers = MODES[mode]
    items = [{"n": n} for n in range(args.items)]
    return textwrap.dedent(
        f"""
        from datetime import datetime

        from airflow.sdk import DAG

        from airflow_cloudtrain.operators import SpotFleetOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            SpotFleetOperator(
                task_id="sweep",
                cloud="ec2spot",
                region="us-east-1",
                cpus=2,
                ram="4g",
                command="sleep {args.length:g}",
                bucket={BUCKET!r},
                work_items={items!r},
                num_workers={num_workers},
                max_workers={max_workers},
                poll_interval={args.poll_interval:g},
                live_prices=False,
                max_runtime="30m",
            )
        """
    )


def load_dag(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"fleet_bench_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def read_json_folder(folder: Any, prefix: str) -> list[dict[str, Any]]:
    out = []
    for key in sorted(folder.list(prefix + "/")):
        raw = folder.get_text(key) if key.endswith(".json") else None
        if raw:
            out.append(json.loads(raw))
    return out


def run_mode(emu: Any, tap: ClientTap | None, dags: Path, mode: str, args: argparse.Namespace) -> RunResult:
    from airflow_cloudtrain.contract import workqueue
    from airflow_cloudtrain.lifecycle.fleet.run import ENQUEUED_KEY
    from airflow_cloudtrain.storage import open_run_folder

    dag_id = f"fleet_bench_{mode}_{int(time.time())}"
    path = dags / f"{dag_id}.py"
    path.write_text(dag_source(dag_id, mode, args))
    dag = load_dag(path)
    emu.reset_counts()
    if tap is not None:
        tap.reset()
    began = time.monotonic()
    run = dag.test()
    wall = time.monotonic() - began
    counts = emu.request_counts()
    requests = tap.snapshot() if tap is not None else None
    counted = sum(n for op, n in counts.items() if not op.startswith("throttled:"))
    ti = run.get_task_instance("sweep")
    xcom = (ti.xcom_pull(task_ids="sweep") if ti is not None else None) or {}
    if requests is None:
        res = RunResult(mode, str(run.state), wall, xcom, split_by_operation(counts), counted, False)
    else:
        calls = Counter((r.who, r.operation) for r in requests)
        res = RunResult(mode, str(run.state), wall, xcom, calls, counted, True)
        res.errors = Counter((r.who, r.operation) for r in requests if r.status >= 500)
        polls = [r.at for r in requests if r.who == "operator" and r.operation == "GetQueueAttributes"]
        if len(polls) >= 2:
            first, last = min(polls), max(polls)
            res.wait_s = last - first
            res.wait_calls = Counter(r.who for r in requests if first <= r.at <= last)
        deletes = [r.at for r in requests if r.who == "operator" and r.operation == "DeleteAutoScalingGroup"]
        res.group_deleted_at = min(deletes) if deletes else None
        if len(requests) != counted:
            res.notes.append(f"the tap saw {len(requests)} requests, request_counts() {counted}")
    if xcom.get("run_uri"):
        folder = open_run_folder(xcom["run_uri"])
        marker = json.loads(folder.get_text(ENQUEUED_KEY) or "{}")
        res.enqueued_at = marker.get("started_at")
        res.outcomes = read_json_folder(folder, workqueue.OUTCOMES_PREFIX)
        res.workers = read_json_folder(folder, workqueue.WORKERS_PREFIX)
    else:
        res.notes.append("no XCom: the task failed")
    # the operator tore the group down before it returned; give the machines a moment to go
    deadline = time.monotonic() + 20
    res.left = emu.running_instances()
    while res.left and time.monotonic() < deadline:
        time.sleep(0.3)
        res.left = emu.running_instances()
    for inst in res.left:  # a leak fails the benchmark; end it so nothing keeps running
        emu.interrupt(inst["id"], notice_s=0)
    return res


# -- the numbers --------------------------------------------------------------------------------------


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def drained_at(res: RunResult) -> float | None:
    ends = [float(o["ended_at"]) for o in res.outcomes if o.get("ended_at") is not None]
    return max(ends) if ends else None


def worker_seconds_as_run(res: RunResult) -> float | None:
    """Each worker from its agent's start to its leaving (one the teardown ended before it could
    leave: to the group's deletion, or without a tap to the drain)."""
    fallback = res.group_deleted_at or drained_at(res)
    spans = []
    for w in res.workers:
        end = w.get("ended_at") or fallback
        if w.get("started_at") is not None and end is not None:
            spans.append(max(0.0, float(end) - float(w["started_at"])))
    return sum(spans) if spans else None


def worker_seconds_fixed(res: RunResult, size: int, end: float | None) -> float | None:
    """A group of ``size`` that keeps its workers until ``end``: its first ``size`` workers, each
    from its own start."""
    starts = sorted(float(w["started_at"]) for w in res.workers if w.get("started_at") is not None)[:size]
    if end is None or not starts:
        return None
    return sum(max(0.0, end - s) for s in starts)


def calls_of(res: RunResult, who: str) -> int:
    return sum(n for (caller, _), n in res.calls.items() if caller == who)


def per_minute(res: RunResult, who: str) -> float | None:
    """``who``'s requests per minute while the operator waited (first to last poll); over the whole
    DAG run when the wait could not be timed (no client tap)."""
    if res.wait_s:
        return res.wait_calls.get(who, 0) * 60.0 / res.wait_s
    return calls_of(res, who) * 60.0 / res.wall_s if res.wall_s else None


@dataclass
class Row:
    label: str
    workers: str
    drain_s: float | None
    worker_s: float | None
    launched: str
    operator_per_min: float | None
    workers_per_min: float | None
    item_run_overhead_s: float | None
    billed_overhead_s: float | None


def rows_of(results: dict[str, RunResult], args: argparse.Namespace) -> list[Row]:
    rows = []
    for mode, res in results.items():
        label, start, top = MODES[mode]
        end = drained_at(res)
        drain = end - float(res.enqueued_at) if end is not None and res.enqueued_at else None
        spans = [
            float(o["ended_at"]) - float(o["started_at"])
            for o in res.outcomes
            if o.get("started_at") is not None and o.get("ended_at") is not None
        ]
        item_run = mean(spans)
        item_run_overhead = None if item_run is None else item_run - args.length
        as_run = worker_seconds_as_run(res)
        launched = cell(res.xcom.get("workers_launched"))
        if len(res.workers) != res.xcom.get("workers_launched"):
            launched += f" ({len(res.workers)} ran)"
        per_min = (per_minute(res, "operator"), per_minute(res, "workers"))
        if mode == "fixed":
            kept = [("kept until drained", end)]
            if res.group_deleted_at:
                kept.append(("kept until the group is deleted", res.group_deleted_at))
            for how, until in kept:
                fixed = worker_seconds_fixed(res, top, until)
                rows.append(
                    Row(
                        f"{label}, {how}",
                        f"{top}",
                        drain,
                        fixed,
                        launched,
                        *per_min,
                        item_run_overhead,
                        None if fixed is None else fixed / args.items - args.length,
                    )
                )
            label = f"{label} as run (idle ones leave)"
        rows.append(
            Row(
                label,
                f"{start}..{top}" if start != top else f"{top}",
                drain,
                as_run,
                launched,
                *per_min,
                item_run_overhead,
                None if as_run is None else as_run / args.items - args.length,
            )
        )
    return rows


# -- the report ---------------------------------------------------------------------------------------


def cell(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


COLUMNS = (  # (title, right-aligned)
    ("scaling", False),
    ("workers", True),
    ("time to drain (s)", True),
    ("worker-seconds", True),
    ("workers launched", True),
    ("operator calls/min", True),
    ("worker calls/min", True),
    ("item run - job (s)", True),
    ("worker-s/item - job (s)", True),
)


def markdown(columns: tuple[tuple[str, bool], ...], rows: list[list[str]]) -> list[str]:
    """A markdown table, every column as wide as its widest cell."""
    widths = [max(len(title), *(len(r[i]) for r in rows)) for i, (title, _) in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if right else c.ljust(w)
                for c, w, (_, right) in zip(cells, widths, columns, strict=True)
            )
            + " |"
        )

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if right else "-" * (w + 2)
            for w, (_, right) in zip(widths, columns, strict=True)
        )
        + "|"
    )
    return [
        line([t.ljust(w) if not r else t.rjust(w) for (t, r), w in zip(columns, widths, strict=True)]),
        rule,
        *(line(r) for r in rows),
    ]


def print_table(rows: list[Row]) -> None:
    cells = [
        [
            r.label,
            r.workers,
            cell(r.drain_s),
            cell(r.worker_s, 0),
            r.launched,
            cell(r.operator_per_min),
            cell(r.workers_per_min),
            cell(r.item_run_overhead_s, 2),
            cell(r.billed_overhead_s, 2),
        ]
        for r in rows
    ]
    print("\n".join(markdown(COLUMNS, cells)))


def print_calls(results: dict[str, RunResult]) -> None:
    """Requests per operation and caller, per run: where the calls per minute come from."""
    ops = sorted({op for res in results.values() for (_, op) in res.calls})
    callers = sorted({who for res in results.values() for (who, _) in res.calls})
    pairs = [(mode, who) for mode in results for who in callers]
    columns = (("operation", False), *((f"{mode}: {who}", True) for mode, who in pairs))
    rows = [[op, *(str(results[m].calls.get((who, op), 0)) for m, who in pairs)] for op in ops]
    rows.append(["total", *(str(calls_of(results[m], who)) for m, who in pairs)])
    print("\nAWS requests per operation and caller over each DAG run (setup, wait, teardown)")
    print("\n".join(markdown(columns, rows)))
    for mode, res in results.items():
        polls = res.calls.get(("operator", "GetQueueAttributes"), 0)
        wait = (
            f"wait {res.wait_s:.1f} s: {res.wait_calls.get('operator', 0)} operator requests "
            f"({res.wait_calls.get('operator', 0) / max(1, polls - 1):.1f} per poll), "
            f"{res.wait_calls.get('workers', 0)} worker requests"
            if res.wait_s
            else "the wait not timed"
        )
        print(
            f"  {mode}: {res.wall_s:.0f} s DAG run, {polls} operator poll(s) (GetQueueAttributes), {wait}; "
            f"request_counts() total {res.counted_total}"
            + ("" if res.tapped else " (split by operation: the client tap was unavailable)")
        )
        if res.errors:
            print(
                "    answered 5xx: "
                + ", ".join(f"{op} ({who}) x{n}" for (who, op), n in sorted(res.errors.items()))
            )


def print_runs(results: dict[str, RunResult], args: argparse.Namespace) -> None:
    for mode, res in results.items():
        x = res.xcom
        end = drained_at(res)
        t0 = float(res.enqueued_at) if res.enqueued_at else None
        starts = sorted(float(w["started_at"]) for w in res.workers if w.get("started_at") is not None)
        first = cell(starts[0] - t0) if starts and t0 else "n/a"
        print(
            f"  {mode}: {res.state}; {x.get('items_succeeded', 'n/a')}/{x.get('items_total', 'n/a')} items, "
            f"{x.get('workers_launched', 'n/a')} workers launched ({len(res.workers)} worker records), "
            f"first worker up {first} s after queueing, drained {cell(end - t0 if end and t0 else None)} s, "
            f"XCom duration_s {x.get('duration_s', 'n/a')}, cost_usd {x.get('cost_usd', 'n/a')}, "
            f"instances left {len(res.left)}"
        )
        for note in res.notes:
            print(f"    note: {note}")
        if args.verbose and t0:
            for w in sorted(res.workers, key=lambda w: float(w.get("started_at") or 0)):
                ended = w.get("ended_at")
                print(
                    f"    worker {w.get('instance_id')}: {float(w['started_at']) - t0:6.1f} .. "
                    f"{cell(float(ended) - t0 if ended else None):>6} s, {len(w.get('items') or [])} item(s), "
                    f"{w.get('state')}"
                )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=100, help="work items per run")
    p.add_argument("--length", type=float, default=2.0, help="seconds each item runs (sleep)")
    p.add_argument("--quick", action="store_true", help="a fast check: 20 items")
    p.add_argument("--poll-interval", type=float, default=1.0, help="the operator's poll (0.5..1)")
    p.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(MODES))
    p.add_argument("--verbose", action="store_true", help="also each worker's start, end and items")
    args = p.parse_args(argv)
    if args.quick:
        args.items = 20
    if args.items < 1 or args.length < 0 or args.poll_interval <= 0:
        p.error("need --items >= 1, --length >= 0 and --poll-interval > 0")
    return args


def prepare_airflow_home() -> Path:
    """An isolated, temporary AIRFLOW_HOME with a migrated DB and a DAGs folder of its own (as
    benchmarks/recovery.py), removed at exit."""
    home = Path(tempfile.mkdtemp(prefix="cloudtrain-fleet-bench-"))
    atexit.register(shutil.rmtree, home, True)
    dags = home / "dags"
    dags.mkdir()
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # the table, not the task logs
    os.environ.setdefault("CLOUDTRAIN_CACHE_DIR", str(home / "cache"))
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SDK_UA_APP_ID"):
        os.environ.pop(var, None)
    from airflow.utils import db

    db.initdb()
    return dags


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # moto's server logs each request it answers with a 500 with a traceback: the 5xx are counted
    # and listed instead (a worker leaving a group the teardown already deleted gets one)
    logging.getLogger("werkzeug").addFilter(lambda record: record.levelno < logging.ERROR)
    began = time.monotonic()
    dags = prepare_airflow_home()
    from airflow_cloudtrain.emulator import Emulator

    print(
        f"Fleet benchmark: SpotFleetOperator on the emulated EC2, {args.items} items of 'sleep "
        f"{args.length:g}', poll_interval {args.poll_interval:g} s; (a) num_workers=1, max_workers="
        f"{MAX_WORKERS}; (b) num_workers={MAX_WORKERS}, max_workers={MAX_WORKERS}; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[str, RunResult] = {}
    with Emulator() as emu:
        try:
            tap: ClientTap | None = ClientTap(emu)
        except Exception as err:
            print(f"  (no client tap: {type(err).__name__}: {err}; splitting calls by operation)")
            tap = None
        # the workers' environment was fixed when the emulator started: only our clients get the tag
        os.environ["AWS_SDK_UA_APP_ID"] = OPERATOR_APP_ID
        try:
            for mode in args.modes:
                print(f"\n=== {MODES[mode][0]} ===", flush=True)
                res = run_mode(emu, tap, dags, mode, args)
                results[mode] = res
                print(f"  dag run {res.state} in {res.wall_s:.0f} s", flush=True)
        finally:
            os.environ.pop("AWS_SDK_UA_APP_ID", None)
            if tap is not None:
                tap.close()
    print()
    print_runs(results, args)
    print_calls(results)
    print(
        f"\nFleet: queue-driven scaling vs a fixed group ({args.items} items of {args.length:g} s, "
        f"poll_interval {args.poll_interval:g} s)\n"
    )
    print_table(rows_of(results, args))
    failed = [
        mode
        for mode, res in results.items()
        if res.state != "success"
        or res.left
        or res.xcom.get("items_succeeded") != args.items
        or len(res.outcomes) != args.items
    ]
    print(f"\nwall time {time.monotonic() - began:.0f} s, load average {os.getloadavg()[0]:.1f}")
    if failed:
        print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

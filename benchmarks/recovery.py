"""How fast does a CheckpointResumeOperator run recover from a spot interruption, and how much training
does it lose? Measured on the emulated clouds, inside real Airflow (``dag.test()``).

For each (cloud, notice mode) one DAG runs ``tests/cloud/jobs/steps.py`` (a step every ``--step-s``,
a checkpoint every ``--every`` steps and on SIGTERM) under ``CheckpointResumeOperator``
(``checkpoint_interval=5``: the agent uploads the newest checkpoint every 5 s; ``poll_interval=1``).
A background thread interrupts each new instance once its job has printed a few steps past the step
it resumed from (a seeded random count in ``--at-steps``), ``--interruptions`` times per run: with a
notice (``emu.interrupt(id, notice_s=--notice-s)``, visible to the agent in the instance metadata,
which it polls every 5 s; the cloud reclaims the instance at the end of the notice) or without one
(``notice_s=0``: the instance is gone at once). The thread records the wall time of its call; every
delay below counts from that call (what a user experiences), and the agent's own observation of the
notice (``interruption.notice_at`` in the instance's ``status.json``) is reported beside it.

Per interruption, from the call:
  notice seen      interruption.notice_at                  (with a notice only)
  (a) job stopped  interruption.job_stopped_at             (with a notice only)
  (b) checkpoint   interruption.checkpoint_at: final checkpoint's manifest written (with a notice only)
  (c) relaunch     the next attempt's requested_at: its first create call sent
  (d) resumed      the next attempt's job_started_at
  lost (steps)     (highest "step N" the interrupted job printed - next attempt's restored_step) x step time
  lost (ledger)    the interrupted attempt's work_lost_s in the operator's ledger

Goals: replacement launch issued within 30 s of the interruption at p95; at most 10 s of training
lost per interruption with a notice (judged on the max).

    python benchmarks/recovery.py [--interruptions 3] [--quick] [--notice-s 20] [--deferrable]
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
JOBS = ROOT / "tests" / "cloud" / "jobs"

CLOUDS = {  # cloud -> (bucket prefix, region)
    "ec2spot": ("s3://cloudtrain-emulated/recovery-bench", "us-east-1"),
    "gcspot": ("gs://cloudtrain-emulated/recovery-bench", "us-central1"),
}
RELAUNCH_GOAL_S = 30.0  # replacement launch issued within this, p95
LOST_GOAL_S = 10.0  # training lost per interruption with a notice, at most
METADATA_POLL_S = 5.0  # RunSpec.metadata_poll_s: how often the agent reads the instance metadata
CHECKPOINT_INTERVAL_S = 5  # seconds between the agent's checkpoint uploads
POLL_INTERVAL_S = 1  # the operator's poll of status and instance

STEP_RE = re.compile(r"^step (\d+) at", re.MULTILINE)
RESUMED_RE = re.compile(r"^resumed from step (\d+)", re.MULTILINE)

# (key, label) of the per-interruption measures, in table order.
MEASURES = (
    ("notice_seen", "notice seen by the agent"),
    ("job_stopped", "(a) job stopped"),
    ("checkpoint", "(b) checkpoint complete"),
    ("relaunch", "(c) replacement launch issued"),
    ("resumed", "(d) job resumed"),
    ("lost_steps", "training lost (steps x step time)"),
    ("lost_ledger", "training lost (ledger work_lost_s)"),
)


# -- pure helpers (tests/unit/test_recovery_bench.py) --------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q={q!r} is not in 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: list[float | None]) -> dict[str, float | int] | None:
    """n, p50, p95 and max of the values that are there (None: not measured); None when none are."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return {
        "n": len(present),
        "p50": percentile(present, 50),
        "p95": percentile(present, 95),
        "max": max(present),
    }


def highest_step(log_text: str) -> int | None:
    """The highest ``step N`` a steps.py job printed, None before its first step."""
    steps = [int(m) for m in STEP_RE.findall(log_text)]
    return max(steps) if steps else None


def resumed_step(log_text: str) -> int | None:
    """The step a steps.py job started from: 0 on a fresh start, None before it said."""
    if match := RESUMED_RE.search(log_text):
        return int(match.group(1))
    return 0 if "fresh start" in log_text else None


def since(at: Any, origin: float) -> float | None:
    """Seconds from ``origin`` to ``at`` (a unix time, or None / garbage: not measured)."""
    try:
        return None if at is None else float(at) - origin
    except (TypeError, ValueError):
        return None


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("MET" if ok else "NOT MET")


# -- the run ------------------------------------------------------------------------------------------


@dataclass
class Interruption:
    instance_id: str
    called_at: float  # wall time of our emu.interrupt() call
    step_at_call: int
    measures: dict[str, float | None] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


class Interrupter(threading.Thread):
    """Interrupts each new instance once its job printed ``at_steps[i]`` steps past its start."""

    def __init__(self, emu: Any, at_steps: list[int], notice_s: float) -> None:
        super().__init__(daemon=True, name="interrupter")
        self.emu, self.at_steps, self.notice_s = emu, at_steps, notice_s
        self.done: list[Interruption] = []
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._seen: set[str] = set()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while len(self.done) < len(self.at_steps) and not self._stop_event.is_set():
            try:
                self._round()
            except Exception as err:  # a bench thread must not die silently
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop_event.wait(0.05)

    def _round(self) -> None:
        for inst in self.emu.running_instances():
            if inst["id"] in self._seen or len(self.done) >= len(self.at_steps):
                continue
            text = self.emu.agent_log(inst["id"])
            start, top = resumed_step(text), highest_step(text)
            if start is None or top is None or top - start < self.at_steps[len(self.done)]:
                continue
            self._seen.add(inst["id"])
            called = time.time()
            self.emu.interrupt(inst["id"], notice_s=self.notice_s)
            self.done.append(Interruption(inst["id"], called, top))


def dag_source(dag_id: str, cloud: str, steps: int, args: argparse.Namespace) -> str:
    bucket, region = CLOUDS[cloud]
    return textwrap.dedent(
        f"""
        from datetime import datetime

        from airflow.sdk import DAG

        from airflow_cloudtrain.operators import CheckpointResumeOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            CheckpointResumeOperator(
                task_id="train",
                cloud={cloud!r},
                region={region!r},
                cpus=2,
                ram="4g",
                code={str(JOBS)!r},
                command="python3 steps.py {steps} {args.every} {args.step_s}",
                bucket={bucket!r},
                live_prices=False,
                checkpoint_interval={CHECKPOINT_INTERVAL_S},
                poll_interval={POLL_INTERVAL_S},
                max_restarts={args.interruptions + 5},
                max_runtime="30m",
                deferrable={bool(args.deferrable)},
            )
        """
    )


def load_dag(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"recovery_bench_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def run_folder_log(folder: Any, instance_id: str) -> str:
    """The instance's job log in the run folder, as the job printed it (without the agent's per-line
    stamps, so ``STEP_RE`` / ``RESUMED_RE`` match at line starts)."""
    from airflow_cloudtrain.contract.runs import log_prefix, strip_stamps

    keys = sorted(folder.list(log_prefix(instance_id)))
    return strip_stamps("".join(folder.get_text(key) or "" for key in keys))


def read_status(folder: Any, instance_id: str) -> dict[str, Any]:
    from airflow_cloudtrain.contract.runs import status_key

    text = folder.get_text(status_key(instance_id))
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def read_ledger(result: dict[str, Any] | None, folder_uri: str, dag_id: str) -> dict[str, Any]:
    """The ledger: from the XCom, else (the task failed) from the ledger/ file in the DAG's run folder."""
    if result and result.get("attempts"):
        return {"run_uri": result["run_uri"], "attempts": result["attempts"]}
    from airflow_cloudtrain.storage import open_run_folder

    root = open_run_folder(folder_uri)
    for key in root.list(""):
        if key.startswith(f"runs/{dag_id}/") and "/ledger/" in key and key.endswith(".json"):
            data = json.loads(root.get_text(key) or "{}")
            return {"run_uri": data.get("run_uri"), "attempts": data.get("attempts", [])}
    return {"run_uri": None, "attempts": []}


def measure(emu: Any, hit: Interruption, ledger: dict[str, Any], notice: bool, step_s: float) -> None:
    """Fill ``hit.measures`` from the run folder, the emulator's logs and the ledger."""
    from airflow_cloudtrain.storage import open_run_folder

    rows = ledger["attempts"]
    folder = open_run_folder(ledger["run_uri"]) if ledger.get("run_uri") else None
    status = read_status(folder, hit.instance_id) if folder else {}
    intr = status.get("interruption") if isinstance(status.get("interruption"), dict) else {}
    at = hit.called_at
    index = next((i for i, r in enumerate(rows) if r.get("instance_id") == hit.instance_id), None)
    row = rows[index] if index is not None else {}
    later = rows[index + 1 :] if index is not None else []
    relaunch = next((r for r in later if r.get("requested_at")), {})
    following = next((r for r in later if r.get("instance_id")), {})

    logs = emu.agent_log(hit.instance_id) + (run_folder_log(folder, hit.instance_id) if folder else "")
    reached = highest_step(logs)
    restored = following.get("restored_step")
    if following and restored is None:
        restored = 0  # the next attempt restored nothing: it started over
    lost_steps = None if reached is None or not following else (reached - restored) * step_s
    hit.measures = {
        "notice_seen": since(intr.get("notice_at"), at) if notice else None,
        "job_stopped": since(intr.get("job_stopped_at"), at) if notice else None,
        "checkpoint": since(intr.get("checkpoint_at"), at) if notice else None,
        "relaunch": since(relaunch.get("requested_at"), at),
        "resumed": since(following.get("job_started_at"), at),
        "lost_steps": lost_steps,
        "lost_ledger": row.get("work_lost_s"),
    }
    hit.facts = {
        "ended": row.get("ended", "n/a"),
        "reached": reached,
        "restored": restored,
        "interruption_fields": sorted(intr),
    }


@dataclass
class ModeResult:
    cloud: str
    notice: bool
    state: str
    wall_s: float
    hits: list[Interruption]
    left: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    notes: list[str]
    started_at: float  # wall time the DAG run began


def run_mode(emu: Any, dags: Path, cloud: str, notice: bool, args: argparse.Namespace) -> ModeResult:
    rng = random.Random(f"{args.seed}-{cloud}-{notice}")
    lo, hi = args.at_steps
    at_steps = [rng.randint(lo, hi) for _ in range(args.interruptions)]
    # Just enough steps that the job cannot finish before the last interruption: an attempt keeps
    # at most HI steps (+1 step the interrupter may miss) and, with a notice, the steps until the
    # agent's next metadata poll and one more after SIGTERM.
    margin = math.ceil((METADATA_POLL_S + 1.0) / args.step_s) + 2 if notice else 2
    steps = (args.interruptions - 1) * (hi + margin) + hi + 4
    dag_id = f"recovery_{cloud}_{'notice' if notice else 'no_notice'}_{int(time.time())}"
    path = dags / f"{dag_id}.py"
    path.write_text(dag_source(dag_id, cloud, steps, args))
    dag = load_dag(path)
    interrupter = Interrupter(emu, at_steps, args.notice_s if notice else 0.0)
    began, started_at = time.monotonic(), time.time()
    interrupter.start()
    try:
        run = dag.test()
    finally:
        interrupter.stop()
        interrupter.join(5)
    wall = time.monotonic() - began
    ti = run.get_task_instance("train")
    result = ti.xcom_pull(task_ids="train") if ti is not None else None
    ledger = read_ledger(result, CLOUDS[cloud][0], dag_id)
    notes = list(interrupter.errors)
    if len(interrupter.done) < args.interruptions:
        notes.append(f"only {len(interrupter.done)} of {args.interruptions} interruptions happened")
    for hit in interrupter.done:
        measure(emu, hit, ledger, notice, args.step_s)
        missing = sorted(
            {"notice_at", "job_stopped_at", "checkpoint_at"} - set(hit.facts["interruption_fields"])
        )
        if notice and missing:
            notes.append(f"{hit.instance_id}: status.json interruption has no {', '.join(missing)}")
    left = emu.running_instances()  # the task released every instance before it returned
    for inst in left:  # a leak fails the benchmark; reclaim it so the next run starts clean
        emu.interrupt(inst["id"], notice_s=0)
    return ModeResult(
        cloud, notice, str(run.state), wall, interrupter.done, left, ledger["attempts"], notes, started_at
    )


# -- the report ---------------------------------------------------------------------------------------


def cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def mode_name(notice: bool, notice_s: float) -> str:
    return f"notice {notice_s:g} s" if notice else "no notice"


def goal_of(key: str, notice: bool) -> str:
    if key == "relaunch":
        return f"<= {RELAUNCH_GOAL_S:g} s p95"
    if key == "lost_steps" and notice:
        return f"<= {LOST_GOAL_S:g} s max"
    return ""


def goal_met(key: str, notice: bool, stats: dict[str, float | int] | None) -> bool | None:
    if key == "relaunch":
        return None if stats is None else stats["p95"] <= RELAUNCH_GOAL_S
    if key == "lost_steps" and notice:
        return None if stats is None else stats["max"] <= LOST_GOAL_S
    return None


def print_attempts(res: ModeResult) -> None:
    """The ledger's times, in s from the start of the DAG run: where the wall time went."""

    def at(row: dict[str, Any], key: str) -> str:
        return cell(since(row.get(key), res.started_at))

    for row in res.attempts:
        print(
            f"  attempt {row.get('attempt')}: create call {at(row, 'requested_at')}, instance "
            f"{at(row, 'launched_at')}, job started {at(row, 'job_started_at')}, released "
            f"{at(row, 'ended_at')}: {row.get('ended')} (restored step {row.get('restored_step')}, "
            f"checkpoint step {row.get('checkpoint_step')})"
        )


def print_report(results: list[ModeResult], args: argparse.Namespace) -> bool:
    """The tables; returns whether every goal was met."""
    print(
        "\nPer interruption (times in s from our interrupt call; steps are the job's 'step N' lines)\n"
        "| cloud   | interruption | instance                     | step at call | seen | (a) stop | (b) ckpt "
        "| (c) launch | (d) resumed | reached | restored | lost s | ledger lost s | ended"
    )
    for res in results:
        for hit in res.hits:
            m, f = hit.measures, hit.facts
            print(
                f"| {res.cloud:<7} | {mode_name(res.notice, args.notice_s):<12} | {hit.instance_id:<28} "
                f"| {hit.step_at_call:>12} | {cell(m.get('notice_seen')):>4} | {cell(m.get('job_stopped')):>8} "
                f"| {cell(m.get('checkpoint')):>8} | {cell(m.get('relaunch')):>10} "
                f"| {cell(m.get('resumed')):>11} | {f.get('reached')!s:>7} | {f.get('restored')!s:>8} "
                f"| {cell(m.get('lost_steps')):>6} | {cell(m.get('lost_ledger')):>13} | {f.get('ended')}"
            )

    print(
        "\nRecovery from a spot interruption, seconds from the interruption (our call to the emulator)\n"
        "| cloud   | interruption | measure                            |  n |   p50 |   p95 |   max "
        "| goal          | met     |"
    )
    print(
        "|---------|--------------|------------------------------------|---:|------:|------:|------:"
        "|---------------|---------|"
    )
    all_met = True
    verdicts: list[str] = []
    for res in results:
        for key, label in MEASURES:
            stats = summarize([h.measures.get(key) for h in res.hits])
            n = stats["n"] if stats else 0
            cells = [cell(stats[k]) if stats else "n/a" for k in ("p50", "p95", "max")]
            goal = goal_of(key, res.notice)
            met = goal_met(key, res.notice, stats)
            if goal:
                all_met = all_met and bool(met)
                verdicts.append(
                    f"  {res.cloud:<7} {mode_name(res.notice, args.notice_s):<12} {label}: "
                    f"{goal} -> {verdict(met)}"
                    + (f" (p95 {cell(stats['p95'])}, max {cell(stats['max'])}, n={n})" if stats else "")
                )
            print(
                f"| {res.cloud:<7} | {mode_name(res.notice, args.notice_s):<12} | {label:<34} | {n:>2} "
                f"| {cells[0]:>5} | {cells[1]:>5} | {cells[2]:>5} | {goal:<13} | {verdict(met) if goal else '':<7} |"
            )
    print("\nGoals")
    for line in verdicts:
        print(line)
    samples = sum(len(r.hits) for r in results)
    if samples and max(len(r.hits) for r in results) < 20:
        print(
            f"  (p95 of {max(len(r.hits) for r in results)} sample(s) per cell is close to the max: "
            "run with more --interruptions for a steadier tail)"
        )
    print("  overall: " + ("every goal met" if all_met else "NOT every goal met"))
    return all_met


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interruptions", type=int, default=3, help="interruptions per (cloud, notice mode)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 interruption per mode")
    p.add_argument("--notice-s", type=float, default=20.0, help="notice given before the reclaim")
    p.add_argument("--step-s", type=float, default=0.5, help="seconds per training step of the job")
    p.add_argument("--every", type=int, default=4, help="checkpoint every this many steps")
    p.add_argument(
        "--at-steps",
        type=int,
        nargs=2,
        default=(10, 20),
        metavar=("LO", "HI"),
        help="interrupt once the job stepped a random LO..HI steps past its start",
    )
    p.add_argument("--clouds", nargs="+", choices=sorted(CLOUDS), default=["ec2spot", "gcspot"])
    p.add_argument("--modes", nargs="+", choices=["notice", "no-notice"], default=["notice", "no-notice"])
    p.add_argument("--deferrable", action="store_true", help="run the operator deferrable")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.interruptions = 1
    if args.interruptions < 1 or args.at_steps[0] < 1 or args.at_steps[0] > args.at_steps[1]:
        p.error("need --interruptions >= 1 and 1 <= LO <= HI")
    return args


def prepare_airflow_home() -> Path:
    """An isolated, temporary AIRFLOW_HOME with a migrated DB and a DAGs folder of its own (as
    scripts/demo.py), removed at exit."""
    home = Path(tempfile.mkdtemp(prefix="cloudtrain-recovery-"))
    atexit.register(shutil.rmtree, home, True)  # nothing in it is worth keeping after the tables
    dags = home / "dags"
    dags.mkdir()
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # the tables, not the task logs
    os.environ.setdefault("CLOUDTRAIN_CACHE_DIR", str(home / "cache"))
    from airflow.utils import db

    db.initdb()
    return dags


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    began = time.monotonic()
    dags = prepare_airflow_home()
    from airflow_cloudtrain.emulator import Emulator

    print(
        f"Recovery benchmark: CheckpointResumeOperator (deferrable={bool(args.deferrable)}, "
        f"poll_interval={POLL_INTERVAL_S} s, checkpoint_interval={CHECKPOINT_INTERVAL_S} s) on the emulated "
        f"clouds; job steps.py, {args.step_s:g} s a step, a checkpoint every {args.every} steps "
        f"({args.every * args.step_s:g} s) and on SIGTERM; {args.interruptions} interruption(s) per run, "
        f"each {args.at_steps[0]}..{args.at_steps[1]} steps into an attempt; notice {args.notice_s:g} s "
        f"or none; the agent polls metadata every {METADATA_POLL_S:g} s",
        flush=True,
    )
    results: list[ModeResult] = []
    with Emulator() as emu:
        # the GCS emulator logs every read of a missing object (each status poll before the agent
        # wrote one) at ERROR; it would bury the tables
        logging.getLogger("gcp_storage_emulator.storage").setLevel(logging.CRITICAL)
        for cloud in args.clouds:
            for notice in [m == "notice" for m in args.modes]:
                print(f"\n=== {cloud}, {mode_name(notice, args.notice_s)} ===", flush=True)
                res = run_mode(emu, dags, cloud, notice, args)
                results.append(res)
                print(
                    f"dag run {res.state} in {res.wall_s:.0f} s: {len(res.hits)} interruption(s), "
                    f"{len(res.attempts)} attempt(s) in the ledger; instances still running: "
                    f"{res.left or 'none'}",
                    flush=True,
                )
                print_attempts(res)
                for note in res.notes:
                    print(f"  note: {note}")
    print_report(results, args)
    failed = [r for r in results if r.state != "success" or r.left or len(r.hits) < args.interruptions]
    print(f"\nwall time {time.monotonic() - began:.0f} s")
    if failed:
        print("FAILED: " + ", ".join(f"{r.cloud}/{mode_name(r.notice, args.notice_s)}" for r in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo: the main job (example_dags/ec2_train.py) on the emulated clouds, inside real Airflow.

Starts the emulator, prepares an isolated AIRFLOW_HOME with a migrated metadata DB, runs the DAGs
with ``dag.test()`` and prints what happened: offer chosen, instance, job log, result, cost.

``retrain_spot`` (the checkpoint-resume example) runs with two injected spot interruptions: the
first instance is interrupted with a 10 s notice once its job passed 1/4 of the steps, the second
without a notice once its job passed 1/2 (``example_dags/spot_interrupter.py``). The demo prints
where each attempt resumed, the per-attempt cost ledger and its totals.

``spot_sweep`` (the ``SpotFleetOperator`` example: 12 trials on one to four spot workers) runs with
one worker reclaimed, with a 5 s notice, while its trial runs and after that trial's first checkpoint
was uploaded (``spot_interrupter.FleetInterrupter``). The demo prints how many trials succeeded, the
trial that moved (from which worker to which, and the step it resumed from), the workers launched,
the cost and the best config.

``distributed_train`` (a ``CheckpointResumeOperator`` gang: ``num_nodes=3``) trains a model
data-parallel over three emulated spot instances that talk TCP to each other; once the head has
uploaded a checkpoint a quarter of the way in, rank 1 is interrupted with a 10 s notice
(``GangInterrupter``): the gang is stopped and relaunched whole from the head's checkpoint. The demo
prints the gang's attempts (per attempt: its nodes, the step every rank restored, why it ended), each
node of the last gang, the cost and the learned weights.

``mlengine_train`` (the ``MLEngineTrainOperator`` example on the emulated Vertex AI) trains on a
``STANDARD_1`` cluster, evaluates the trained folder with a second job, and resumes the first job; the
demo prints each job's replicas, state, folder, estimated cost, the step the resume continued from, and
the evaluation's metrics.

Exits 1 if a DAG run failed, an injected interruption did not happen (or moved no trial), or an
instance is left running.

The terminal gets the story only: what each run did, in a screen or less per DAG. Everything else
(Airflow's own logging, the task logs, the emulator's and the agents' output, warnings) goes to the
log file ``.demo/demo.log`` (``CLOUDTRAIN_DEMO_LOG``), whose path is printed at the start and the end;
when a run fails, its last lines are printed too.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "example_dags"
LOG = Path(os.environ.get("CLOUDTRAIN_DEMO_LOG") or ROOT / ".demo" / "demo.log")
TIMELINE = LOG.parent / "timeline.svg"  # retrain_spot's attempts, as the Cloud training page shows them
WRITTEN: list[Path] = []  # files the demo wrote, named at the end
TAIL_LINES = 40  # of the log file, printed after a failed run
JOB_LOG_LINES = 12  # of a job's log, in the story

STORY: TextIO = sys.stdout  # the terminal, once ``quiet_to`` took stdout and stderr to the log file


def say(*args: Any) -> None:
    """One line of the story, on the terminal (stdout itself goes to the log file)."""
    print(*args, file=STORY, flush=True)


@contextlib.contextmanager
def quiet_to(path: Path) -> Iterator[TextIO]:
    """File descriptors 1 and 2 (and so everything this process and its children write, Airflow's
    logging included, however it holds its stream) go to ``path``; ``STORY`` is the terminal."""
    global STORY
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    story = os.fdopen(os.dup(1), "w", buffering=1)
    with open(path, "w", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        STORY = story
        try:
            yield story
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            STORY = sys.stdout
            story.close()


def show_log_tail(path: Path, lines: int = TAIL_LINES) -> None:
    """The last ``lines`` of the log file, on the terminal: what went wrong, without opening it."""
    sys.stdout.flush()
    sys.stderr.flush()
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    say(f"  --- the last {len(tail)} lines of {path} ---")
    for line in tail:
        say(f"  {line}")
    say("  ---")


def prepare_airflow_home() -> None:
    if os.environ.get("CLOUDTRAIN_DEMO_HOME"):
        home = Path(os.environ["CLOUDTRAIN_DEMO_HOME"])
    else:  # a scratch Airflow home (its DB, the task logs, which .demo/demo.log also holds), gone after
        home = Path(tempfile.mkdtemp(prefix="cloudtrain-demo-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    if not os.environ.get("AIRFLOW__CORE__FERNET_KEY"):  # connections and variables stored encrypted
        from cryptography.fernet import Fernet

        os.environ["AIRFLOW__CORE__FERNET_KEY"] = Fernet.generate_key().decode()
    os.environ.setdefault("CLOUDTRAIN_CACHE_DIR", str(home / "cache"))
    from airflow.utils import db

    db.initdb()


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(f"example_dags.{name}", DAGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_dag(name: str):
    return load_module(name).dag


SPOT_STEPS = 60  # retrain_spot's training steps
# (interrupt once the job passed this step, notice seconds): 1/4 with a notice, 1/2 without one
SPOT_PLAN = [(SPOT_STEPS // 4, 10.0), (SPOT_STEPS // 2, 0.0)]


def summarize(name: str, run) -> None:
    """What a user wants to know after a run, without Airflow's log around it."""
    from airflow_cloudtrain.contract.runs import log_prefix
    from airflow_cloudtrain.storage import open_run_folder

    say(f"\n=== {name}: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        say(f"  task {ti.task_id:<14} {ti.state}")
    result = run.get_task_instance("train").xcom_pull(task_ids="train")
    if not result:
        return
    say(
        f"  offer chosen : {result['instance_type']} in {result['region']}/{result['zone']} "
        f"({'spot' if result['spot'] else 'on-demand'})"
    )
    say(f"  instance     : {result['instance_id']} (terminated)")
    folder = open_run_folder(result["run_uri"])
    lines = [
        line
        for key in folder.list(log_prefix(result["instance_id"]))
        for line in (folder.get_text(key) or "").splitlines()
    ]
    earlier = (
        f" ({len(lines) - JOB_LOG_LINES} earlier lines in the run folder)"
        if len(lines) > JOB_LOG_LINES
        else ""
    )
    say(f"  job log      :{earlier}")
    for line in lines[-JOB_LOG_LINES:]:
        say(f"    | {line}")
    say(f"  result       : {result['state']}, exit code {result['exit_code']}, {result['duration_s']:.1f} s")
    say(f"  results      : {result['results_uri']}/  {folder.list('results')}")
    say(f"  cost         : ${result['cost_usd']} ({result['cost_basis']})")
    say(f"  XCom         : {len(result)} keys ({', '.join(sorted(result)[:6])}, ...)")


def summarize_spot(run, injected: list[dict]) -> None:
    """retrain_spot: the interruptions, where each attempt resumed, the ledger and its totals."""
    from airflow_cloudtrain.contract.runs import log_prefix, strip_stamps
    from airflow_cloudtrain.lifecycle.resume.history import format_ledger, ledger_key
    from airflow_cloudtrain.storage import open_run_folder

    def show(value, pattern="{}"):
        return "-" if value is None else pattern.format(value)

    say(f"\n=== retrain_spot: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        say(f"  task {ti.task_id:<14} {ti.state}")
    say("  interruptions injected:")
    for item in injected:
        how = f"{item['notice_s']:g} s notice" if item["notice_s"] > 0 else "no notice"
        say(f"    {item['instance_id']} when its job was at step {item['step']} ({how})")
    result = run.get_task_instance("train").xcom_pull(task_ids="train")
    if not result:
        return
    folder = open_run_folder(result["run_uri"])
    say("  attempts (ended, instance, restored step, checkpoint step, work lost, cost; the job's log):")
    for row in result["attempts"]:
        say(
            f"    #{row['attempt']} {row['ended']:<22} {show(row['instance_id']):<20} "
            f"restored {show(row['restored_step']):>3}  checkpoint {show(row['checkpoint_step']):>3}  "
            f"work lost {show(row['work_lost_s'], '{:.1f}'):>4} s  ${row['cost_usd']:.6f}"
        )
        if row.get("instance_id"):
            log = "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(row["instance_id"])))
            for line in strip_stamps(log).splitlines():
                if line.startswith(("resumed from step", "fresh start", "SIGTERM", "done:")):
                    say(f"       | {line}")
    raw = folder.get_text(ledger_key(result["run_id"]))
    ledger = json.loads(raw) if raw else {**result, "state": "?"}
    say(f"  ledger       : {result['ledger_uri']}")
    for line in format_ledger(ledger).splitlines():
        say(f"    {line}")
    t = result["totals"]
    say(
        f"  totals       : {t['attempts']} attempts, {t['interruptions']} interruptions, "
        f"{result['restarts']} restarts, last resumed from step {result['resumed_step']}, "
        f"{t['work_lost_s']:.1f} s of work lost, ${t['cost_usd']:.6f}"
    )
    evaluation = run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate")
    if evaluation:
        m = evaluation["model"]
        say(f"  model        : w={m['w']:.3f} b={m['b']:.3f} loss={m['loss']:.5f} after {m['steps']} steps")
    write_timeline(result)


def write_timeline(result: dict) -> None:
    """The run's attempts as the Cloud training page draws them (airflow_cloudtrain.ui), from the same
    cost index, to ``TIMELINE``; ``main`` names the file at the end."""
    from airflow_cloudtrain.cli_costs import parse_since
    from airflow_cloudtrain.ui.run_timeline import timeline_of
    from airflow_cloudtrain.ui.runs import load_records, run_detail

    bucket = load_module("retrain_spot").BUCKET  # the DAG's bucket, whose cost index the page reads
    detail = run_detail(load_records([bucket], parse_since("1d")), result["run_id"])
    if detail is None:
        say("  timeline     : the bucket's cost index has no attempt of this run")
        return
    TIMELINE.parent.mkdir(parents=True, exist_ok=True)
    TIMELINE.write_text(timeline_of(detail))
    WRITTEN.append(TIMELINE)
    say(f"  timeline     : {TIMELINE} ({detail['attempts']} attempts, {detail['interruptions']} interrupted)")


def run_spot(emu, name: str):
    """dag.test() of retrain_spot while the interrupter takes two of its instances."""
    interrupter = load_module("spot_interrupter").Interrupter(emu, SPOT_PLAN)
    dag = load_dag(name)
    interrupter.start()
    try:
        run = dag.test()
    finally:
        injected = interrupter.stop()
    summarize_spot(run, injected)
    if len(injected) < len(SPOT_PLAN):
        say(f"  only {len(injected)} of {len(SPOT_PLAN)} interruptions were injected")
    return run, len(injected) == len(SPOT_PLAN)


def summarize_sweep(run, injected: list[dict]) -> bool:
    """spot_sweep: the trials, the one that moved off the reclaimed worker, the fleet, the winner.
    Whether a trial moved and resumed from a checkpoint."""
    from airflow_cloudtrain.contract.runs import log_prefix, strip_stamps
    from airflow_cloudtrain.storage import open_run_folder

    say(f"\n=== spot_sweep: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        say(f"  task {ti.task_id:<14} {ti.state}")
    for item in injected:
        say(
            f"  reclaimed    : worker {item['instance_id']} while it ran trial {item['item_id']}: "
            f"a {item['notice_s']:g} s notice at step {item['step']}, when its newest uploaded checkpoint "
            f"was step {item['checkpoint_step']} (the job saves again on the notice's SIGTERM)"
        )
    result = run.get_task_instance("sweep").xcom_pull(task_ids="sweep")
    if not result:
        return False
    failed = ", ".join(result["items_failed"]) or "none"
    twice = ", ".join(result["items_duplicated"]) or "none"
    say(
        f"  trials       : {result['items_succeeded']}/{result['items_total']} succeeded "
        f"(failed: {failed}; ran to the end twice: {twice})"
    )
    moved_ok = False
    for item in result["items"]:
        if not (item.get("interruptions") or (item.get("attempts") or 1) > 1):
            continue
        metric = json.loads(open_run_folder(item["results_uri"]).get_text("metric.json") or "{}")
        folder = open_run_folder(f"{result['run_uri']}/items/{item['id']}")
        attempts = sorted({k.split("/")[1] for k in folder.list("instances/")})
        froms = [a.rsplit(".", 1)[0] for a in attempts if not a.startswith(item["instance_id"] + ".")]
        resumed = metric.get("resumed_from")
        say(
            f"  moved        : trial {item['id']} {json.dumps(metric.get('config'), sort_keys=True)} from "
            f"{', '.join(froms) or '?'} to {item['instance_id']}, resumed from step {resumed}"
        )
        for attempt in attempts:
            log = "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(attempt)))
            for line in strip_stamps(log).splitlines():
                if line.startswith(("item ", "SIGTERM", "done:")) and "lr=" not in line:
                    say(f"       {attempt:<22} | {line}")
        moved_ok = moved_ok or bool(resumed)
    say(
        f"  fleet        : {result['workers_launched']} worker(s) launched ({result['instance_type']} spot), "
        f"{result['interruptions']} interruption(s), {result['duration_s']:.1f} s, ${result['cost_usd']:.6f}"
    )
    best = run.get_task_instance("pick_best").xcom_pull(task_ids="pick_best")
    if best:
        say(
            f"  best config  : {json.dumps(best['config'], sort_keys=True)} val_loss {best['loss']:.5f}, "
            f"accuracy {best['accuracy']:.3f} (trial {best['item_id']} of {best['trials']})"
        )
    if not moved_ok:
        say("  no trial moved to another worker and resumed from a checkpoint")
    return moved_ok


def run_sweep(emu, name: str):
    """dag.test() of spot_sweep while one worker is reclaimed in the middle of a trial."""
    interrupter = load_module("spot_interrupter").FleetInterrupter(emu, count=1, notice_s=5.0)
    dag = load_dag(name)
    interrupter.start()
    try:
        run = dag.test()
    finally:
        injected = interrupter.stop()
    moved = summarize_sweep(run, injected)
    if not injected:
        say("  no worker was reclaimed")
    return run, bool(injected) and moved


def summarize_mlengine(run) -> None:
    from airflow_cloudtrain.storage import open_run_folder

    say(f"\n=== mlengine_train: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or 0):
        result = ti.xcom_pull(task_ids=ti.task_id) or {}
        say(f"  task {ti.task_id:<9} {ti.state}: job {result.get('job_id')} {result.get('state')}")
        if not result:
            continue
        pools = ", ".join(
            f"{r['role']} {r['count']} x {r['requested'] or r['machine_type']} ({r['machine_type']})"
            for r in result["replicas"]
        )
        say(f"    replicas   : {pools}")
        say(
            f"    job folder : {result['job_dir']}"
            + (f"  (resumed {result['resumed_from']})" if result["resumed_from"] else "")
        )
        basis = result["cost_basis"].split(" (")[0]  # the whole basis is in the XCom and the task log
        say(f"    cost       : ${result['cost_usd']} in {result['duration_s']} s ({basis})")
        say(f"    console    : {result['console_url']}")
    train = run.get_task_instance("train").xcom_pull(task_ids="train") or {}
    evaluate = run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate") or {}
    if train and evaluate:
        folder = open_run_folder(train["job_dir"])
        model = json.loads(folder.get_text("model/model.json") or "{}")
        metrics = json.loads(open_run_folder(evaluate["job_dir"]).get_text("model/metrics.json") or "{}")
        say(
            f"  model        : step {model.get('step')} (the resume went on from the training job's checkpoint)"
        )
        say(f"  evaluation   : {metrics}")


GANG_STEPS = 200  # distributed_train's default steps
GANG_LOSE_AT = GANG_STEPS // 4  # rank 1 is interrupted once the head uploaded a checkpoint this far


class GangInterrupter(threading.Thread):
    """Interrupts rank 1 of the first gang (a 10 s notice) once its head's agent uploaded a checkpoint
    of step >= ``at`` (the job prints ``rank R of N`` first; the agent logs each upload)."""

    def __init__(self, emu: Any, at: int, notice_s: float = 10.0, timeout_s: float = 600.0) -> None:
        super().__init__(name="gang-interrupter", daemon=True)
        self.emu, self.at, self.notice_s, self.timeout_s = emu, at, notice_s, timeout_s
        self.done: list[dict[str, Any]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.done and not self._stopping.is_set() and time.monotonic() < deadline:
            ranks: dict[int, str] = {}
            for inst in self.emu.running_instances():
                found = re.search(r"rank (\d+) of (\d+)", self.emu.agent_log(inst["id"]))
                if found:
                    ranks[int(found.group(1))] = inst["id"]
            if 0 in ranks and 1 in ranks:
                uploaded = re.findall(r"checkpoint step (\d+) uploaded to", self.emu.agent_log(ranks[0]))
                if uploaded and int(uploaded[-1]) >= self.at:
                    step = int(uploaded[-1])
                    self.done.append({"instance_id": ranks[1], "rank": 1, "uploaded_step": step})
                    self.emu.interrupt(ranks[1], notice_s=self.notice_s)
                    break
            self._stopping.wait(0.2)

    def stop(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        self._stopping.set()
        self.join(timeout_s)
        return self.done


def run_gang(emu: Any, name: str):
    """dag.test() of distributed_train while rank 1 of its first gang is interrupted."""
    interrupter = GangInterrupter(emu, GANG_LOSE_AT)
    dag = load_dag(name)
    interrupter.start()
    try:
        run = dag.test()
    finally:
        injected = interrupter.stop()
    say(f"\n=== {name}: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        say(f"  task {ti.task_id:<14} {ti.state}")
    result = run.get_task_instance("train").xcom_pull(task_ids="train") or {}
    if result:
        say(
            f"  offer chosen : {result['num_nodes']} x {result['instance_type']} in "
            f"{result['region']}/{result['zone']} ({'spot' if result['spot'] else 'on-demand'})"
        )
    for item in injected:
        say(
            f"  interruption : rank {item['rank']} ({item['instance_id']}) with a 10 s notice, once the head "
            f"had uploaded step {item['uploaded_step']}"
        )
    if not injected:
        say("  the interruption was not injected")
    summarize_gang(run)
    return run, bool(injected)


def summarize_gang(run) -> None:
    """The gang's attempts (nodes, restored step, end), the last gang's nodes and the learned model."""
    result = run.get_task_instance("train").xcom_pull(task_ids="train") or {}
    rows = result.get("attempts", [])
    for number in sorted({r["attempt"] for r in rows}):
        gang = [r for r in rows if r["attempt"] == number]
        restored = sorted({r["restored_step"] for r in gang}, key=lambda s: -1 if s is None else s)
        say(
            f"  attempt {number}    : {gang[0]['ended']:<22} {len(gang)} nodes "
            f"({', '.join(str(r['instance_id']) for r in gang)}), every rank restored step "
            f"{'/'.join('-' if s is None else str(s) for s in restored)}, ${sum(r['cost_usd'] for r in gang):.6f}"
        )
        if gang[0]["ended"] != "finished" and gang[0].get("message"):
            say(f"                  {gang[0]['message'][:140]}")
    if rows:
        say(
            f"  ledger       : {result['totals']['attempts']} attempts, {len(rows)} node rows, "
            f"{result['interruptions']} interruption(s) (a gang's counts once), {result['restarts']} restart(s)"
        )
    for node in result.get("nodes", []):
        say(
            f"  node rank {node['rank']}  : {node['instance_id']} in {node['zone']} at {node['private_ip']}"
            f" (exit code {node['exit_code']})"
        )
    say(f"  gang cost    : ${result.get('cost_usd')} for {result.get('num_nodes')} nodes")
    model = (run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate") or {}).get("model") or {}
    if model:
        say(f"  model        : weights {model.get('weights')} after {model.get('steps')} steps")


def main() -> int:
    say(f"Airflow's own log lines, the task logs and the emulator's output: {LOG}")
    try:
        with quiet_to(LOG):
            code = run_demo()
    except BaseException:  # the traceback follows on the terminal; the log's last lines first
        show_log_tail(LOG)
        say(f"The full log (Airflow, the tasks, the emulator): {LOG}")
        raise
    say(f"\nThe full log (Airflow, the tasks, the emulator): {LOG}")
    for path in WRITTEN:
        say(f"retrain_spot's timeline (open it in a browser): {path}")
    return code


def run_demo() -> int:
    logging.basicConfig(level=logging.WARNING)
    prepare_airflow_home()
    from airflow_cloudtrain.emulator import Emulator

    dags = sys.argv[1:] or [
        "ec2_train",
        "gce_train",
        "retrain_spot",
        "spot_sweep",
        "mlengine_train",
        "distributed_train",
    ]
    failed = 0
    with Emulator() as emu:
        for name in dags:
            say(f"\n--- {name}: running on the emulated clouds ...")
            try:
                ok = run_one(emu, name)
            except Exception as err:
                print(f"The demo of {name} failed:", file=sys.stderr)
                logging.exception("%s", err)
                say(f"  the demo of {name} failed: {type(err).__name__}: {err}")
                ok = False
            if not ok:
                failed += 1
                show_log_tail(LOG)
        left = emu.running_instances()
        say(f"\ninstances still running on the emulated cloud: {left or 'none'}")
    return 1 if failed or left else 0


def run_one(emu: Any, name: str) -> bool:
    """Run one example DAG and tell its story; whether everything the story promises happened."""
    if name == "retrain_spot":
        run, injected = run_spot(emu, name)
        return run.state == "success" and injected
    if name == "spot_sweep":
        run, moved = run_sweep(emu, name)
        return run.state == "success" and moved
    if name == "distributed_train":
        run, injected = run_gang(emu, name)
        return run.state == "success" and injected
    run = load_dag(name).test()
    if name == "mlengine_train":
        summarize_mlengine(run)
    else:
        summarize(name, run)
    return run.state == "success"


if __name__ == "__main__":
    sys.exit(main())

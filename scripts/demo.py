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

``mlengine_train`` (the ``MLEngineTrainOperator`` example on the emulated Vertex AI) trains on a
``STANDARD_1`` cluster, evaluates the trained folder with a second job, and resumes the first job; the
demo prints each job's replicas, state, folder, estimated cost, the step the resume continued from, and
the evaluation's metrics.

Exits 1 if a DAG run failed, an injected interruption did not happen (or moved no trial), or an
instance is left running.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAGS = ROOT / "example_dags"


def prepare_airflow_home() -> None:
    home = Path(os.environ.get("CLOUDTRAIN_DEMO_HOME") or tempfile.mkdtemp(prefix="cloudtrain-demo-"))
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
    from airflow_cloudtrain.agent.storage import open_run_folder
    from airflow_cloudtrain.runs import log_prefix

    print(f"\n=== {name}: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        print(f"  task {ti.task_id:<14} {ti.state}")
    result = run.get_task_instance("train").xcom_pull(task_ids="train")
    if not result:
        return
    print(
        f"  offer chosen : {result['instance_type']} in {result['region']}/{result['zone']} "
        f"({'spot' if result['spot'] else 'on-demand'})"
    )
    print(f"  instance     : {result['instance_id']} (terminated)")
    folder = open_run_folder(result["run_uri"])
    print("  job log      :")
    for key in folder.list(log_prefix(result["instance_id"])):
        for line in (folder.get_text(key) or "").splitlines():
            print(f"    | {line}")
    print(
        f"  result       : {result['state']}, exit code {result['exit_code']}, {result['duration_s']:.1f} s"
    )
    print(f"  results      : {result['results_uri']}/  {folder.list('results')}")
    print(f"  cost         : ${result['cost_usd']} ({result['cost_basis']})")
    print("  XCom         :", json.dumps(result, default=str))


def summarize_spot(run, injected: list[dict]) -> None:
    """retrain_spot: the interruptions, where each attempt resumed, the ledger and its totals."""
    from airflow_cloudtrain.agent.storage import open_run_folder
    from airflow_cloudtrain.lifecycle.history import format_ledger, ledger_key
    from airflow_cloudtrain.runs import log_prefix, strip_stamps

    def show(value, pattern="{}"):
        return "-" if value is None else pattern.format(value)

    print(f"\n=== retrain_spot: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        print(f"  task {ti.task_id:<14} {ti.state}")
    print("  interruptions injected:")
    for item in injected:
        how = f"{item['notice_s']:g} s notice" if item["notice_s"] > 0 else "no notice"
        print(f"    {item['instance_id']} when its job was at step {item['step']} ({how})")
    result = run.get_task_instance("train").xcom_pull(task_ids="train")
    if not result:
        return
    folder = open_run_folder(result["run_uri"])
    print("  attempts (ended, instance, restored step, checkpoint step, work lost, cost; the job's log):")
    for row in result["attempts"]:
        print(
            f"    #{row['attempt']} {row['ended']:<22} {show(row['instance_id']):<20} "
            f"restored {show(row['restored_step']):>3}  checkpoint {show(row['checkpoint_step']):>3}  "
            f"work lost {show(row['work_lost_s'], '{:.1f}'):>4} s  ${row['cost_usd']:.6f}"
        )
        if row.get("instance_id"):
            log = "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(row["instance_id"])))
            for line in strip_stamps(log).splitlines():
                if line.startswith(("resumed from step", "fresh start", "SIGTERM", "done:")):
                    print(f"       | {line}")
    raw = folder.get_text(ledger_key(result["run_id"]))
    ledger = json.loads(raw) if raw else {**result, "state": "?"}
    print(f"  ledger       : {result['ledger_uri']}")
    for line in format_ledger(ledger).splitlines():
        print(f"    {line}")
    t = result["totals"]
    print(
        f"  totals       : {t['attempts']} attempts, {t['interruptions']} interruptions, "
        f"{result['restarts']} restarts, last resumed from step {result['resumed_step']}, "
        f"{t['work_lost_s']:.1f} s of work lost, ${t['cost_usd']:.6f}"
    )
    evaluation = run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate")
    if evaluation:
        m = evaluation["model"]
        print(f"  model        : w={m['w']:.3f} b={m['b']:.3f} loss={m['loss']:.5f} after {m['steps']} steps")


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
        print(f"  only {len(injected)} of {len(SPOT_PLAN)} interruptions were injected")
    return run, len(injected) == len(SPOT_PLAN)


def summarize_sweep(run, injected: list[dict]) -> bool:
    """spot_sweep: the trials, the one that moved off the reclaimed worker, the fleet, the winner.
    Whether a trial moved and resumed from a checkpoint."""
    from airflow_cloudtrain.agent.storage import open_run_folder
    from airflow_cloudtrain.runs import log_prefix, strip_stamps

    print(f"\n=== spot_sweep: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or t.end_date):
        print(f"  task {ti.task_id:<14} {ti.state}")
    for item in injected:
        print(
            f"  reclaimed    : worker {item['instance_id']} while it ran trial {item['item_id']} "
            f"(at step {item['step']}, checkpoint step {item['checkpoint_step']} uploaded; "
            f"{item['notice_s']:g} s notice)"
        )
    result = run.get_task_instance("sweep").xcom_pull(task_ids="sweep")
    if not result:
        return False
    failed = ", ".join(result["items_failed"]) or "none"
    twice = ", ".join(result["items_duplicated"]) or "none"
    print(
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
        print(
            f"  moved        : trial {item['id']} {json.dumps(metric.get('config'), sort_keys=True)} from "
            f"{', '.join(froms) or '?'} to {item['instance_id']}, resumed from step {resumed}"
        )
        for attempt in attempts:
            log = "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(attempt)))
            for line in strip_stamps(log).splitlines():
                if line.startswith(("item ", "SIGTERM", "done:")) and "lr=" not in line:
                    print(f"       {attempt:<22} | {line}")
        moved_ok = moved_ok or bool(resumed)
    print(
        f"  fleet        : {result['workers_launched']} worker(s) launched ({result['instance_type']} spot), "
        f"{result['interruptions']} interruption(s), {result['duration_s']:.1f} s, ${result['cost_usd']:.6f}"
    )
    best = run.get_task_instance("pick_best").xcom_pull(task_ids="pick_best")
    if best:
        print(
            f"  best config  : {json.dumps(best['config'], sort_keys=True)} val_loss {best['loss']:.5f}, "
            f"accuracy {best['accuracy']:.3f} (trial {best['item_id']} of {best['trials']})"
        )
    if not moved_ok:
        print("  no trial moved to another worker and resumed from a checkpoint")
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
        print("  no worker was reclaimed")
    return run, bool(injected) and moved


def summarize_mlengine(run) -> None:
    from airflow_cloudtrain.agent.storage import open_run_folder

    print(f"\n=== mlengine_train: dag run {run.state} ===")
    for ti in sorted(run.get_task_instances(), key=lambda t: t.start_date or 0):
        result = ti.xcom_pull(task_ids=ti.task_id) or {}
        print(f"  task {ti.task_id:<9} {ti.state}: job {result.get('job_id')} {result.get('state')}")
        if not result:
            continue
        pools = ", ".join(
            f"{r['role']} {r['count']} x {r['requested'] or r['machine_type']} ({r['machine_type']})"
            for r in result["replicas"]
        )
        print(f"    replicas   : {pools}")
        print(
            f"    job folder : {result['job_dir']}"
            + (f"  (resumed {result['resumed_from']})" if result["resumed_from"] else "")
        )
        print(f"    cost       : ${result['cost_usd']} in {result['duration_s']} s ({result['cost_basis']})")
        print(f"    console    : {result['console_url']}")
    train = run.get_task_instance("train").xcom_pull(task_ids="train") or {}
    evaluate = run.get_task_instance("evaluate").xcom_pull(task_ids="evaluate") or {}
    if train and evaluate:
        folder = open_run_folder(train["job_dir"])
        model = json.loads(folder.get_text("model/model.json") or "{}")
        metrics = json.loads(open_run_folder(evaluate["job_dir"]).get_text("model/metrics.json") or "{}")
        print(
            f"  model        : step {model.get('step')} (the resume went on from the training job's checkpoint)"
        )
        print(f"  evaluation   : {metrics}")


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    prepare_airflow_home()
    from airflow_cloudtrain.emulator import Emulator

    dags = sys.argv[1:] or ["ec2_train", "gce_train", "retrain_spot", "spot_sweep", "mlengine_train"]
    failed = 0
    with Emulator() as emu:
        for name in dags:
            print(f"\n=== {name} on the emulated cloud ===", flush=True)
            if name == "retrain_spot":
                run, injected = run_spot(emu, name)
                failed += run.state != "success" or not injected
                continue
            if name == "spot_sweep":
                run, moved = run_sweep(emu, name)
                failed += run.state != "success" or not moved
                continue
            dag = load_dag(name)
            run = dag.test()
            failed += run.state != "success"
            if name == "mlengine_train":
                summarize_mlengine(run)
                continue
            summarize(name, run)
        left = emu.running_instances()
        print(f"\ninstances still running on the emulated cloud: {left or 'none'}")
    return 1 if failed or left else 0


if __name__ == "__main__":
    sys.exit(main())

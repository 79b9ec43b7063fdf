"""example_dags/spot_sweep.py inside real Airflow (dag.test()) on the emulated EC2: twelve trials of a
hyper-parameter sweep on a scaling group of spot workers, then the best config. What a user checks
afterwards: the DAG parses, every trial ran exactly once and wrote its metric, pick_best chose the
config with the lowest loss, nothing of the fleet is left; and, with a worker reclaimed mid-trial,
that trial resumed from its checkpoint on another worker and ended exactly as an uninterrupted one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dag_helpers import EXAMPLE_DAGS, fleet_nothing_left, load_example, task_states, xcom

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder

EXAMPLES = Path(__file__).resolve().parents[2] / "example_dags"
BUCKET = "s3://cloudtrain-emulated/examples"
TRIALS = 12
ENV_VARS = ("CLOUDTRAIN_BUCKET", "CLOUDTRAIN_DEFERRABLE", "CLOUDTRAIN_SWEEP_STEP_S")


def _interrupter_module() -> Any:
    spec = importlib.util.spec_from_file_location("spot_interrupter", EXAMPLES / "spot_interrupter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metric(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(open_run_folder(item["results_uri"]).get_text("metric.json") or "null")


def _attempt_states(run_uri: str, item_id: str) -> dict[str, str]:
    """Every run of an item the run folder knows of: attempt name -> its final state."""
    folder = open_run_folder(f"{run_uri}/items/{item_id}")
    out = {}
    for key in folder.list("instances/"):
        if key.endswith("/status.json"):
            out[key.split("/")[1]] = json.loads(folder.get_text(key) or "{}").get("state")
    return out


def _nothing_left(run: Any) -> None:
    """Queues, group, template and instances of the run are all gone (the emu fixture checks the
    emulator's live instances too)."""
    fleet_nothing_left(RunKey("spot_sweep", "sweep", run.run_id, -1, BUCKET).digest)


def _uninterrupted(config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The same trial run here from step 0 to the end without a stop (no sleeps): the reference."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "out").mkdir()
    env = {
        **os.environ,
        "CLOUDTRAIN_WORK_ITEM": json.dumps(config),
        "CLOUDTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "CLOUDTRAIN_OUTPUT_DIR": str(tmp_path / "out"),
        "SWEEP_STEP_S": "0",
        "PYTHONPATH": str(EXAMPLES.parent),
    }
    subprocess.run(
        [sys.executable, "train.py"],
        cwd=EXAMPLES / "sweep_code",
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads((tmp_path / "out" / "metric.json").read_text())


def _check_sweep(run: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What every run of the sweep must show; returns the fleet's XCom and each trial's metric."""
    assert run.state == "success", task_states(run)
    assert task_states(run) == {"make_sweep": "success", "sweep": "success", "pick_best": "success"}
    configs = xcom(run, "make_sweep")
    assert len(configs) == TRIALS and len({json.dumps(c, sort_keys=True) for c in configs}) == TRIALS
    result = xcom(run, "sweep")
    json.dumps(result)  # JSON-safe
    assert result["cloud"] == "ec2spot" and result["exit_code"] == 0
    assert result["items_total"] == TRIALS and result["items_succeeded"] == TRIALS
    assert result["items_failed"] == [] and result["items_duplicated"] == []
    assert result["run_uri"].startswith(f"{BUCKET}/") and result["cost_usd"] > 0
    assert result["workers_launched"] >= 1
    metrics = {}
    for n, item in enumerate(result["items"]):
        assert item["state"] == "succeeded" and item["exit_code"] == 0, item
        assert item["duplicate_runs"] == 0, item
        # succeeded exactly once: one successful run of it in the run folder
        states = _attempt_states(result["run_uri"], item["id"])
        assert list(states.values()).count("succeeded") == 1, (item["id"], states)
        metric = _metric(item)
        assert metric["config"] == configs[n] and metric["item_id"] == item["id"]
        assert metric["steps"] == 40 and metric["loss"] > 0
        metrics[item["id"]] = metric
    # pick_best read every metric.json and returned the sweep's config with the lowest loss
    best = xcom(run, "pick_best")
    assert best["config"] in configs and best["trials"] == TRIALS
    lowest = min(metrics.values(), key=lambda m: (m["loss"], m["item_id"]))
    assert (best["config"], best["loss"], best["item_id"]) == (
        lowest["config"],
        lowest["loss"],
        lowest["item_id"],
    )
    _nothing_left(run)
    return result, metrics


def test_spot_sweep_parses_without_import_errors(monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)

    bag = DagBag(dag_folder=str(EXAMPLE_DAGS / "spot_sweep.py"))
    assert bag.import_errors == {}
    dag = bag.dags.get("spot_sweep")
    assert dag is not None
    assert {t.task_id for t in dag.tasks} == {"make_sweep", "sweep", "pick_best"}
    sweep = dag.get_task("sweep")
    assert sweep.upstream_task_ids == {"make_sweep"} and sweep.downstream_task_ids == {"pick_best"}
    assert sweep.fleet_args["num_workers"] == 1 and sweep.fleet_args["max_workers"] == 4
    assert sweep.fleet_args["max_item_attempts"] == 3 and sweep.checkpoint_interval_s == 2
    assert sweep.cloud == "ec2spot" and sweep.bid == "60%" and sweep.deferrable
    assert Path(sweep.code).resolve() == EXAMPLES / "sweep_code"


def test_spot_sweep_runs_every_trial_once(emu, airflow_db, monkeypatch) -> None:
    """Blocking this time (the deferrable default runs in the test below), with quick steps."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDTRAIN_DEFERRABLE", "false")
    monkeypatch.setenv("CLOUDTRAIN_SWEEP_STEP_S", "0.03")
    run = load_example("spot_sweep").test()
    result, metrics = _check_sweep(run)
    for item in result["items"]:
        assert item["attempts"] == 1 and item["interruptions"] == 0, item
        assert metrics[item["id"]]["resumed_from"] == 0
        assert len(_attempt_states(result["run_uri"], item["id"])) == 1
    assert result["interruptions"] == 0


def test_spot_sweep_trial_moves_off_a_reclaimed_worker_and_resumes(
    emu, airflow_db, monkeypatch, tmp_path
) -> None:
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    dag = load_example("spot_sweep")
    interrupter = _interrupter_module().FleetInterrupter(emu, count=1, notice_s=5, timeout_s=240)
    interrupter.start()
    try:
        run = dag.test()
    finally:
        done = interrupter.stop()
    assert len(done) == 1, "no worker was reclaimed mid-trial"
    reclaimed = done[0]
    assert reclaimed["checkpoint_step"] > 0
    result, metrics = _check_sweep(run)
    assert result["interruptions"] >= 1 and result["workers_launched"] >= 2

    # Exactly the reclaimed worker's trial moved: to another worker, from its checkpoint, not step 0.
    moved = [i for i in result["items"] if i["interruptions"] or i["attempts"] > 1]
    assert [i["id"] for i in moved] == [reclaimed["item_id"]], result["items"]
    item = moved[0]
    assert item["instance_id"] != reclaimed["instance_id"]
    metric = metrics[item["id"]]
    assert metric["resumed_from"] >= reclaimed["checkpoint_step"] > 0, (metric, reclaimed)
    assert f"item {item['id']}: resumed from step {metric['resumed_from']} " in emu.agent_log(
        item["instance_id"]
    )
    states = _attempt_states(result["run_uri"], item["id"])
    assert len(states) == 2 and list(states.values()).count("succeeded") == 1, states
    assert any(name.startswith(reclaimed["instance_id"]) for name in states), states
    for other in result["items"]:
        if other is not item:
            assert metrics[other["id"]]["resumed_from"] == 0 and other["attempts"] == 1, other

    # ... and it ended with exactly the weights of a trial that was never interrupted.
    reference = _uninterrupted(metric["config"], tmp_path)
    assert (metric["loss"], metric["w"], metric["b"]) == (reference["loss"], reference["w"], reference["b"])

"""example_dags/gce_sweep.py inside real Airflow (dag.test()) on the emulated GCE: the twelve trials of
the spot sweep on a managed instance group of three Spot VMs, then the best config. What a user checks:
every trial ran exactly once and wrote its metric, pick_best chose the lowest loss, and nothing of the
group (template, MIG, topics, subscriptions, VMs) is left."""

from __future__ import annotations

import json

from dag_helpers import gce_fleet_nothing_left, load_example, task_states, xcom

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder

BUCKET = "gs://cloudtrain-emulated/examples"


def test_gce_sweep_runs_twelve_trials_on_three_spot_vms_and_picks_the_best(
    emu, airflow_db, monkeypatch
) -> None:
    for name in ("CLOUDTRAIN_GCS_BUCKET", "CLOUDTRAIN_DEFERRABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDTRAIN_SWEEP_STEP_S", "0")
    run = load_example("gce_sweep").test()
    assert task_states(run) == {"make_sweep": "success", "sweep": "success", "pick_best": "success"}
    result = xcom(run, "sweep")
    assert result["cloud"] == "gcspot" and result["items_total"] == 12 and result["items_succeeded"] == 12
    assert result["items_duplicated"] == [] and 1 <= result["workers_launched"] <= 3
    losses = {}
    for item in result["items"]:
        metric = json.loads(open_run_folder(item["results_uri"]).get_text("metric.json"))
        losses[item["id"]] = metric["loss"]
    best = xcom(run, "pick_best")
    assert best["trials"] == 12 and best["loss"] == min(losses.values())
    gce_fleet_nothing_left(emu, RunKey("gce_sweep", "sweep", run.run_id, -1, BUCKET).digest)

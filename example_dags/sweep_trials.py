"""What the two sweep examples share: the trial grid and picking the best trial from a fleet's XCom.

``spot_sweep`` (EC2, ``SpotFleetOperator``) and ``gce_sweep`` (GCE, ``PreemptibleGroupOperator``) run the
same 12 trials of ``sweep_code/train.py``; each trial writes ``metric.json`` into its ``results_uri``.
No DAG is defined here.
"""

from __future__ import annotations

import json
from typing import Any

LEARNING_RATES = [0.01, 0.1, 0.5, 2.0]
BATCH_SIZES = [8, 32, 128]
STEPS = 40  # one step: an epoch of mini-batch gradient descent, then STEP_S seconds of "GPU time"


def trials() -> list[dict[str, Any]]:
    """Every learning rate with every batch size (12 configs)."""
    return [{"lr": lr, "batch_size": bs} for lr in LEARNING_RATES for bs in BATCH_SIZES]


def best_trial(result: dict[str, Any]) -> dict[str, Any]:
    """Open each trial's metric.json (its results_uri) and return the config with the lowest loss."""
    from airflow_cloudtrain.storage import open_run_folder

    found = []
    for item in result["items"]:
        if item["state"] != "succeeded" or not item["results_uri"]:
            print(f"trial {item['id']}: {item['state']} ({item.get('message')}), skipped")
            continue
        metric = json.loads(open_run_folder(item["results_uri"]).get_text("metric.json") or "null")
        if metric is None:
            print(f"trial {item['id']}: no metric.json in {item['results_uri']}, skipped")
            continue
        found.append({**metric, "id": item["id"], "instance_id": item["instance_id"]})
        resumed = f", resumed from step {metric['resumed_from']}" if metric["resumed_from"] else ""
        print(
            f"trial {item['id']} {json.dumps(metric['config'], sort_keys=True)}: "
            f"val_loss {metric['loss']:.5f}, accuracy {metric['accuracy']:.3f} "
            f"on {item['instance_id']}{resumed}"
        )
    if not found:
        raise ValueError(f"no trial of {result['run_id']} produced a metric")
    best = min(found, key=lambda t: (t["loss"], t["id"]))
    print(
        f"best of {len(found)} trial(s): {json.dumps(best['config'], sort_keys=True)} "
        f"val_loss {best['loss']:.5f} (trial {best['id']}); {result['workers_launched']} worker(s), "
        f"{result['interruptions']} interruption(s), ${result['cost_usd']}"
    )
    return {
        "config": best["config"],
        "loss": best["loss"],
        "accuracy": best["accuracy"],
        "item_id": best["id"],
        "results_uri": next(i["results_uri"] for i in result["items"] if i["id"] == best["id"]),
        "trials": len(found),
    }

"""``max_cost`` on the emulated EC2 and GCE, inside real Airflow: a checkpointing run whose budget buys a
little more than the minimum minute is stopped before it passes the budget, its checkpoint uploaded,
its instance released, and the task fails naming the budget; the loop does not relaunch.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from dag_helpers import task_states
from test_checkpoint_resume import BUCKET, REGION, SPOT, resume_dag

from airflow_cloudtrain.catalog import rank_offers
from airflow_cloudtrain.catalog.volumes import root_volume_price
from airflow_cloudtrain.contract.runs import RunKey, join
from airflow_cloudtrain.spec import Hardware
from airflow_cloudtrain.storage import open_run_folder

RUN_FOR_S = 65.0  # what the budget buys: just past EC2's and GCE's 60 s minimum


@pytest.mark.parametrize(("provider", "deferrable"), [("aws", False), ("gcp", True)])
def test_a_run_stops_at_its_budget_with_its_checkpoint(
    emu: Any, airflow_db: Any, capfd: Any, provider: str, deferrable: bool
) -> None:
    offer = rank_offers(SPOT[provider], Hardware(2, 0, "4g"), region=REGION[provider])[0]
    assert offer.spot_price is not None
    if provider == "aws":  # every zone at the offer's price: what the budget projects with is charged
        for letter in "abcdef":
            emu.set_spot_price(offer.instance_type, f"{REGION['aws']}{letter}", offer.spot_price)
    hourly = offer.spot_price + 50 * (root_volume_price(provider, REGION[provider]) or 0.0) / 730
    budget = round(hourly * RUN_FOR_S / 3600, 9)
    dag_id = f"max_cost_{provider}"
    command = "python3 steps.py 100000 2 0.25"  # far more steps than the budget buys
    run = resume_dag(dag_id, provider, command, deferrable, extra=f"max_cost={budget}").test()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "failed"}
    assert f"max_cost=${budget:g} reached" in out, out[-3000:]
    key = RunKey(dag_id, "train", run.run_id, -1, BUCKET[provider])
    ledger = json.loads(
        open_run_folder(join(BUCKET[provider], key.path())).get_text(f"ledger/{key.short_id}.json")
    )
    assert ledger["state"] == "failed" and "stopped at the budget" in ledger["message"]
    (row,) = ledger["attempts"]  # no relaunch past the budget
    assert row["ended"] == "over_budget"
    assert row["checkpoint_step"] is not None  # the agent uploaded its checkpoint as it was stopped
    # stopped at the budget: it used it (not stopped early), and passed it by at most the seconds the
    # release took after the last poll (generous: the machine may be busy)
    assert 0.9 * budget <= row["cost_usd"] <= budget + hourly * 30 / 3600, (row["cost_usd"], budget)
    assert not [i for i in emu.running_instances() if i["cloud"] == provider]


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_vertex_job_is_cancelled_at_its_budget(
    emu: Any, airflow_db: Any, capfd: Any, deferrable: bool
) -> None:
    from test_mlengine_train import active_jobs, job_dag

    from airflow_cloudtrain.lifecycle.vertex.cost import estimate_cost
    from airflow_cloudtrain.mlengine.tiers import resolve_pools

    pools = resolve_pools("BASIC")
    hourly, _ = estimate_cost(pools, "us-central1", False, 3600.0)
    assert hourly
    budget = round(hourly * RUN_FOR_S / 3600, 9)
    job_id = f"budget_{int(deferrable)}"
    extra = (
        f"scale_tier='BASIC', job_id={job_id!r}, max_cost={budget}, "
        "training_args=['--steps', '100000', '--step-s', '0.25']"
    )
    run = job_dag(f"vertex_budget_{int(deferrable)}", {"train": extra}, deferrable=deferrable).test()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "failed"}
    assert f"max_cost=${budget:g} reached" in out and "the job was cancelled" in out, out[-3000:]
    (job,) = [j for j in emu.vertex.jobs() if j["displayName"] == job_id]
    assert job["state"] in ("JOB_STATE_CANCELLED", "JOB_STATE_CANCELLING")  # cancelled by the task
    assert job["name"] not in {j["name"] for j in active_jobs(emu) if j["state"] != "JOB_STATE_CANCELLING"}

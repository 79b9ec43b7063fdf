"""example_dags/distributed_train.py inside real Airflow (dag.test()) on the emulated EC2: a
``CheckpointResumeOperator`` gang of three spot instances runs the standard-library data-parallel job
(uninterrupted here; tests/cloud/test_gang_resume.py loses nodes). What a user checks: the model
learned the true weights on three nodes, the XCom lists the three nodes with their ranks and
addresses, the ledger has one row per node, the cost sums them, and no instance of the run is left."""

from __future__ import annotations

import pytest
from dag_helpers import load_example, task_states, xcom
from waiting import wait_for


def test_distributed_train_runs_on_a_gang_of_three(emu, airflow_db, monkeypatch) -> None:
    for name in ("CLOUDTRAIN_BUCKET", "CLOUDTRAIN_SPOT_CLOUD", "CLOUDTRAIN_SPOT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDTRAIN_DEFERRABLE", "false")
    run = load_example("distributed_train").test(run_conf={"steps": 120, "every": 20})
    assert task_states(run) == {"train": "success", "evaluate": "success"}
    result = xcom(run, "train")
    nodes = result["nodes"]
    assert result["num_nodes"] == 3 and [n["rank"] for n in nodes] == [0, 1, 2]
    assert len({n["instance_id"] for n in nodes}) == 3 and len({n["private_ip"] for n in nodes}) == 3
    assert len({n["zone"] for n in nodes}) == 1 and all(n["exit_code"] == 0 for n in nodes)
    assert result["instance_id"] == nodes[0]["instance_id"]  # the head's
    rows = result["attempts"]
    assert [(r["attempt"], r["rank"], r["ended"]) for r in rows] == [(1, k, "finished") for k in range(3)]
    assert result["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows)) and result["cost_usd"] > 0
    assert result["interruptions"] == 0
    evaluated = xcom(run, "evaluate")
    assert evaluated["model"]["nodes"] == 3 and evaluated["model"]["steps"] == 120
    ids = {n["instance_id"] for n in nodes}
    wait_for(
        lambda: not ids & {i["id"] for i in emu.running_instances()}, timeout=120, message="the gang gone"
    )

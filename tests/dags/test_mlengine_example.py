"""example_dags/mlengine_train.py inside real Airflow on the emulated Vertex AI: a STANDARD_1 training
job (8 replicas), an evaluation job that reads the training folder, and a resume of the first job that
goes on from its last checkpoint -- the workflow of the detector's ``lumi cloud gc`` commands."""

from __future__ import annotations

import json

from dag_helpers import load_example, task_states, xcom

from airflow_cloudtrain.storage import open_run_folder


def test_train_evaluate_resume(emu, airflow_db, capfd) -> None:
    run = load_example("mlengine_train").test()
    assert task_states(run) == {"train": "success", "evaluate": "success", "resume": "success"}
    train, evaluate, resume = (xcom(run, t) for t in ("train", "evaluate", "resume"))
    assert [(r["role"], r["count"], r["requested"]) for r in train["replicas"]] == [
        ("chief", 1, "complex_model_s"),
        ("worker", 4, "complex_model_s"),
        ("parameter_server", 3, "standard"),
    ]
    assert train["job_id"].startswith("train_") and train["job_dir"].endswith("/" + train["job_id"])
    out = capfd.readouterr().out
    for replica in [
        "workerpool0-0",
        *(f"workerpool1-{i}" for i in range(4)),
        *(f"workerpool2-{i}" for i in range(3)),
    ]:
        assert f"[{replica} " in out, replica  # every replica's lines reached the task log
    metrics = json.loads(open_run_folder(evaluate["job_dir"]).get_text("model/metrics.json"))
    assert metrics == {"split": "val", "step": 12, "loss": metrics["loss"]}  # it read the trained model
    assert resume["job_dir"] == train["job_dir"] and resume["resumed_from"] == train["job_id"]
    assert "resumed from step 12" in out
    model = json.loads(open_run_folder(train["job_dir"]).get_text("model/model.json"))
    assert model["step"] == 18  # 12 trained, 6 more after the resume

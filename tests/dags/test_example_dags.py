"""The example DAGs run inside real Airflow (dag.test()) on the emulated AWS, blocking and deferrable."""

from __future__ import annotations

import json

import boto3
import pytest
from dag_helpers import load_example, task_states, xcom

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.spec import Hardware

XCOM_FIELDS = {
    "run_id",
    "run_uri",
    "cloud",
    "instance_type",
    "region",
    "zone",
    "exit_code",
    "duration_s",
    "cost_usd",
    "interruptions",
}


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_ec2_train_end_to_end(emu, airflow_db, monkeypatch, deferrable: bool) -> None:
    monkeypatch.setenv("CLOUDTRAIN_DEFERRABLE", str(deferrable).lower())
    run = load_example("ec2_train").test()
    assert task_states(run) == {"prepare_data": "success", "train": "success", "evaluate": "success"}
    result = xcom(run, "train")
    assert set(result) >= XCOM_FIELDS
    json.dumps(result)  # JSON-safe
    assert result["cloud"] == "ec2spot" and result["exit_code"] == 0 and result["interruptions"] == 0
    # the cheapest spot offer with >= 2 vCPUs and 4 GiB within a 60% bid, in the connection's region
    assert (
        result["instance_type"]
        == choose_offer("ec2spot", Hardware(2, 0, "4g"), "us-east-1", bid="60%").instance_type
    )
    assert result["cost_usd"] > 0 and "per second" in result["cost_basis"]
    # The model landed in the run folder, and the evaluate task read it through the XCom.
    bucket, key = result["results_uri"][len("s3://") :].split("/", 1)
    model = json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=f"{key}/model.json")["Body"].read())
    assert abs(model["w"] - 3) < 0.3 and abs(model["b"] - 2) < 0.3
    assert xcom(run, "evaluate")["model"] == model
    # The instance is gone, by our hand (the agent powering off would say InstanceInitiatedShutdown).
    state = boto3.client("ec2").describe_instances(InstanceIds=[result["instance_id"]])["Reservations"][0][
        "Instances"
    ][0]
    assert state["State"]["Name"] == "terminated"


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_gce_train_end_to_end(emu, airflow_db, monkeypatch, deferrable: bool) -> None:
    from google.cloud import storage

    monkeypatch.setenv("CLOUDTRAIN_DEFERRABLE", str(deferrable).lower())
    run = load_example("gce_train").test()
    assert task_states(run) == {"prepare_data": "success", "train": "success", "evaluate": "success"}
    result = xcom(run, "train")
    assert set(result) >= XCOM_FIELDS
    json.dumps(result)
    assert (
        result["cloud"] == "gcspot" and result["exit_code"] == 0 and result["zone"].startswith("us-central1-")
    )
    assert (
        result["instance_type"] == choose_offer("gcspot", Hardware(2, 0, "4g"), "us-central1").instance_type
    )
    bucket, key = result["results_uri"][len("gs://") :].split("/", 1)
    model = json.loads(storage.Client().bucket(bucket).blob(f"{key}/model.json").download_as_text())
    assert abs(model["w"] - 3) < 0.3 and xcom(run, "evaluate")["model"] == model
    assert emu.running_instances() == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_ui_train_params_flow_into_the_operator(emu, airflow_db, monkeypatch, deferrable: bool) -> None:
    monkeypatch.setenv("CLOUDTRAIN_DEFERRABLE", str(deferrable).lower())
    conf = {"cloud": "ec2", "cpus": 8, "ram": "30g", "bid": "", "command": "echo trained-from-the-form"}
    run = load_example("ui_train").test(run_conf=conf)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["cloud"] == "ec2" and result["spot"] is False
    # the form's cpus/ram reached the catalog search: cheapest on-demand with >= 8 vCPUs and 30 GiB
    assert result["instance_type"] == choose_offer("ec2", Hardware(8, 0, "30g"), "us-east-1").instance_type
    assert result["instance_type"] != choose_offer("ec2", Hardware(2, 0, "4g"), "us-east-1").instance_type
    assert result["exit_code"] == 0


def test_unpausing_an_example_starts_no_run_by_itself(airflow_db) -> None:
    """Triggering an example from the UI unpauses it: no scheduled (catch-up) run may come with the
    one the user asked for. What the scheduler would create first: the next run info of the DAG as
    the scheduler sees it (serialized), from no earlier run; None, or a time still to come."""
    from datetime import datetime, timezone
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    bag = DagBag(str(Path(__file__).resolve().parents[2] / "example_dags"))
    assert bag.import_errors == {}
    assert {"ec2_train", "gce_train", "retrain_spot", "spot_sweep", "mlengine_train"} <= set(bag.dags)
    for dag_id, dag in bag.dags.items():
        seen = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
        first = seen.next_dagrun_info(last_automated_run_info=None)
        now = datetime.now(timezone.utc)
        assert first is None or first.run_after > now, f"{dag_id} would run at once on unpause: {first}"

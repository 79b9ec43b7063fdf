"""MLEngineTrainOperator at DAG parse time: bad values fail naming their field, templated ones wait for
rendering, the job body Vertex gets says what the arguments said, and importing the operator does not
import google-cloud-aiplatform (its cold import costs seconds of every DAG parse)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.lifecycle.vertex.job import VertexJobRun
from airflow_cloudtrain.operators import MLEngineTrainOperator
from airflow_cloudtrain.operators.mlengine_config import parse_job_config

BASE = {
    "task_id": "train",
    "region": "us-central1",
    "bucket": "gs://my-bucket/jobs",
    "code": str(Path(__file__).resolve().parents[2] / "example_dags" / "mlengine_code"),  # must exist
    "python_module": "trainer.task",
}


@pytest.mark.parametrize(
    ("bad", "names"),
    [
        ({"scale_tier": "GIANT"}, ["scale_tier", "BASIC_GPU"]),
        ({"scale_tier": "CUSTOM"}, ["master_type"]),
        ({"scale_tier": "CUSTOM", "master_type": "standard", "worker_count": 2}, ["worker_type"]),
        (
            {
                "scale_tier": "CUSTOM",
                "master_type": "standard",
                "worker_type": "n1-standard-8",
                "worker_count": 2,
            },
            ["master_type", "worker_type"],
        ),
        ({"scale_tier": "CUSTOM", "master_type": "huge_model"}, ["master_type", "complex_model_m"]),
        (
            {
                "scale_tier": "CUSTOM",
                "master_type": "n1-standard-8",
                "master_accelerator": "NVIDIA_TESLA_A100",
            },
            ["master_accelerator"],
        ),
        ({"scale_tier": "BASIC", "worker_count": 3}, ["worker_count", "CUSTOM"]),
        ({"region": "central"}, ["region"]),
        ({"bucket": "s3://my-bucket/jobs"}, ["bucket", "gs://"]),
        ({"job_id": "1st-job"}, ["job_id"]),
        ({"resume_from": "gs://my-bucket/jobs/x"}, ["resume_from"]),
        ({"python_module": None}, ["python_module", "image"]),
        ({"image": "us-docker.pkg.dev/p/r/trainer:1"}, ["python_module", "image"]),
        ({"code": None}, ["code"]),
        ({"code": "gs://my-bucket/pkg/trainer.py"}, ["code", ".tar.gz"]),
        ({"command": "python -m trainer.task"}, ["command", "image"]),
        ({"spot": "sometimes"}, ["spot"]),
        ({"max_runtime": "forever"}, ["max_runtime"]),
        ({"env": {"1BAD": "x"}}, ["env"]),
    ],
)
def test_bad_values_fail_at_parse_time_naming_the_field(bad: dict, names: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        MLEngineTrainOperator(**{**BASE, **bad})
    for name in names:
        assert name in str(err.value)


def test_templated_values_are_checked_when_rendered_not_at_parse_time() -> None:
    op = MLEngineTrainOperator(**{**BASE, "resume_from": "{{ ti.xcom_pull('train')['job_id'] }}"})
    assert op.resume_from.startswith("{{")
    with pytest.raises(ValueError, match="resume_from"):
        parse_job_config({**op._args(), "resume_from": "not a job id"})


def test_a_custom_container_job_needs_no_code() -> None:
    op = MLEngineTrainOperator(
        task_id="t",
        region="us-central1",
        bucket="gs://my-bucket/jobs",
        image="gcr.io/p/trainer:1",
        command=["python", "-m", "trainer.task"],
        scale_tier="BASIC",
    )
    config = parse_job_config(op._args())
    assert config.image == "gcr.io/p/trainer:1" and config.command == ["python", "-m", "trainer.task"]


class _Hook:
    """The cloud side is not called by ``body``: only the project is read."""

    project = "my-proj"

    def job_client(self, region: str) -> None:
        return None


def _body(**kwargs: object) -> dict:
    config = parse_job_config({**BASE, **kwargs})
    run = VertexJobRun(config, RunKey("dag", "train", "manual__1", -1, config.bucket), _Hook(), try_number=2)
    return run.body(
        "train_1", "gs://my-bucket/jobs/train_1", None, ["gs://my-bucket/jobs/train_1/packages/x/p.tar.gz"]
    )


def test_the_job_body_is_the_vertex_custom_job_the_arguments_describe() -> None:
    body = _body(
        scale_tier="CUSTOM",
        master_type="complex_model_m",
        worker_type="complex_model_m",
        worker_count=2,
        parameter_server_type="large_model",
        parameter_server_count=1,
        spot=True,
        max_runtime="2h",
        training_args=["--epochs", "10"],
        env={"EPOCHS": "10"},
    )
    assert body["display_name"] == "train_1"
    spec = body["job_spec"]
    pools = spec["worker_pool_specs"]
    assert [p["replica_count"] for p in pools] == [1, 2, 1]
    assert [p["machine_spec"]["machine_type"] for p in pools] == [
        "n1-highcpu-16",
        "n1-highcpu-16",
        "n1-highmem-8",
    ]
    python = pools[0]["python_package_spec"]
    assert python["python_module"] == "trainer.task"
    assert python["args"] == ["--epochs", "10", "--job-dir", "gs://my-bucket/jobs/train_1"]
    assert {"name": "EPOCHS", "value": "10"} in python["env"]
    assert spec["base_output_directory"] == {"output_uri_prefix": "gs://my-bucket/jobs/train_1"}
    assert spec["scheduling"]["strategy"] == "SPOT"
    assert spec["scheduling"]["timeout"].total_seconds() == 7200
    assert spec["scheduling"]["restart_job_on_worker_restart"] is True  # a Spot cluster restarts together
    labels = body["labels"]
    assert labels["cloudtrain-managed"] == "true" and labels["cloudtrain-run-key"]
    assert labels["cloudtrain-job-id"] == "train_1" and labels["cloudtrain-try"] == "2"
    assert all(len(v) <= 63 and v == v.lower() for v in labels.values())


def test_parameter_servers_without_workers_get_vertex_s_empty_placeholder() -> None:
    pools = _body(
        scale_tier="CUSTOM",
        master_type="standard",
        parameter_server_type="standard",
        parameter_server_count=2,
    )["job_spec"]["worker_pool_specs"]
    assert pools[1] == {} and pools[2]["replica_count"] == 2


def test_importing_the_operator_does_not_import_aiplatform() -> None:
    code = (
        "import sys; import airflow_cloudtrain.operators, airflow_cloudtrain.operators.mlengine_train; "
        "print(sorted(m for m in sys.modules if 'aiplatform' in m or m.startswith('google.cloud.logging')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"

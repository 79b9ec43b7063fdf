"""The operators' OpenLineage facets from each result shape (single run, work queue, Vertex AI job);
``tests/system`` checks them after real runs of every operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_cloudtrain.operators import CloudTrainOperator, MLEngineTrainOperator, SpotFleetOperator


class _TI:
    def __init__(self, result: dict[str, Any]) -> None:
        self.task_id, self.result = "train", result

    def xcom_pull(self, task_ids: str) -> Any:
        assert task_ids == "train"
        return self.result


def _names(datasets: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def test_a_run_reads_its_code_and_env_uris_and_writes_results_and_checkpoints() -> None:
    op = CloudTrainOperator(
        task_id="train",
        cloud="ec2spot",
        instance_type="t3.medium",
        code="s3://code-bucket/pkg/code.tar.gz",
        command="python3 train.py",
        env={"DATA": "s3://data/train.csv", "LR": "0.1", "OTHER": "gs://g/x/"},
        bucket="s3://runs/team",
    )
    result = {
        "run_uri": "s3://runs/team/ct-1",
        "results_uri": "s3://runs/team/ct-1/results/i-1",
        "cloud": "ec2spot",
        "instance_type": "t3.medium",
        "num_nodes": 2,
        "interruptions": 1,
        "cost_usd": 0.12,
        "totals": {"attempts": 2},
        "attempts": [
            {"attempt": 1, "instance_type": "t3.large"},
            {"attempt": 2, "instance_type": "t3.medium"},
        ],
    }
    lineage = op.get_openlineage_facets_on_complete(_TI(result))
    assert _names(lineage.inputs) == [
        ("s3://code-bucket", "pkg/code.tar.gz"),
        ("s3://data", "train.csv"),
        ("gs://g", "x"),
    ]
    assert _names(lineage.outputs) == [
        ("s3://runs", "team/ct-1/results/i-1"),
        ("s3://runs", "team/ct-1/checkpoints"),
    ]
    facet = lineage.run_facets["cloudtrain"]
    assert (facet.cloud, facet.instanceTypes, facet.nodes, facet.attempts) == (
        "ec2spot",
        ["t3.large", "t3.medium"],
        2,
        2,
    )
    assert (facet.interruptions, facet.costUsd, facet.runUri) == (1, 0.12, "s3://runs/team/ct-1")


def test_a_work_queue_and_a_vertex_job() -> None:
    fleet = SpotFleetOperator(
        task_id="train",
        cloud="ec2spot",
        work_items=["a"],
        instance_type="t3.medium",
        code=str(Path(__file__).parent),
        command="x",
        bucket="s3://runs",
    )
    result = {
        "run_uri": "s3://runs/ct-2",
        "cloud": "ec2spot",
        "instance_type": "t3.medium",
        "items": [{"id": "a", "attempts": 2}, {"id": "b", "attempts": 1}],
        "workers_launched": 3,
        "interruptions": 1,
        "cost_usd": 0.5,
    }
    lineage = fleet.get_openlineage_facets_on_complete(_TI(result))
    assert _names(lineage.inputs) == [("s3://runs", "ct-2/code/code.tar.gz")]  # the uploaded local folder
    assert _names(lineage.outputs) == [("s3://runs", "ct-2/results"), ("s3://runs", "ct-2/checkpoints")]
    facet = lineage.run_facets["cloudtrain"]
    assert (facet.nodes, facet.attempts, facet.interruptions, facet.costUsd) == (3, 3, 1, 0.5)

    vertex = MLEngineTrainOperator(
        task_id="train",
        region="us-central1",
        bucket="gs://jobs",
        code="gs://jobs/pkg.tar.gz",
        python_module="trainer.task",
        scale_tier="BASIC",
        env={"DATA": "gs://data/x"},
    )
    result = {
        "job_dir": "gs://jobs/job-1",
        "replicas": [{"machine_type": "n1-standard-4", "count": 1}],
        "cost_usd": 0.02,
    }
    lineage = vertex.get_openlineage_facets_on_complete(_TI(result))
    assert _names(lineage.inputs) == [("gs://jobs", "pkg.tar.gz"), ("gs://data", "x")]
    assert _names(lineage.outputs) == [("gs://jobs", "job-1/model"), ("gs://jobs", "job-1/checkpoints")]
    facet = lineage.run_facets["cloudtrain"]
    assert (facet.cloud, facet.instanceTypes, facet.nodes, facet.costUsd) == (
        "vertex",
        ["n1-standard-4"],
        1,
        0.02,
    )


def test_no_result_still_reports_what_the_arguments_say() -> None:
    op = CloudTrainOperator(
        task_id="train",
        cloud="ec2",
        instance_type="t3.medium",
        command="x",
        env={"D": "s3://d/k"},
        bucket="s3://runs",
    )
    lineage = op.get_openlineage_facets_on_complete(_TI({}))
    assert _names(lineage.inputs) == [("s3://d", "k")] and lineage.outputs == [] and lineage.run_facets == {}


def test_a_single_run_is_one_attempt() -> None:
    """CloudTrainOperator's XCom has no attempts list (one instance, adopted by a retry if need be)."""
    op = CloudTrainOperator(
        task_id="train", cloud="ec2", instance_type="t3.medium", command="true", bucket="s3://runs/team"
    )
    result = {"run_uri": "s3://runs/team/ct-1", "instance_id": "i-1", "instance_type": "t3.medium"}
    facet = op.get_openlineage_facets_on_complete(_TI(result)).run_facets["cloudtrain"]
    assert (facet.nodes, facet.attempts, facet.instanceTypes) == (1, 1, ["t3.medium"])


def test_the_result_the_operator_kept_is_read_without_xcom() -> None:
    """The listener extracts in a fork of the task's process by default, which must not call Airflow:
    the result ``EngineOperator._drive`` kept is used, the XCom only when there is none."""

    class _NoXcom(_TI):
        def xcom_pull(self, task_ids: str) -> Any:
            raise AssertionError("an XCom read from the listener's fork")

    op = CloudTrainOperator(
        task_id="train", cloud="ec2", instance_type="t3.medium", command="true", bucket="s3://runs/team"
    )
    op.run_result = {"run_uri": "s3://runs/team/ct-1", "instance_id": "i-1", "instance_type": "t3.medium"}
    lineage = op.get_openlineage_facets_on_complete(_NoXcom({}))
    assert _names(lineage.outputs) == [("s3://runs", "team/ct-1/checkpoints")]
    assert lineage.run_facets["cloudtrain"].runUri == "s3://runs/team/ct-1"

"""What every system test DAG shares: where it runs, its setup and teardown tasks, the watcher, and
``get_test_run`` (the small equivalent of ``tests_common.test_utils.system_tests.get_test_run``).

Real account: ``SYSTEM_TESTS_ENV_ID`` (a short name that keeps concurrent runs apart) and the buckets
``CLOUDTRAIN_SYSTEM_BUCKET=s3://...`` (AWS DAGs) / ``CLOUDTRAIN_SYSTEM_GCS_BUCKET=gs://...`` (Google
DAGs); a DAG whose bucket is not set is skipped. Credentials are the Airflow connections'
(``aws_default``, ``google_cloud_default``) and, on the instances, their profile / service account.
Otherwise the DAGs run against the emulated clouds.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task
from airflow.utils.trigger_rule import TriggerRule

REAL = bool(os.environ.get("SYSTEM_TESTS_ENV_ID"))
ENV_ID = os.environ.get("SYSTEM_TESTS_ENV_ID") or "emulated"
HERE = Path(__file__).resolve().parent
JOB_CODE = str(HERE / "job")
VERTEX_CODE = str(HERE / "vertex_code")
# The run's tags say which bucket folder it used (``contract.runs.TAG_RUN_URI``): teardown looks for them.
TAG_RUN_URI = "cloudtrain-run-uri"


def bucket(scheme: str, name: str) -> str | None:
    """The DAG's folder in the system bucket: ``s3://bucket/system-<env>/<name>`` (None: not set)."""
    env = "CLOUDTRAIN_SYSTEM_BUCKET" if scheme == "s3" else "CLOUDTRAIN_SYSTEM_GCS_BUCKET"
    root = os.environ.get(env) if REAL else f"{scheme}://cloudtrain-emulated"
    return f"{root.rstrip('/')}/system-{ENV_ID}/{name}" if root else None


def system_dag(name: str) -> DAG:
    dag = DAG(
        dag_id=f"system_cloudtrain_{name}",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        tags=["cloudtrain", "system"],
    )
    dag.fileloc = sys._getframe(1).f_globals["__file__"]  # the DAG file that called, not this module
    return dag


@task
def put_input(folder: str) -> str:
    """Setup: the run's input object, named in the operator's ``env`` (its lineage input)."""
    from airflow_cloudtrain.storage import open_run_folder

    open_run_folder(folder).put_text("input/data.txt", "1 2 3\n")
    return f"{folder}/input/data.txt"


@task(trigger_rule=TriggerRule.ALL_DONE)
def delete_folder(folder: str) -> int:
    """Teardown: everything the run left in its bucket folder."""
    from airflow_cloudtrain.storage import open_run_folder

    return open_run_folder(folder).delete_prefix("")


@task(trigger_rule=TriggerRule.ALL_DONE)
def no_ec2_instance_left(folder: str) -> None:
    """Teardown check: no live EC2 instance of a run in this folder (a leak fails the run)."""
    import boto3

    pages = (
        boto3.client("ec2")
        .get_paginator("describe_instances")
        .paginate(
            Filters=[
                {"Name": "tag-key", "Values": [TAG_RUN_URI]},
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]},
            ]
        )
    )
    left = [
        inst["InstanceId"]
        for page in pages
        for res in page["Reservations"]
        for inst in res["Instances"]
        for tag in inst.get("Tags", [])
        if tag["Key"] == TAG_RUN_URI and tag["Value"].startswith(folder)
    ]
    if left:
        raise RuntimeError(f"instances of {folder} still alive: {left}")


@task(trigger_rule=TriggerRule.ONE_FAILED, retries=0)
def watcher() -> None:
    """Fails the DAG run when any task failed, teardowns included (they end it with all_done)."""
    raise RuntimeError("a task of the system test failed (a teardown failure counts)")


def get_test_run(dag: DAG, needs: str = "s3") -> Callable[..., None]:
    """A pytest test that runs ``dag`` end to end with ``dag.test()`` and fails unless it succeeded."""

    def test_run(system_clouds: Any, tmp_path: Path) -> None:
        import pytest

        if bucket(needs, "x") is None:
            pytest.skip(f"set CLOUDTRAIN_SYSTEM_{'BUCKET' if needs == 's3' else 'GCS_BUCKET'} to run it")
        from dag_helpers import dags_folder, load_example
        from lineage_events import complete_event, openlineage_to_file

        link = dags_folder() / f"{dag.dag_id}.py"  # dag.test() runs DAGs of the DAGs folder (serialized)
        if not link.exists():
            link.symlink_to(dag.fileloc)
        fresh = load_example(dag.dag_id)
        with openlineage_to_file(tmp_path / "openlineage.jsonl") as events:
            run = fresh.test()
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
        assert str(run.state) == "success", states
        assert states.get("watcher") in ("skipped", "upstream_failed"), states
        check_lineage(fresh.get_task("run"), complete_event(events, dag.dag_id, "run"))

    return test_run


def check_lineage(operator: Any, event: dict[str, Any]) -> None:
    """The COMPLETE event Airflow's OpenLineage listener emitted for the operator's real run: inputs
    (code, the env's input URI), outputs (results and checkpoint folders) in the run's bucket, and
    the ``cloudtrain`` run facet."""
    print("lineage:", json.dumps({k: event[k] for k in ("inputs", "outputs")}))
    scheme, bucket_name = operator.bucket.split("://")[0], operator.bucket.split("/")[2]
    names = {(d["namespace"], d["name"]) for d in event["inputs"]}
    folder = operator.bucket.split("/", 3)[3]
    assert (f"{scheme}://{bucket_name}", f"{folder}/input/data.txt") in names, names
    assert len(event["inputs"]) == 2, names  # and the code
    outputs = event["outputs"]
    assert outputs and all(d["namespace"] == f"{scheme}://{bucket_name}" for d in outputs), outputs
    assert any(d["name"].endswith(("checkpoints", "model")) for d in outputs), outputs
    facet = event["run"]["facets"]["cloudtrain"]
    print("cloudtrain run facet:", facet)
    assert facet["cloud"] and facet["instanceTypes"] and facet["nodes"] >= 1, facet
    assert facet["attempts"] >= 1 and facet["costUsd"] >= 0, facet
    assert facet["_producer"] and facet["_schemaURL"], facet

"""System test: a two-item PreemptibleGroupOperator sweep on one GCE spot VM. ``README.md`` "System tests" says how to run it against your account."""

from __future__ import annotations

from system_helpers import JOB_CODE, bucket, delete_folder, get_test_run, put_input, system_dag, watcher

from airflow_cloudtrain.operators import PreemptibleGroupOperator

FOLDER = bucket("gs", "preemptible_group") or "gs://unset/preemptible_group"

with system_dag("preemptible_group") as dag:
    data = put_input(FOLDER)
    run = PreemptibleGroupOperator(
        task_id="run",
        cloud="gcspot",
        work_items=["a", "b"],
        num_workers=1,
        cpus=2,
        ram="4g",
        region="us-central1",
        code=JOB_CODE,
        command="python3 job.py",
        item_timeout="10m",
        max_runtime="15m",
        env={"INPUT_URI": FOLDER + "/input/data.txt"},
        bucket=FOLDER,
        poll_interval=2,
    )
    teardown = delete_folder(FOLDER)
    data >> run >> teardown
    list(dag.tasks) >> watcher()

test_run = get_test_run(dag, needs="gs")

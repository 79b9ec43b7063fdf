"""System test: one CheckpointResumeOperator run on a GCE spot VM. ``README.md`` "System tests" says how to run it against your account."""

from __future__ import annotations

from system_helpers import JOB_CODE, bucket, delete_folder, get_test_run, put_input, system_dag, watcher

from airflow_cloudtrain.operators import CheckpointResumeOperator

FOLDER = bucket("gs", "checkpoint_resume") or "gs://unset/checkpoint_resume"

with system_dag("checkpoint_resume") as dag:
    data = put_input(FOLDER)
    run = CheckpointResumeOperator(
        task_id="run",
        cloud="gcspot",
        cpus=2,
        ram="4g",
        region="us-central1",
        code=JOB_CODE,
        command="python3 job.py",
        checkpoint_interval=2,
        max_restarts=1,
        max_runtime="15m",
        env={"INPUT_URI": FOLDER + "/input/data.txt"},
        bucket=FOLDER,
        poll_interval=2,
    )
    teardown = delete_folder(FOLDER)
    data >> run >> teardown
    list(dag.tasks) >> watcher()

test_run = get_test_run(dag, needs="gs")

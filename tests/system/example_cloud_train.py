"""System test: one CloudTrainOperator run on an EC2 spot instance. ``README.md`` "System tests" says how to run it against your account."""

from __future__ import annotations

import os

from system_helpers import (
    JOB_CODE,
    bucket,
    delete_folder,
    get_test_run,
    no_ec2_instance_left,
    put_input,
    system_dag,
    watcher,
)

from airflow_cloudtrain.operators import CloudTrainOperator

FOLDER = bucket("s3", "cloud_train") or "s3://unset/cloud_train"

with system_dag("cloud_train") as dag:
    data = put_input(FOLDER)
    run = CloudTrainOperator(
        task_id="run",
        cloud="ec2spot",
        cpus=2,
        ram="4g",
        code=JOB_CODE,
        command="python3 job.py",
        max_runtime="15m",
        iam_instance_profile=os.environ.get("CLOUDTRAIN_SYSTEM_INSTANCE_PROFILE"),
        env={"INPUT_URI": FOLDER + "/input/data.txt"},
        bucket=FOLDER,
        poll_interval=2,
    )
    teardown = [delete_folder(FOLDER), no_ec2_instance_left(FOLDER)]
    data >> run >> teardown
    list(dag.tasks) >> watcher()

test_run = get_test_run(dag, needs="s3")

"""System test: a two-item SpotFleetOperator sweep on one EC2 spot worker. ``README.md`` "System tests" says how to run it against your account."""

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

from airflow_cloudtrain.operators import SpotFleetOperator

FOLDER = bucket("s3", "spot_fleet") or "s3://unset/spot_fleet"

with system_dag("spot_fleet") as dag:
    data = put_input(FOLDER)
    run = SpotFleetOperator(
        task_id="run",
        cloud="ec2spot",
        work_items=["a", "b"],
        num_workers=1,
        max_workers=1,
        cpus=2,
        ram="4g",
        code=JOB_CODE,
        command="python3 job.py",
        item_timeout="10m",
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

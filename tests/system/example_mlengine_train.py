"""System test: one MLEngineTrainOperator job on Vertex AI (scale tier BASIC). ``README.md`` "System tests" says how to run it against your account."""

from __future__ import annotations

import os

from system_helpers import VERTEX_CODE, bucket, delete_folder, get_test_run, put_input, system_dag, watcher

from airflow_cloudtrain.operators import MLEngineTrainOperator

FOLDER = bucket("gs", "mlengine_train") or "gs://unset/mlengine_train"

with system_dag("mlengine_train") as dag:
    data = put_input(FOLDER)
    run = MLEngineTrainOperator(
        task_id="run",
        region="us-central1",
        project_id=os.environ.get("CLOUDTRAIN_SYSTEM_GCP_PROJECT") or None,
        code=VERTEX_CODE,
        python_module="sysjob.task",
        scale_tier="BASIC",
        env={"INPUT_URI": FOLDER + "/input/data.txt"},
        bucket=FOLDER,
        poll_interval=2,
    )
    teardown = delete_folder(FOLDER)
    data >> run >> teardown
    list(dag.tasks) >> watcher()

test_run = get_test_run(dag, needs="gs")

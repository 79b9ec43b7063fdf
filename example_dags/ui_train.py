"""Train from the Airflow UI: the trigger form's params flow into CloudTrainOperator's templated fields.

The task defers while the job runs (CLOUDTRAIN_DEFERRABLE=false: it waits in its worker slot instead).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, Param

from airflow_cloudtrain.operators import CloudTrainOperator

# The run folders live on the chosen cloud's storage: s3:// for ec2/ec2spot, gs:// for gcloud/gcspot.
S3_BUCKET = os.environ.get("CLOUDTRAIN_BUCKET", "s3://cloudtrain-emulated/ui-train")
GS_BUCKET = os.environ.get("CLOUDTRAIN_GCS_BUCKET", "gs://cloudtrain-emulated/ui-train")

with DAG(
    dag_id="ui_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example"],
    params={
        "cloud": Param("ec2spot", enum=["ec2", "ec2spot", "gcloud", "gcspot"], description="where to run"),
        "cpus": Param(2, type="integer", minimum=1, description="vCPUs at least"),
        "gpus": Param(0, type="integer", minimum=0, description="GPUs at least"),
        "ram": Param("4g", type="string", description="RAM at least: 16g, 512m, 1.5GiB"),
        "bid": Param("60%", type="string", description="spot bid: 0.45 (USD/h) or 60% of on-demand"),
        "command": Param(
            "python3 -c \"print('hello from the cloud')\"", type="string", description="shell command"
        ),
    },
    doc_md=__doc__,
) as dag:
    CloudTrainOperator(
        task_id="train",
        cloud="{{ params.cloud }}",
        cpus="{{ params.cpus }}",
        gpus="{{ params.gpus }}",
        ram="{{ params.ram }}",
        bid="{{ params.bid }}",
        command="{{ params.command }}",
        bucket="{{ '" + S3_BUCKET + "' if params.cloud.startswith('ec2') else '" + GS_BUCKET + "' }}",
        max_runtime="1h",
        poll_interval=1,
        deferrable=os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true",
    )

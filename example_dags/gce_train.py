"""The GCP twin of ec2_train: prepare data on GCS, train on a GCE Spot VM, evaluate the model.

Runs as is on the emulated clouds (``make demo``); on a real project set CLOUDTRAIN_GCS_BUCKET,
the ``google_cloud_default`` connection and a ``service_account`` that can read and write the bucket.
The training task defers (CLOUDTRAIN_DEFERRABLE=false: it waits in its worker slot instead).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_cloudtrain.operators import CloudTrainOperator

BUCKET = os.environ.get("CLOUDTRAIN_GCS_BUCKET", "gs://cloudtrain-emulated/gce-train")
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"

with DAG(
    dag_id="gce_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_data(run_id: str | None = None) -> str:
        """Write a small dataset (y = 3x + 2 + noise) to the bucket; return its URI."""
        import random

        from google.cloud import storage

        rng = random.Random(7)
        lines = ["x,y"] + [
            f"{x:.4f},{3 * x + 2 + rng.gauss(0, 0.1):.4f}" for x in (rng.random() for _ in range(200))
        ]
        bucket, prefix = BUCKET[len("gs://") :].split("/", 1)
        key = f"{prefix}/data/{run_id}/train.csv".replace(":", "_").replace("+", "_")
        storage.Client().bucket(bucket).blob(key).upload_from_string("\n".join(lines))
        return f"gs://{bucket}/{key}"

    data = prepare_data()

    train = CloudTrainOperator(
        task_id="train",
        cloud="gcspot",
        cpus=2,
        ram="4g",
        region="us-central1",
        code=str(Path(__file__).parent / "train_code"),
        command="python3 train.py --data {{ ti.xcom_pull(task_ids='prepare_data') }} --epochs 200",
        env={"LEARNING_RATE": "0.1"},
        bucket=BUCKET,
        max_runtime="20m",
        poll_interval=1,
        deferrable=DEFERRABLE,
    )

    @task
    def evaluate(result: dict) -> dict:
        """Read the model the job wrote to its output dir, via the XCom's results_uri."""
        import json

        from google.cloud import storage

        bucket, key = result["results_uri"][len("gs://") :].split("/", 1)
        model = json.loads(storage.Client().bucket(bucket).blob(f"{key}/model.json").download_as_text())
        print(
            f"model w={model['w']:.3f} b={model['b']:.3f} loss={model['loss']:.5f}; run cost ${result['cost_usd']}"
        )
        if abs(model["w"] - 3) > 0.3 or abs(model["b"] - 2) > 0.3:
            raise ValueError(f"model did not learn y = 3x + 2: {model}")
        return {"model": model, "cost_usd": result["cost_usd"], "instance_type": result["instance_type"]}

    data >> train
    evaluate(train.output)

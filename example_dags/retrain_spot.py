"""Retraining on spot capacity that survives interruptions: prepare data, train, evaluate.

The training task is a ``CheckpointResumeOperator``: the job (``train_code_spot/train.py``) saves a
checkpoint every few steps and on SIGTERM; when the spot instance is taken the operator launches a
new one and the job resumes from the newest complete checkpoint the agent uploaded. The XCom carries
the per-attempt cost ledger (``attempts``, ``totals``), which the evaluation task reports.

Runs as is on the emulated clouds (``make demo``, which injects two interruptions). On a real account
set CLOUDTRAIN_BUCKET and an instance profile that can read and write it (``iam_instance_profile``).
For GCP set CLOUDTRAIN_SPOT_CLOUD=gcspot and a gs:// CLOUDTRAIN_BUCKET (and CLOUDTRAIN_SPOT_REGION).
The training task defers between attempts' launches (CLOUDTRAIN_DEFERRABLE=false: it waits in its slot).

Unscheduled, so a click on Trigger (which also unpauses the DAG) starts one run and nothing else. To
retrain every week, set ``schedule="@weekly"``: Airflow 3 then also creates the latest week's run as
soon as the DAG is unpaused, even with ``catchup=False`` (the latest Sunday 00:00 UTC, "@weekly"'s time).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_cloudtrain.operators import CheckpointResumeOperator

CLOUD = os.environ.get("CLOUDTRAIN_SPOT_CLOUD", "ec2spot")
GCP = CLOUD in ("gcspot", "gcloud")
BUCKET = os.environ.get("CLOUDTRAIN_BUCKET") or (
    "gs://cloudtrain-emulated/retrain" if GCP else "s3://cloudtrain-emulated/retrain"
)
REGION = os.environ.get("CLOUDTRAIN_SPOT_REGION") or ("us-central1" if GCP else None)
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"
STEPS = 60  # one step: an SGD pass over the data, then 0.3 s of "GPU time"; a checkpoint every 5


def put_text(uri: str, text: str) -> None:
    scheme, rest = uri.split("://", 1)
    bucket, key = rest.split("/", 1)
    if scheme == "s3":
        import boto3

        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=text.encode())
    else:
        from google.cloud import storage

        storage.Client().bucket(bucket).blob(key).upload_from_string(text)


def get_text(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    bucket, key = rest.split("/", 1)
    if scheme == "s3":
        import boto3

        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    from google.cloud import storage

    return storage.Client().bucket(bucket).blob(key).download_as_text()


with DAG(
    dag_id="retrain_spot",
    schedule=None,  # "@weekly" retrains every week (and runs the latest week at once on unpause)
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example", "spot"],
    doc_md=__doc__,
) as dag:

    @task
    def prepare_data(run_id: str | None = None) -> str:
        """This week's dataset (y = 3x + 2 + noise) in the bucket; return its URI."""
        import random

        rng = random.Random(run_id)
        lines = ["x,y"] + [
            f"{x:.4f},{3 * x + 2 + rng.gauss(0, 0.1):.4f}" for x in (rng.random() for _ in range(200))
        ]
        key = f"data/{run_id}/train.csv".replace(":", "_").replace("+", "_")
        uri = f"{BUCKET.rstrip('/')}/{key}"
        put_text(uri, "\n".join(lines))
        return uri

    data = prepare_data()

    train = CheckpointResumeOperator(
        task_id="train",
        cloud=CLOUD,
        cpus=2,
        ram="4g",
        bid="60%" if CLOUD == "ec2spot" else None,
        region=REGION,
        code=str(Path(__file__).parent / "train_code_spot"),
        command=(
            "python3 train.py --data {{ ti.xcom_pull(task_ids='prepare_data') }}"
            f" --steps {STEPS} --every 5 --sleep 0.3"
        ),
        env={"LEARNING_RATE": "0.01"},
        bucket=BUCKET,
        checkpoint_interval=2,  # seconds between checkpoint uploads (real jobs: minutes)
        max_restarts=5,
        max_runtime="20m",
        poll_interval=1,
        deferrable=DEFERRABLE,
    )

    @task
    def evaluate(result: dict) -> dict:
        """Read the model from the XCom's results_uri, check it learned, report the spot ledger."""
        import json

        model = json.loads(get_text(f"{result['results_uri']}/model.json"))
        attempts = result["attempts"]
        for row in attempts:
            print(
                f"attempt {row['attempt']}: {row['ended']} on {row['instance_id']} "
                f"restored step {row['restored_step']}, checkpoint step {row['checkpoint_step']}, "
                f"work lost {row['work_lost_s']} s, ${row['cost_usd']:.6f}"
            )
        print(
            f"model w={model['w']:.3f} b={model['b']:.3f} loss={model['loss']:.5f} after {model['steps']} "
            f"steps; {len(attempts)} attempt(s), resumed from step {result['resumed_step']}, "
            f"run cost ${result['cost_usd']}"
        )
        if model["steps"] != STEPS:
            raise ValueError(f"the job stopped at step {model['steps']} of {STEPS}")
        if abs(model["w"] - 3) > 0.3 or abs(model["b"] - 2) > 0.3:
            raise ValueError(f"model did not learn y = 3x + 2: {model}")
        return {
            "model": model,
            "attempts": len(attempts),
            "restarts": result["restarts"],
            "resumed_step": result["resumed_step"],
            "cost_usd": result["cost_usd"],
        }

    data >> train
    evaluate(train.output)

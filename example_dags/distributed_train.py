"""Data-parallel training on a gang of three spot instances that survives losing one.

The training task is a ``CheckpointResumeOperator`` with ``num_nodes=3``: three instances of one offer
in one zone, launched all or nothing, run the same command once every node is up, each told its rank
and the head's address (``NODE_RANK``, ``NNODES``, ``MASTER_ADDR``, ``MASTER_PORT``; see docs/gangs.md).
The job (``distributed_code/train_dp.py``, standard library only) exchanges gradients with the head
over TCP each step; the head checkpoints every few steps and its agent uploads them. When a node is
interrupted (with or without notice) the gang is stopped (the head saves and uploads its last step),
every node is released, and a whole new gang is launched; every rank restores the head's newest
checkpoint and the job goes on from that step. A lost node counts as one interruption of the gang
(``max_restarts``), never as the job's error. The evaluation task prints the gang's attempts from the
ledger in the XCom (per attempt: nodes, restored step, why it ended) and checks the model.

A PyTorch job would run ``torchrun --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR
--master_port=$MASTER_PORT train.py`` as its command instead.

Runs as is on the emulated clouds (``make demo``). On a real account set CLOUDTRAIN_BUCKET and an
instance profile that can read and write it (``iam_instance_profile``). For GCP set
CLOUDTRAIN_SPOT_CLOUD=gcspot and a gs:// CLOUDTRAIN_BUCKET (and CLOUDTRAIN_SPOT_REGION). The training
task defers while the gang runs (CLOUDTRAIN_DEFERRABLE=false: it waits in its slot). Trigger it with
``{"steps": 400}`` to train longer (the form's fields are the DAG's params).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_cloudtrain.operators import CheckpointResumeOperator

CLOUD = os.environ.get("CLOUDTRAIN_SPOT_CLOUD", "ec2spot")
GCP = CLOUD in ("gcspot", "gcloud")
BUCKET = os.environ.get("CLOUDTRAIN_BUCKET") or (
    "gs://cloudtrain-emulated/distributed" if GCP else "s3://cloudtrain-emulated/distributed"
)
REGION = os.environ.get("CLOUDTRAIN_SPOT_REGION") or ("us-central1" if GCP else None)
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"
NUM_NODES = 3
TRUE_WEIGHTS = [2.0, -1.0, 0.5, 0.25]  # what train_dp.py's synthetic data was drawn from (w..., b)


def get_text(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    bucket, key = rest.split("/", 1)
    if scheme == "s3":
        import boto3

        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    from google.cloud import storage

    return storage.Client().bucket(bucket).blob(key).download_as_text()


with DAG(
    dag_id="distributed_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example", "spot", "multi-node"],
    doc_md=__doc__,
    params={
        "steps": Param(200, type="integer", minimum=1, description="training steps (all nodes together)"),
        "every": Param(10, type="integer", minimum=1, description="the head checkpoints every N steps"),
    },
) as dag:
    train = CheckpointResumeOperator(
        task_id="train",
        cloud=CLOUD,
        num_nodes=NUM_NODES,  # one job over three instances: same offer, same zone, same command
        checkpoint_ranks="head",  # rank 0 uploads; every rank of a relaunched gang restores the head's
        checkpoint_interval=2,
        max_restarts=5,
        cpus=2,
        ram="4g",
        bid="60%" if CLOUD == "ec2spot" else None,
        region=REGION,
        code=str(Path(__file__).parent / "distributed_code"),
        command=(
            "python3 train_dp.py --steps {{ params.steps }} --every {{ params.every }} --sleep 0.2 --timeout 120"
        ),
        bucket=BUCKET,
        max_runtime="20m",
        poll_interval=1,
        deferrable=DEFERRABLE,
    )

    @task
    def evaluate(result: dict, params: dict | None = None) -> dict:
        """Print the gang's attempts and nodes, read the head's result.json, check the model learned."""
        import json

        for number in sorted({row["attempt"] for row in result["attempts"]}):
            rows = [row for row in result["attempts"] if row["attempt"] == number]
            print(
                f"attempt {number}: {rows[0]['ended']}, {len(rows)} node(s), restored step "
                f"{rows[0]['restored_step']}; {rows[0]['message'] or ''}"
            )
        for node in result.get("nodes", []):
            print(f"node {node['rank']}: {node['instance_id']} in {node['zone']} at {node['private_ip']}")
        model = json.loads(get_text(f"{result['results_uri']}/result.json"))
        steps = int((params or {}).get("steps", 200))
        print(
            f"weights {model['weights']} after {model['steps']} steps on {model['nodes']} nodes,"
            f" resumed from step {model['resumed_from']}; run cost ${result['cost_usd']}"
        )
        if model["steps"] != steps or model["nodes"] != NUM_NODES:
            raise ValueError(f"expected {steps} steps on {NUM_NODES} nodes: {model}")
        if steps >= 100 and any(
            abs(w - t) > 0.1 for w, t in zip(model["weights"], TRUE_WEIGHTS, strict=True)
        ):
            raise ValueError(f"the model did not learn {TRUE_WEIGHTS}: {model['weights']}")
        return {
            "model": model,
            "nodes": len(result.get("nodes", [])),
            "cost_usd": result["cost_usd"],
            "interruptions": result["interruptions"],
        }

    evaluate(train.output)

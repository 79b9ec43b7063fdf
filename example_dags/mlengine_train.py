"""Train, evaluate, resume: the detector's Cloud ML Engine workflow as Vertex AI custom jobs.

``train`` runs ``mlengine_code/trainer/task.py`` on a ``STANDARD_1`` cluster (a chief, 4 workers and 3
parameter servers of ML Engine's legacy machine types, translated to Compute Engine types); each replica
prints its role from ``TF_CONFIG``, the chief writes checkpoints to ``AIP_CHECKPOINT_DIR`` and the model to
``AIP_MODEL_DIR`` under the job folder ``<bucket>/<job id>/``. ``evaluate`` is a second job that reads the
training folder (``--train-folder``, as ``lumi cloud gc evaluate`` did). ``resume`` is a new job with
``resume_from`` = the training job's id: it writes into that job's folder and goes on from its newest
checkpoint (``--resume <first job id>`` in the detector's words).

Runs as is on the emulated clouds (``make demo``). On a real project set CLOUDTRAIN_GCS_BUCKET (a gs://
bucket in the job's region) and CLOUDTRAIN_GCP_PROJECT, and give Vertex AI's service agent (or
``service_account=``) read/write on the bucket. Deferrable by default (CLOUDTRAIN_DEFERRABLE=false waits in
a worker slot instead).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG

from airflow_cloudtrain.operators import MLEngineTrainOperator

BUCKET = os.environ.get("CLOUDTRAIN_GCS_BUCKET") or "gs://cloudtrain-emulated/mlengine"
PROJECT = os.environ.get("CLOUDTRAIN_GCP_PROJECT") or None  # None: the connection's project
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"
POLL_S = float(os.environ.get("CLOUDTRAIN_VERTEX_POLL_S", "2"))  # 30 s is plenty for hour-long jobs
STEP_S = os.environ.get("CLOUDTRAIN_TRAIN_STEP_S", "0.1")
# The evaluation takes 10 batches of this many seconds. A job that ends within seconds of its task
# deferring can meet Airflow's race in which the scheduler applies the stale "success" of the defer
# exit to the resumed try and fails the task (apache/airflow#66374): the operator finishes a job that
# already ended without deferring, and a job that outlives the deferral by ~15 s is out of its reach.
EVAL_BATCH_S = os.environ.get("CLOUDTRAIN_EVAL_BATCH_S", "1.5")
CODE = str(Path(__file__).parent / "mlengine_code")

common = {
    "project_id": PROJECT,
    "region": "us-central1",
    "bucket": BUCKET,
    "code": CODE,
    "deferrable": DEFERRABLE,
    "poll_interval": POLL_S,
    "log_polling_interval": POLL_S,
}

with DAG(
    dag_id="mlengine_train",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example", "vertex", "gcp"],
    doc_md=__doc__,
) as dag:
    train = MLEngineTrainOperator(
        task_id="train",
        python_module="trainer.task",
        training_args=["--steps", "12", "--step-s", STEP_S, "--checkpoint-every", "4"],
        scale_tier="STANDARD_1",
        **common,
    )
    evaluate = MLEngineTrainOperator(
        task_id="evaluate",
        python_module="trainer.evaluate",
        training_args=[
            "--train-folder",
            "{{ ti.xcom_pull(task_ids='train')['job_dir'] }}",
            "--split",
            "val",
            "--batches",
            "10",
            "--batch-s",
            EVAL_BATCH_S,
        ],
        scale_tier="BASIC",
        **common,
    )
    resume = MLEngineTrainOperator(
        task_id="resume",
        python_module="trainer.task",
        training_args=["--steps", "6", "--step-s", STEP_S, "--checkpoint-every", "3"],
        resume_from="{{ ti.xcom_pull(task_ids='train')['job_id'] }}",
        scale_tier="BASIC",
        **common,
    )
    train >> evaluate >> resume

"""A hyper-parameter sweep on a scaling group of EC2 spot workers: 12 trials, then the best one.

``make_sweep`` lists the trials (learning rate x batch size); ``sweep`` is a ``SpotFleetOperator``
that puts them on a queue and runs each once (``sweep_code/train.py``, its config in
``CLOUDTRAIN_WORK_ITEM``) on an Auto Scaling group of spot workers bid at 60% of on-demand, which
starts with one worker, grows with the backlog to four and shrinks to none as the queue empties. A
trial checkpoints every few steps; the agent uploads the newest checkpoint every 2 s, so when a
worker is reclaimed its trial goes back to the queue and resumes on another worker where it was.
``pick_best`` reads each trial's ``metric.json`` from its ``results_uri`` and returns the config
with the lowest validation loss.

Runs as is on the emulated clouds (``make demo``, which reclaims one worker mid-trial). On a real
account set CLOUDTRAIN_BUCKET and an instance profile that can read and write it
(``iam_instance_profile``). The fleet task defers while the trials run (CLOUDTRAIN_DEFERRABLE=false
to wait in a worker slot instead); CLOUDTRAIN_SWEEP_STEP_S sets each step's simulated "GPU time"
(0.15 s, about 6 s per trial).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_cloudtrain.operators import SpotFleetOperator

sys.path.insert(0, str(Path(__file__).parent))  # the DAGs folder, for the shared trial helpers
from sweep_trials import STEPS, best_trial, trials  # noqa: E402

BUCKET = os.environ.get("CLOUDTRAIN_BUCKET") or "s3://cloudtrain-emulated/examples"
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"
STEP_S = os.environ.get("CLOUDTRAIN_SWEEP_STEP_S", "0.15")  # ~6 s per trial; 0 for a quick run

with DAG(
    dag_id="spot_sweep",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example", "spot", "fleet"],
    doc_md=__doc__,
) as dag:

    @task
    def make_sweep() -> list[dict]:
        """The trials: every learning rate with every batch size (12 configs)."""
        return trials()

    sweep = SpotFleetOperator(
        task_id="sweep",
        cloud="ec2spot",
        work_items=make_sweep(),
        command="python3 train.py",
        code=str(Path(__file__).parent / "sweep_code"),
        env={"SWEEP_STEPS": str(STEPS), "SWEEP_STEP_S": STEP_S, "SWEEP_CHECKPOINT_EVERY": "5"},
        num_workers=1,
        max_workers=4,
        bid="60%",
        cpus=2,
        ram="4g",
        bucket=BUCKET,
        checkpoint_interval=2,  # seconds between checkpoint uploads (real jobs: minutes)
        item_timeout="10m",  # one trial's max_runtime
        max_item_attempts=3,
        lease_timeout=30,  # a trial whose worker vanished without a notice is back on the queue in 30 s
        max_runtime="30m",  # each worker's hard stop, a safety net
        poll_interval=1,
        deferrable=DEFERRABLE,
    )

    @task
    def pick_best(result: dict) -> dict:
        """Open each trial's metric.json (its results_uri) and return the config with the lowest loss."""
        return best_trial(result)

    pick_best(sweep.output)

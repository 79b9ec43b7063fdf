"""The hyper-parameter sweep of ``spot_sweep`` on GCE: 12 trials on a managed instance group of 3 Spot VMs.

``make_sweep`` lists the trials; ``sweep`` is a ``PreemptibleGroupOperator`` that publishes them to a
Pub/Sub topic and runs each once (``sweep_code/train.py``, its config in ``CLOUDTRAIN_WORK_ITEM``) on a
managed instance group that keeps 3 Spot VMs (``--cloud=gcspot --num-workers 3`` in the studio tool's
words): a preempted VM is recreated by the group, and its trial goes back to the subscription and
resumes from its last uploaded checkpoint on whichever worker takes it. Workers that find no work
left remove themselves from the group; the group, template, topic and subscriptions are deleted at
the end. ``pick_best`` returns the config with the lowest validation loss.

Runs as is on the emulated clouds. On a real project set CLOUDTRAIN_GCS_BUCKET (a ``gs://`` bucket) and
give the workers' service account (``service_account=``) storage, Pub/Sub subscriber/publisher and
``compute.instanceGroupManagers.update`` on the group (to leave it). The fleet task defers while the
trials run (CLOUDTRAIN_DEFERRABLE=false to wait in a worker slot instead).
"""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_cloudtrain.operators import PreemptibleGroupOperator

sys.path.insert(0, str(Path(__file__).parent))  # the DAGs folder, for the shared trial helpers
from sweep_trials import STEPS, best_trial, trials  # noqa: E402

BUCKET = os.environ.get("CLOUDTRAIN_GCS_BUCKET") or "gs://cloudtrain-emulated/examples"
DEFERRABLE = os.environ.get("CLOUDTRAIN_DEFERRABLE", "true").lower() == "true"
STEP_S = os.environ.get("CLOUDTRAIN_SWEEP_STEP_S", "0.15")  # ~6 s per trial; 0 for a quick run

with DAG(
    dag_id="gce_sweep",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["cloudtrain", "example", "spot", "fleet", "gcp"],
    doc_md=__doc__,
) as dag:

    @task
    def make_sweep() -> list[dict]:
        """The trials: every learning rate with every batch size (12 configs)."""
        return trials()

    sweep = PreemptibleGroupOperator(
        task_id="sweep",
        cloud="gcspot",
        work_items=make_sweep(),
        command="python3 train.py",
        code=str(Path(__file__).parent / "sweep_code"),
        env={"SWEEP_STEPS": str(STEPS), "SWEEP_STEP_S": STEP_S, "SWEEP_CHECKPOINT_EVERY": "5"},
        num_workers=3,
        cpus=2,
        ram="4g",
        region="us-central1",
        bucket=BUCKET,
        checkpoint_interval=2,  # seconds between checkpoint uploads (real jobs: minutes)
        item_timeout="10m",  # one trial's max_runtime
        max_item_attempts=3,
        lease_timeout=30,  # a trial whose VM vanished without a notice is back on the subscription in 30 s
        max_runtime="30m",  # each worker's hard stop (maxRunDuration), a safety net
        poll_interval=1,
        deferrable=DEFERRABLE,
    )

    @task
    def pick_best(result: dict) -> dict:
        """Open each trial's metric.json (its results_uri) and return the config with the lowest loss."""
        return best_trial(result)

    pick_best(sweep.output)

"""A run started by the previous release (0.1.0, commit 44b71dd) is adopted by this code.

The run folder format and the ``task_state_store`` entries are the contract between releases: an
upgrade may land while a task's instance trains, its worker lost (deploys restart workers). What
0.1.0 wrote for such a run is stored in ``tests/data/release_0_1_0/`` (how it was captured: the README
there): its ledger, its launch record, the files it put in the run folder, the tags it gave the
instance and the user data it booted it with. The test plays that state back:

1. the instance the old ledger names is created in the emulator as 0.1.0 launched it (same tags,
   same bootstrap lines, spot) and the old run folder files are uploaded;
2. try 1 is a worker that writes the old ``task_state_store`` entries and dies (SIGKILL), as the
   0.1.0 worker did while it waited;
3. try 2 is this release's ``CloudTrainOperator`` with the same run key (dag_id, task_id, run_id,
   map index, bucket).

What a user checks: the task succeeded on that instance (adopted, no second launch), the job's result
is delivered, and the instance is released (nothing of the run left in the cloud).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dag_helpers import load_example, start_first_try, task_states, write_dag, xcom

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder

DATA = Path(__file__).resolve().parents[1] / "data" / "release_0_1_0" / "ec2"
DAG_ID = "release_0_1_0"  # as captured: the run key (and so the run folder) derives from these
BUCKET = "s3://cloudtrain-emulated/release-0-1-0"
REGION = "us-east-1"
WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)

DAG_SOURCE = f"""
import json
import os
import signal
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import CloudTrainOperator

OLD_STORE = os.environ.get("CLOUDTRAIN_TEST_OLD_STORE")  # set only in the process that plays 0.1.0's worker


class Release010Worker(CloudTrainOperator):
    def execute(self, context):
        if OLD_STORE:  # what 0.1.0's worker had stored when it was lost mid-wait; then it is gone
            store = context["task_state_store"]
            with open(OLD_STORE) as f:
                for key, value in json.load(f).items():
                    if value is not None:
                        store.set(key, value)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().execute(context)


with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    Release010Worker(task_id="train", cloud="ec2spot", cpus=2, ram="4g", bucket="{BUCKET}",
                     region="{REGION}", poll_interval=0.5, live_prices=False,
                     command="echo started; sleep 2; echo trained > $CLOUDTRAIN_OUTPUT_DIR/model.txt")
"""


def render(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    assert "{{" not in text, text
    return text


def launch_as_0_1_0(instance: dict[str, Any], user_data: str) -> str:
    """The instance, as 0.1.0's launch made it: its tags, type, zone, spot, bootstrap."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    made = ec2.run_instances(
        ImageId=instance["ImageId"],
        InstanceType=instance["InstanceType"],
        MinCount=1,
        MaxCount=1,
        UserData=user_data,
        Placement={"AvailabilityZone": instance["Placement"]["AvailabilityZone"]},
        InstanceMarketOptions={"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}},
        TagSpecifications=[{"ResourceType": "instance", "Tags": instance["Tags"]}],
    )
    return str(made["Instances"][0]["InstanceId"])


def test_a_run_launched_by_0_1_0_is_adopted_delivered_and_released(emu, airflow_db, tmp_path) -> None:
    write_dag(DAG_SOURCE, DAG_ID)
    run_uri = RunKey(DAG_ID, "train", f"manual__{WHEN.isoformat()}", -1, BUCKET)
    instance = json.loads((DATA / "instance.json").read_text())
    template = (DATA / "store.json").read_text()
    old_uri = json.loads(render(template, {"instance_id": "i-0", "launched_at": "0", "requested_at": "0"}))
    folder = open_run_folder(old_uri["cloudtrain_launch"]["run_uri"])
    assert folder.uri.endswith(run_uri.path())  # the same run key as 0.1.0's: the new code finds it

    # the run folder as 0.1.0's operator left it, then its instance (whose agent reads that folder)
    now = time.time()
    files = sorted(p for p in (DATA / "run_folder").rglob("*") if p.is_file())
    assert files, "no captured run folder files"
    for path in files:
        if "{{instance_id}}" not in path.read_text(errors="replace"):
            folder.put_bytes(str(path.relative_to(DATA / "run_folder")), path.read_bytes())
    iid = launch_as_0_1_0(instance, (DATA / "user_data.sh").read_text())
    values = {"instance_id": iid, "launched_at": f"{now:.4f}", "requested_at": f"{now - 3:.4f}"}
    for path in files:
        text = path.read_text(errors="replace")
        if "{{instance_id}}" in text:
            folder.put_text(str(path.relative_to(DATA / "run_folder")), render(text, values))
    store = tmp_path / "store.json"
    store.write_text(render(template, values))

    # try 1: 0.1.0's worker, lost while it waited
    proc = start_first_try(DAG_ID, WHEN, {"CLOUDTRAIN_TEST_OLD_STORE": str(store)})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -9, f"try 1 did not die: rc={proc.returncode}\n{err[-3000:]}"

    # try 2: this release
    emu.reset_counts()
    run = load_example(DAG_ID).test(logical_date=WHEN, run_after=WHEN)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert result["instance_id"] == iid and result["adopted"] is True
    assert not emu.request_counts().get("RunInstances")  # no second launch
    assert result["results_uri"].endswith(f"/results/{iid}")
    assert folder.get_text(f"results/{iid}/model.txt") == "trained\n"
    # released: nothing of the run left (the emu fixture also fails on a live instance)
    from airflow_cloudtrain.clouds.registry import backend_for

    assert backend_for("ec2spot", region=REGION).cloud.find(run_uri.digest, ended=False) == []
    assert emu.running_instances() == []

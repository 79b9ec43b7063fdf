"""PreemptibleGroupOperator on the emulated GCE (Pub/Sub, instance templates, a managed instance group,
agents as local workers), inside real Airflow: every item runs once on a group of constant size, a
preempted member is recreated by the group and its item resumes from its checkpoint, a failing item
fails the task by name and reaches the dead-letter topic, and nothing of the run exists afterwards.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from dag_helpers import gce_fleet_nothing_left, task_states, write_dag, xcom

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder

JOBS = str(Path(__file__).parent / "jobs")
BUCKET = "gs://cloudtrain-emulated/fleet"


def group_dag(
    dag_id: str, items: list[Any], deferrable: bool = False, extra: str = "", lease_timeout: int = 10
) -> Any:
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import PreemptibleGroupOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            PreemptibleGroupOperator(
                task_id="sweep", cpus=2, ram="4g", code={JOBS!r}, command="python3 item.py",
                bucket={BUCKET!r}, region="us-central1", work_items={items!r}, poll_interval=0.5,
                live_prices=False, lease_timeout={lease_timeout}, checkpoint_interval=1, deferrable={deferrable},
                {extra})
        """
    )
    return write_dag(source, dag_id)


def digest_of(dag_id: str, run: Any) -> str:
    return RunKey(dag_id, "sweep", run.run_id, -1, BUCKET).digest


def item_output(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(open_run_folder(item["results_uri"]).get_text("item.json") or "{}")


def test_six_items_on_a_group_of_three_each_run_once(emu, airflow_db, capfd) -> None:
    items = [{"steps": 3, "step_s": 0.2, "n": n} for n in range(6)]
    dag_id = "gce_group_six"
    dag = group_dag(dag_id, items, extra="num_workers=3")
    emu.reset_counts()
    run = dag.test()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["cloud"] == "gcspot" and result["items_total"] == 6 and result["items_succeeded"] == 6
    assert result["items_failed"] == [] and result["items_duplicated"] == []
    for n, item in enumerate(result["items"]):
        assert item["state"] == "succeeded" and item["exit_code"] == 0 and item["attempts"] == 1
        assert item_output(item)["item"]["n"] == n
    assert "Created managed instance group" in capfd.readouterr().out
    assert 1 <= result["workers_launched"] <= 3 and result["cost_usd"] > 0
    # the Spot members at the Spot SKU price the Billing catalog says they were charged
    charged = re.search(r"(\d+) worker\(s\).*; (\d+) at the prices charged \(", result["cost_basis"])
    assert charged is not None and charged[1] == charged[2], result["cost_basis"]
    assert emu.request_counts().get("instanceGroupManagers.insert") == 1
    gce_fleet_nothing_left(emu, digest_of(dag_id, run))


def test_a_preempted_member_is_recreated_and_its_item_resumes(emu, airflow_db, tmp_path) -> None:
    # both items hold at step 6 (jobs/item.py) until the preempted member is gone: an item free to
    # finish could end before a slow machine got the preemption to its worker
    release = tmp_path / "preempted"
    items = [{"steps": 24, "step_s": 0.25, "n": n, "hold_at": 6, "release": str(release)} for n in (0, 1)]
    dag_id = "gce_group_preempted"
    dag = group_dag(dag_id, items, deferrable=True, extra="num_workers=2")
    preempted: list[str] = []
    recreated: list[str] = []

    def preempt_one() -> None:  # the first worker whose item uploaded a checkpoint past step 4
        deadline = time.monotonic() + 500
        while not preempted and time.monotonic() < deadline:
            for inst in emu.running_instances():
                log = emu.agent_log(inst["id"])
                if inst["group"] and "uploaded to" in log and "step 6" in log:
                    preempted.append(inst["id"])
                    # the agent polls the metadata every 5 s: 15 s leave a loaded machine three polls to see
                    # the notice and requeue the item (5 s could pass unseen, and the item moved uncounted)
                    emu.interrupt(inst["id"], notice_s=15)
                    break
            time.sleep(0.1)
        gone = False
        while preempted and not recreated and time.monotonic() < deadline:
            names = {i["id"] for i in emu.running_instances()}
            gone = gone or preempted[0] not in names
            if gone:
                release.touch()  # the preempted member is gone: the items may go on
            if gone and preempted[0] in names:  # the group made a VM of that name again
                recreated.append(preempted[0])
            time.sleep(0.1)
        release.touch()  # whatever happened, the items may go on (the asserts below tell)

    thread = threading.Thread(target=preempt_one, daemon=True)
    thread.start()
    run = dag.test()
    thread.join(30)
    assert preempted, "no member was preempted"
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["items_succeeded"] == 2 and result["interruptions"] >= 1
    moved = [i for i in result["items"] if i["interruptions"]]
    assert len(moved) == 1, result["items"]
    assert item_output(moved[0])["resumed_from"] >= 2  # not from scratch: its checkpoint
    assert result["items_duplicated"] == []
    assert recreated, "the group did not recreate the preempted VM"
    gce_fleet_nothing_left(emu, digest_of(dag_id, run))


def test_an_item_failing_every_attempt_fails_the_task_naming_it(emu, airflow_db) -> None:
    items = [{"steps": 2, "step_s": 0.1}, {"steps": 2, "fail": True}]
    dag_id = "gce_group_failing"
    dag = group_dag(dag_id, items, extra="num_workers=1, max_item_attempts=2")
    run = dag.test()
    assert task_states(run) == {"sweep": "failed"}
    folder = open_run_folder(f"{BUCKET}/{RunKey(dag_id, 'sweep', run.run_id, -1, BUCKET).path()}")
    failed = json.loads(folder.get_text("outcomes/0001.json"))
    assert failed["state"] == "failed" and failed["attempts"] == 2 and failed["exit_code"] == 3
    assert json.loads(folder.get_text("outcomes/0000.json"))["state"] == "succeeded"
    gce_fleet_nothing_left(emu, digest_of(dag_id, run))


def test_allow_failed_items_on_standard_vms_with_cloud_gcloud(emu, airflow_db, capfd) -> None:
    dag_id = "gce_group_gcloud"
    dag = group_dag(
        dag_id,
        [{"steps": 1}, {"fail": True}],
        extra="cloud='gcloud', max_item_attempts=1, allow_failed_items=True",
    )
    run = dag.test()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["cloud"] == "gcloud" and result["items_failed"] == ["0001"]
    assert result["items_succeeded"] == 1
    assert_item_tail(capfd.readouterr().out, "0001")  # its last lines in the task log
    gce_fleet_nothing_left(emu, digest_of(dag_id, run))


def assert_item_tail(task_log: str, item_id: str) -> None:
    """The failed item's last output lines follow its "failed for good" line in the task log."""
    lines = task_log.splitlines()
    failed = next(n for n, line in enumerate(lines) if f"Item {item_id} failed for good" in line)
    assert "command exited with code 3" in lines[failed]
    after = "\n".join(lines[failed:])
    assert f"] item {item_id}: fresh start" in after
    assert f"[item {item_id} " in after and f"] item {item_id} fails on purpose" in after


def test_a_group_survives_server_errors_on_30_percent_of_its_calls(emu, airflow_db) -> None:
    """Compute Engine, Pub/Sub and GCS answer 30% of the calls (the operator's and the workers') with
    503 backendError for the whole run: every item still runs once, and nothing is left.

    Leases of a minute, as for the EC2 fleet's twin in test_spot_fleet.py: with the other tests' 10 s,
    an ack-deadline extension retried through backoff on a loaded machine (load 14 seen) outlasted
    the lease, Pub/Sub delivered the item to the second worker while the first still ran it, and the
    result said so (``items_duplicated == ['0000']``): what the README promises for a lapsed lease,
    not what this test is about."""
    items = [{"steps": 3, "step_s": 0.2, "n": n} for n in range(4)]
    dag_id = "gce_group_unavailable"
    dag = group_dag(dag_id, items, extra="num_workers=2", lease_timeout=60)
    emu.unavailable(rate=0.3, api=("compute", "pubsub", "storage"), seed=12)
    try:
        run = dag.test()
        counts = emu.request_counts()
    finally:
        emu.clear_faults()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["items_succeeded"] == 4 and result["items_duplicated"] == []
    refused = {k for k, v in counts.items() if k.startswith("unavailable:") and v}
    assert len(refused) >= 4, counts
    gce_fleet_nothing_left(emu, digest_of(dag_id, run))

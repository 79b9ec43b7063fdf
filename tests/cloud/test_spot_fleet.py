"""SpotFleetOperator on the emulated EC2 (moto's SQS and Auto Scaling, agents as local workers),
inside real Airflow: every item runs once, the group scales with the backlog and back to zero, a
reclaimed worker's item resumes elsewhere from its checkpoint, a failing item fails the task by name,
and nothing of the run exists afterwards.
"""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from dag_helpers import fleet_nothing_left as nothing_left
from dag_helpers import task_states, write_dag, xcom
from waiting import wait_for

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.storage import open_run_folder
from airflow_cloudtrain.ui.runs import load_running

JOBS = str(Path(__file__).parent / "jobs")
BUCKET = "s3://cloudtrain-emulated/fleet"


def fleet_dag(
    dag_id: str,
    items: list[Any],
    deferrable: bool = False,
    extra: str = "",
    cloud: str = "ec2spot",
    lease_timeout: int = 10,
) -> Any:
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import SpotFleetOperator

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            SpotFleetOperator(
                task_id="sweep", cloud={cloud!r}, cpus=2, ram="4g", code={JOBS!r},
                command="python3 item.py", bucket={BUCKET!r}, region="us-east-1",
                work_items={items!r}, poll_interval=0.5, live_prices=False, lease_timeout={lease_timeout},
                checkpoint_interval=1, deferrable={deferrable}, {extra})
        """
    )
    return write_dag(source, dag_id)


def digest_of(dag_id: str, run: Any) -> str:
    return RunKey(dag_id, "sweep", run.run_id, -1, BUCKET).digest


def item_output(result: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    folder = open_run_folder(item["results_uri"])
    return json.loads(folder.get_text("item.json") or "{}")


class GroupRecorder:
    """Samples the group's desired capacity and members while the task runs."""

    def __init__(self, name_prefix: str = "ct-") -> None:
        self.desired: list[int] = []
        self.members: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.prefix = name_prefix
        self.thread.start()

    def _run(self) -> None:
        asg = boto3.client("autoscaling")
        while not self.stop.is_set():
            for group in asg.describe_auto_scaling_groups()["AutoScalingGroups"]:
                if group["AutoScalingGroupName"].startswith(self.prefix):
                    self.desired.append(group["DesiredCapacity"])
                    self.members.append(len(group["Instances"]))
            time.sleep(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_twelve_items_on_one_to_four_workers_each_run_once(emu, airflow_db, capfd) -> None:
    items = [{"steps": 4, "step_s": 0.2, "n": n} for n in range(12)]
    dag_id = "fleet_twelve"
    dag = fleet_dag(dag_id, items, extra="num_workers=1, max_workers=4")
    emu.reset_counts()
    recorder = GroupRecorder()
    try:
        run = dag.test()
    finally:
        recorder.close()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["items_total"] == 12 and result["items_succeeded"] == 12
    assert result["items_failed"] == [] and result["items_duplicated"] == []
    for n, item in enumerate(result["items"]):
        assert item["state"] == "succeeded" and item["exit_code"] == 0 and item["attempts"] == 1
        output = item_output(result, item)
        assert output["id"] == item["id"] and output["item"]["n"] == n
    # the group started with one worker and grew to four while items waited
    assert "1 worker(s) to start, up to 4" in capfd.readouterr().out
    assert max(recorder.desired) == 4
    assert max(recorder.members) <= 4
    assert 2 <= result["workers_launched"] <= 4 + 4  # a worker that left may be replaced by a new one
    assert result["cost_usd"] > 0 and result["interruptions"] == 0
    # every worker was a spot instance, priced from its zone's spot price history as it was charged
    charged = re.search(
        r"(\d+) worker\(s\).*; (\d+) at the prices charged \(EC2 spot price history", result["cost_basis"]
    )
    assert charged is not None and charged[1] == charged[2], result["cost_basis"]
    assert emu.request_counts().get("CreateAutoScalingGroup") == 1
    nothing_left(digest_of(dag_id, run))
    assert indexed_cost(BUCKET, dag_id) == pytest.approx(result["cost_usd"], abs=1e-6)  # cloudtrain costs


def indexed_cost(bucket: str, dag_id: str) -> float:
    """What ``cloudtrain costs --by dag`` says ``dag_id`` cost."""
    import contextlib
    import io

    from airflow_cloudtrain.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["costs", "--bucket", bucket, "--by", "dag", "--json"]) == 0
    rows = {row["dag"]: row for row in json.loads(out.getvalue())["rows"]}
    return float(rows[dag_id]["cost_usd"])


def test_idle_workers_leave_and_a_busy_one_is_never_scaled_in(emu, airflow_db) -> None:
    """One long item and three short ones on four workers: the three that run out of work leave
    (desired capacity 4 -> 1) while the long item's worker, protected, runs it to the end once."""
    items = [{"steps": 60, "step_s": 0.25}] + [{"steps": 1, "step_s": 0.1}] * 3
    dag_id = "fleet_scale_in"
    dag = fleet_dag(dag_id, items, extra="num_workers=4, max_workers=4")
    recorder = GroupRecorder()
    try:
        run = dag.test()
    finally:
        recorder.close()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert max(recorder.desired) == 4
    assert min(recorder.desired[recorder.desired.index(4) :]) <= 1  # the idle ones left by themselves
    long_item = result["items"][0]
    assert long_item["attempts"] == 1 and long_item["duplicate_runs"] == 0  # never scaled in
    assert item_output(result, long_item)["step"] == 60
    nothing_left(digest_of(dag_id, run))


def test_deferrable_fleet_with_a_reclaimed_worker_resumes_the_item_elsewhere(
    emu, airflow_db, tmp_path
) -> None:
    # both items hold at step 6 (jobs/item.py) until a worker was reclaimed and is gone: an item free
    # to finish could end before a slow machine got the notice to its worker
    release = str(tmp_path / "reclaimed")
    items = [{"steps": 24, "step_s": 0.25, "n": n, "hold_at": 6, "release": release} for n in (0, 1)]
    dag_id = "fleet_reclaimed"
    dag = fleet_dag(dag_id, items, deferrable=True, extra="num_workers=2, max_workers=2")
    reclaimed: list[str] = []
    running: list[dict[str, Any]] = []  # the Cloud training page's row of the fleet while it runs

    def mine() -> list[dict[str, Any]]:
        return [r for r in load_running([BUCKET]) if r["dag_id"] == dag_id]

    def reclaim_one() -> None:  # the first worker whose item uploaded a checkpoint past step 4
        deadline = time.monotonic() + 500
        while not reclaimed and time.monotonic() < deadline:
            for inst in emu.running_instances():
                log = emu.agent_log(inst["id"])
                if "uploaded to" in log and "step 6" in log:
                    # the items hold at step 6: the triggerer's watch has seen both workers by now
                    running.extend(
                        wait_for(lambda: [r for r in mine() if r["nodes"] == 2], timeout=120, interval=0.2)
                    )
                    reclaimed.append(inst["id"])
                    # the agent polls the metadata every 5 s: 15 s leave a loaded machine three polls to see
                    # the notice and requeue the item (5 s could pass unseen, and the item moved uncounted)
                    emu.interrupt(inst["id"], notice_s=15)
                    break
            time.sleep(0.1)
        while reclaimed and reclaimed[0] in {i["id"] for i in emu.running_instances()}:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        open(release, "w").close()  # the reclaimed worker is gone: the items may go on

    thread = threading.Thread(target=reclaim_one, daemon=True)
    thread.start()
    run = dag.test()
    thread.join(10)
    assert reclaimed, "no worker was reclaimed"
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["items_succeeded"] == 2 and result["interruptions"] >= 1
    moved = [i for i in result["items"] if i["interruptions"]]
    assert len(moved) == 1, result["items"]
    assert moved[0]["instance_id"] != reclaimed[0]
    assert item_output(result, moved[0])["resumed_from"] >= 2  # not from scratch: its checkpoint
    nothing_left(digest_of(dag_id, run))
    # on the page while it ran (kept by the triggerer's watch): the group, its two workers, their cost
    (row,) = running
    assert (row["key"], row["instance_id"]) == (result["run_id"], result["group"])
    assert row["operator"] == "SpotFleetOperator" and row["cloud"] == "ec2spot" and row["spot"]
    assert row["hourly_usd"] > 0 and 0 < row["cost_so_far_usd"] < result["cost_usd"] * 2
    assert not any(r["key"] == result["run_id"] for r in mine())  # and out once priced


def test_an_item_failing_every_attempt_fails_the_task_naming_it(emu, airflow_db) -> None:
    items = [{"steps": 2, "step_s": 0.1}, {"steps": 2, "fail": True}, {"steps": 2, "step_s": 0.1}]
    dag_id = "fleet_failing"
    dag = fleet_dag(dag_id, items, extra="num_workers=1, max_workers=2, max_item_attempts=2")
    run = dag.test()
    assert task_states(run) == {"sweep": "failed"}
    folder = open_run_folder(f"{BUCKET}/{RunKey(dag_id, 'sweep', run.run_id, -1, BUCKET).path()}")
    failed = json.loads(folder.get_text("outcomes/0001.json"))
    assert failed["state"] == "failed" and failed["attempts"] == 2 and failed["exit_code"] == 3
    assert json.loads(folder.get_text("outcomes/0000.json"))["state"] == "succeeded"
    assert json.loads(folder.get_text("outcomes/0002.json"))["state"] == "succeeded"
    nothing_left(digest_of(dag_id, run))


def test_allow_failed_items_succeeds_and_lists_them(emu, airflow_db, capfd) -> None:
    dag_id = "fleet_allow_failed"
    dag = fleet_dag(
        dag_id, [{"steps": 1}, {"fail": True}], extra="max_item_attempts=1, allow_failed_items=True"
    )
    run = dag.test()
    assert task_states(run) == {"sweep": "success"}
    result = xcom(run, "sweep")
    assert result["items_failed"] == ["0001"] and result["items_succeeded"] == 1 and result["exit_code"] == 1
    # the task log shows the failed item's own last lines under its failure, as a single run's log does
    assert_item_tail(capfd.readouterr().out, "0001")
    nothing_left(digest_of(dag_id, run))


def assert_item_tail(task_log: str, item_id: str) -> None:
    """The failed item's last output lines follow its "failed for good" line in the task log."""
    lines = task_log.splitlines()
    failed = next(n for n, line in enumerate(lines) if f"Item {item_id} failed for good" in line)
    assert "command exited with code 3" in lines[failed]
    after = "\n".join(lines[failed:])
    assert f"] item {item_id}: fresh start" in after
    assert f"[item {item_id} " in after and f"] item {item_id} fails on purpose" in after


def test_on_demand_workers_with_cloud_ec2(emu, airflow_db) -> None:
    dag_id = "fleet_on_demand"
    dag = fleet_dag(dag_id, [{"steps": 1}, {"steps": 1}], cloud="ec2")
    run = dag.test()
    assert task_states(run) == {"sweep": "success"}
    assert xcom(run, "sweep")["items_succeeded"] == 2
    nothing_left(digest_of(dag_id, run))


def test_a_fleet_survives_server_errors_on_30_percent_of_its_calls(emu, airflow_db) -> None:
    """EC2, Auto Scaling, SQS and S3 answer 30% of the calls (the operator's and the workers') with
    their server errors for the whole run: every item still runs once, and nothing is left.

    Leases of a minute, as a user would set them (the other tests' 10 s make a vanished worker's item
    come back quickly): a renewal retried through backoff on a loaded machine may take longer than
    10 s, and a lease that lapses while its worker lives lets a second worker run the item (one
    result is kept, as the README says; this test checks that nothing runs twice otherwise)."""
    items = [{"steps": 3, "step_s": 0.2, "n": n} for n in range(4)]
    dag_id = "fleet_unavailable"
    dag = fleet_dag(dag_id, items, extra="num_workers=2, max_workers=2", lease_timeout=60)
    emu.unavailable(rate=0.3, api=("ec2", "autoscaling", "sqs", "s3"), seed=11)
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
    nothing_left(digest_of(dag_id, run))

"""``idle_timeout`` on every operator that runs our agent, for real (issue 25, "Idle shutdown
everywhere").

- A gang (agent level, three agent processes on one run folder, as ``test_gang_barrier``): one idle
  rank of a busy gang is waiting on the others, so nobody is stopped while rank 0 computes; once every
  rank is idle, every node stops its job and ends ``idle``.
- ``CloudTrainOperator`` (EC2 emulated, inside Airflow's ``dag.test()``): a job that hangs is stopped,
  the task fails saying so, and the instance is gone. The path is the agent's and the single run's,
  the same code on both clouds, so one cloud is enough here.
- ``SpotFleetOperator`` and ``PreemptibleGroupOperator``: an item whose job hangs is stopped, retried
  up to ``max_item_attempts`` like any failure, and shows in the XCom, while the other items succeed.

Every wait is on a condition with a generous deadline (``tests/waiting.py``).
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import fleet_nothing_left, gce_fleet_nothing_left, task_states, write_dag, xcom
from test_agent_checkpoints import reap
from test_gang_barrier import Node, addresses, free_port
from waiting import wait_for

from airflow_cloudtrain.contract import gang, runs
from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.storage import RunFolder, open_run_folder

FAST: dict[str, Any] = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.5, "metadata_poll_s": 0.5}
TIMEOUT_S = 3.0

# Rank 0 computes (a light, steady CPU load) until the flag file exists; every rank then sleeps.
GANG_JOB = r"""
import os, sys, time
rank, flag = int(os.environ["NODE_RANK"]), sys.argv[1]
print("rank", rank, "started", flush=True)
while rank == 0 and not os.path.exists(flag):
    t = time.time()
    while time.time() - t < 0.03:
        pass
    time.sleep(0.07)
print("rank", rank, "idle now", flush=True)
time.sleep(600)
"""


@pytest.fixture
def gang_run(emu: Any, tmp_path: Path) -> Iterator[tuple[Any, RunFolder, Path]]:
    uri = f"s3://{DEFAULT_BUCKET}/runs/gang-idle/{uuid.uuid4().hex[:12]}/-1"
    (tmp_path / "job.py").write_text(GANG_JOB)
    yield emu, open_run_folder(uri), tmp_path
    reap(tmp_path)


def idle_records(folder: RunFolder) -> dict[int, gang.IdleRecord]:
    found = {}
    for rank in range(3):
        text = folder.get_text(gang.idle_key(rank))
        if text:
            found[rank] = gang.IdleRecord.from_json(text)
    return found


def test_a_gang_is_stopped_only_once_every_node_is_idle(gang_run: tuple[Any, RunFolder, Path]) -> None:
    emu, folder, tmp = gang_run
    ips = addresses(3)
    flag = tmp / "rank0-done"
    spec = runs.RunSpec(
        run_id="ct-gang-idle",
        run_uri=folder.uri,
        cloud="ec2",
        command=f"exec {sys.executable} {tmp / 'job.py'} {flag}",
        num_nodes=3,
        master_port=free_port(ips[0]),
        gang_timeout_s=180,
        idle_timeout_s=TIMEOUT_S,
        **FAST,
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    nodes = [Node(emu, folder, tmp, ip) for ip in ips]
    folder.put_text(gang.RANKS_KEY, gang.ranks_json([n.iid for n in nodes]))
    try:
        for node in nodes:
            node.start()

        def idle_a_while() -> bool:
            """Ranks 1 and 2 have said "idle" for three timeouts, rank 0 never."""
            records, now = idle_records(folder), time.time()
            since = [records[r].idle_since if r in records else None for r in (1, 2)]
            return 0 not in records and all(s is not None and now - s > 3 * TIMEOUT_S for s in since)

        wait_for(idle_a_while, timeout=180, interval=0.5, message="ranks 1 and 2 idle for 3 timeouts")
        for rank, node in enumerate(nodes):  # nobody stopped: the gang is busy while rank 0 computes
            assert node.proc is not None and node.proc.poll() is None, (rank, node.log()[-2000:])
            assert node.status().state == runs.RUNNING, (rank, node.status())
        flag.touch()  # rank 0 goes idle too: now the whole gang is hung
        statuses = [node.wait() for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    message = f"no CPU or GPU use for {TIMEOUT_S:g} s on all 3 nodes of the gang (idle_timeout): stopped the hung job"
    for rank, (node, status) in enumerate(zip(nodes, statuses, strict=True)):
        log = node.log()
        assert status.state == runs.IDLE and status.message == message, (rank, status, log[-2000:])
        assert f"rank {rank} idle now" in log
    for rank in (1, 2):  # they said why they kept waiting, once
        waits = [ln for ln in nodes[rank].log().splitlines() if "rank 0 of the gang is busy" in ln]
        assert len(waits) == 1, nodes[rank].log()[-3000:]
    assert all(r.ended for r in idle_records(folder).values())  # each job's end is on record


# --- CloudTrainOperator -----------------------------------------------------------------------------


def test_cloud_train_stops_a_hung_job_and_fails_saying_so(emu: Any, airflow_db: Any, capfd: Any) -> None:
    from test_runs import launched, scenario, status_of

    dag_id = "idle_cloud_train"
    dag = scenario(dag_id, "aws", "echo started; sleep 600", spot=False, extra=", idle_timeout='3s'")
    run = dag.test()
    assert task_states(run) == {"train": "failed"}
    (iid,) = launched("aws", dag_id, run)  # and terminated
    status = status_of("aws", dag_id, run, iid)
    message = "no CPU or GPU use for 3 s (idle_timeout): stopped the hung job"
    assert status.state == runs.IDLE and status.message == message, status
    assert status.exit_code == 143  # SIGTERM ended the sleep
    out = capfd.readouterr().out
    assert f"{message} (run " in out  # the task's failure says why, as CheckpointResumeOperator's does


# --- the work-queue operators -------------------------------------------------------------------------

ITEM_JOB = r"""
import json, os, time
item = json.loads(os.environ["CLOUDTRAIN_WORK_ITEM"])
print("item", os.environ["CLOUDTRAIN_ITEM_ID"], "started", flush=True)
if item.get("hang"):
    time.sleep(600)
with open(os.path.join(os.environ["CLOUDTRAIN_OUTPUT_DIR"], "item.json"), "w") as out:
    json.dump(item, out)
"""
FLEETS = {
    # operator, its bucket, its region
    "spot": (
        "SpotFleetOperator",
        "s3://cloudtrain-emulated/fleet",
        "us-east-1",
        "num_workers=2, max_workers=2",
    ),
    "group": ("PreemptibleGroupOperator", "gs://cloudtrain-emulated/fleet", "us-central1", "num_workers=2"),
}


@pytest.mark.parametrize("fleet", sorted(FLEETS))
def test_a_hung_item_is_a_failed_attempt_and_the_queue_goes_on(
    fleet: str, emu: Any, airflow_db: Any, tmp_path: Path
) -> None:
    operator, bucket, region, workers = FLEETS[fleet]
    code = tmp_path / "code"
    code.mkdir()
    (code / "item.py").write_text(ITEM_JOB)
    items = [{"n": 0}, {"n": 1, "hang": True}, {"n": 2}]
    dag_id = f"idle_fleet_{fleet}"
    source = textwrap.dedent(
        f"""
        from datetime import datetime
        from airflow.sdk import DAG
        from airflow_cloudtrain.operators import {operator}

        with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
            {operator}(
                task_id="sweep", cpus=2, ram="4g", code={str(code)!r}, command="python3 item.py",
                bucket={bucket!r}, region={region!r}, work_items={items!r}, poll_interval=0.5,
                live_prices=False, lease_timeout=10, idle_timeout="3s", max_item_attempts=2,
                allow_failed_items=True, {workers})
        """
    )
    run = write_dag(source, dag_id).test()
    assert task_states(run) == {"sweep": "success"}  # allow_failed_items: the hung item is listed
    result = xcom(run, "sweep")
    assert result["items_failed"] == ["0001"] and result["items_succeeded"] == 2, result
    by_id = {item["id"]: item for item in result["items"]}
    for item_id in ("0000", "0002"):  # the queue went on: the others ran once and succeeded
        assert by_id[item_id]["state"] == "succeeded" and by_id[item_id]["attempts"] == 1, by_id[item_id]
    hung = by_id["0001"]
    assert hung["state"] == "failed" and hung["attempts"] == 2, hung  # retried, then failed for good
    assert hung["exit_code"] == 143, hung  # SIGTERM ended the sleeping job (128 + 15)
    outcome = json.loads(open_run_folder(result["run_uri"]).get_text("outcomes/0001.json") or "{}")
    assert outcome["message"] == "idle: no CPU or GPU use for 3 s (idle_timeout): stopped the hung job"
    digest = RunKey(dag_id, "sweep", run.run_id, -1, bucket).digest
    if fleet == "spot":
        fleet_nothing_left(digest)
    else:
        gce_fleet_nothing_left(emu, digest)

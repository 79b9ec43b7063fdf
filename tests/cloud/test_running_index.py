"""What the Cloud training page shows as running now (``ui.runs.load_running``), for real: a run's
attempt is in the bucket's running index from its launch, with its cost so far and the tail of its
job's log from the live index, and leaves it at its release, when its priced record is written. An
in-flight record a killed task left behind is not shown as running (its agent ended, or it never had
one).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, xcom
from test_runs import BUCKET, scenario
from waiting import wait_for

from airflow_cloudtrain.contract.runs import end_name, live_index_uri
from airflow_cloudtrain.lifecycle.cost_index import (
    RUNNING,
    STARTUP_GRACE_S,
    CostRecord,
    read_records,
    read_running,
    running_key,
    write_record,
)
from airflow_cloudtrain.storage import RunFolder, open_run_folder
from airflow_cloudtrain.ui.runs import live_tail, load_running

JOB = """
import pathlib, sys, time
flags = pathlib.Path(sys.argv[1])
print("training epoch 1 of 2", flush=True)
(flags / "halfway").write_text("x")
while not (flags / "go").exists():
    time.sleep(0.1)
print("done", flush=True)
"""


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_running_attempt_is_listed_with_its_cost_so_far_and_log_tail_until_released(
    emu: Any, airflow_db: Any, tmp_path: Path, provider: str
) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    dag_id = f"running_now_{provider}"
    seen: dict[str, Any] = {}
    bucket = BUCKET[provider]

    def look_while_running() -> None:
        def mine() -> list[dict[str, Any]]:
            return [r for r in load_running([bucket]) if r["dag_id"] == dag_id]

        try:
            wait_for(lambda: (tmp_path / "halfway").exists() and mine(), timeout=300, interval=0.5)
            row = wait_for(lambda: next((r for r in mine() if r["live"]), None), timeout=120, interval=0.5)
            seen["row"] = row
            seen["tail"] = wait_for(
                lambda: (t := live_tail(bucket, row["instance_id"])) and "training epoch 1 of 2" in t and t,
                timeout=120,
                interval=0.5,
            )
            later = wait_for(
                lambda: next((r for r in mine() if r["running_s"] > row["running_s"]), None), interval=0.5
            )
            seen["later"] = later
        finally:
            (tmp_path / "go").write_text("x")

    helper = threading.Thread(target=look_while_running, daemon=True)
    helper.start()
    run = scenario(dag_id, provider, f"exec {sys.executable} {script} {tmp_path}").test()
    helper.join(timeout=60)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    row = seen.get("row")
    assert row is not None, "the attempt never showed as running"
    assert (row["key"], row["instance_id"], row["task_id"]) == (
        result["run_id"],
        result["instance_id"],
        "train",
    )
    assert row["instance_type"] == result["instance_type"] and row["spot"] and row["nodes"] == 1
    assert row["cost_so_far_usd"] is not None and row["cost_so_far_usd"] > 0
    assert seen["later"]["cost_so_far_usd"] >= row["cost_so_far_usd"]  # it grows (60 s minimum first)
    assert "training epoch 1 of 2" in seen["tail"]
    # released: out of the running index, in the priced records
    folder = open_run_folder(bucket)
    assert [r for r in read_running(folder) if r.run_id == result["run_id"]] == []
    assert not any(r["key"] == result["run_id"] for r in load_running([bucket]))
    priced = [r for r in read_records(folder, time.time() - 86_400) if r.run_id == result["run_id"]]
    assert [r.cost_usd for r in priced] == [result["cost_usd"]]


def plant_running(
    folder: RunFolder,
    instance_id: str,
    launched_at: float,
    ended: bool = False,
    dag_id: str = "left_dag",
    updated_at: float | None = None,
) -> str:
    """An in-flight record of a made-up attempt (run ``ct-left-<instance id>``, $0.10/h), written as
    ``RunAttempt.start`` writes one (``cost_index.write_record``); with ``ended``, its agent's end
    marker in the bucket's live index; with ``updated_at``, a fleet's record its watch last rewrote
    then (``lifecycle.running_entry``: $0.05 spent by then). Its key."""
    record = CostRecord(
        dag_id, "train", "manual__1", -1, f"ct-left-{instance_id}", f"{folder.uri}/x", "ec2spot",
        instance_id, "m5.large", 1, True, RUNNING, False, launched_at, launched_at, None, "", 0.1,
    )  # fmt: skip
    if updated_at is not None:
        record = replace(record, operator="SpotFleetOperator", updated_at=updated_at, cost_usd=0.05)
    write_record(folder, record, logging.getLogger(__name__))
    if ended:
        folder.at(live_index_uri(folder.uri)).put_text(end_name(instance_id), "{}")
    return record.key()


def test_in_flight_records_a_killed_task_left_are_not_shown_as_running(emu: Any) -> None:
    bucket = BUCKET["aws"]
    folder = open_run_folder(bucket)
    now = time.time()
    plant_running(folder, "i-booting", now - 60, dag_id="killed_dag")  # no agent yet: it may still come
    # never had an agent: a launch its task abandoned
    plant_running(folder, "i-never", now - STARTUP_GRACE_S - 60, dag_id="killed_dag")
    # its agent ended (the live index's end marker): released or about to be
    plant_running(folder, "i-ended", now - 600, ended=True, dag_id="killed_dag")
    shown = {r["instance_id"]: r for r in load_running([bucket], now=now) if r["dag_id"] == "killed_dag"}
    assert set(shown) == {"i-booting"}
    assert shown["i-booting"]["live"] is False
    assert shown["i-booting"]["cost_so_far_usd"] == round(0.1 * 60 / 3600, 6)  # the 60 s minimum
    for iid in ("i-booting", "i-never", "i-ended"):
        folder.delete_key(running_key(f"ct-left-{iid}", iid))

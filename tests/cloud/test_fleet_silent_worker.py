"""A fleet worker whose agent dies while its machine runs on (``Emulator.crash_agent``): nothing works
there any more, and the group would keep it for good. The fleet's watch sees its record stop changing
for ``heartbeat_timeout`` and has the group replace it (EC2: terminated through the Auto Scaling group
without lowering its desired capacity, a new instance; GCE: ``recreateInstances``, the same name); the
item it held comes back after its lease and resumes from its checkpoint on the new worker. One worker,
so without the replacement the run would never end.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import fleet_nothing_left, gce_fleet_nothing_left, task_states, xcom
from test_preemptible_group import digest_of as group_digest
from test_preemptible_group import group_dag, item_output
from test_spot_fleet import digest_of as fleet_digest
from test_spot_fleet import fleet_dag


def crash_when_holding(emu: Any, crashed: list[str], release: Path) -> threading.Thread:
    """Crash the agent of the first worker whose item uploaded its step-4 checkpoint and holds there;
    then let the item go on (the dead agent's job may finish: nobody reports it)."""

    def run() -> None:
        deadline = time.monotonic() + 500
        while not crashed and time.monotonic() < deadline:
            for inst in emu.running_instances():
                log = emu.agent_log(inst["id"])
                if "checkpoint step 4 uploaded" in log:
                    emu.crash_agent(inst["id"])
                    crashed.append(inst["id"])
                    break
            time.sleep(0.1)
        release.touch()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_worker_whose_agent_died_is_replaced_and_its_item_resumes(
    emu: Any, airflow_db: Any, capfd: Any, tmp_path: Path, provider: str
) -> None:
    release = tmp_path / "crashed"
    items = [{"steps": 10, "step_s": 0.25, "n": 0, "hold_at": 4, "release": str(release)}]
    dag_id = f"silent_worker_{provider}"
    extra = "heartbeat_timeout='8s'"
    if provider == "aws":
        dag = fleet_dag(dag_id, items, extra=f"num_workers=1, max_workers=1, {extra}")
    else:
        dag = group_dag(dag_id, items, extra=f"num_workers=1, {extra}")
    crashed: list[str] = []
    thread = crash_when_holding(emu, crashed, release)
    run = dag.test()
    thread.join(30)
    out = capfd.readouterr().out
    assert crashed, "no worker's agent was crashed"
    assert task_states(run) == {"sweep": "success"}, out[-3000:]
    assert f"Worker {crashed[0]} stopped beating" in out and "replacing it" in out
    result = xcom(run, "sweep")
    (item,) = result["items"]
    assert item["state"] == "succeeded" and item_output(item)["resumed_from"] >= 2  # its checkpoint
    assert result["workers_launched"] >= (2 if provider == "aws" else 1)  # GCE: the same name again
    if provider == "aws":
        fleet_nothing_left(fleet_digest(dag_id, run))
    else:
        gce_fleet_nothing_left(emu, group_digest(dag_id, run))

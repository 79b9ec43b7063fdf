"""A spot run that keeps losing its zone moves to another zone of the region (issue 29).

``CheckpointResumeOperator(zones=[A, B], policy="deadline")`` on the emulated EC2 (blocking) and GCE
(deferrable), inside real Airflow. Zone B has no capacity for the run's type at first; the job
(``jobs/steps.py``) is preempted twice in zone A without a notice, each time once it has uploaded a
checkpoint. After the first preemption the relaunch tries B first (A just took an instance back), finds
no capacity there and fails over to A; B's capacity comes back with the second preemption, and the
third attempt is spot in B (not on-demand), restoring the checkpoint the second attempt uploaded (the
bucket's: nothing is copied). The ledger says so: the second attempt's ``no_capacity_in`` names B, the
third's ``moved_from`` names A with the reason, the printed table shows the move, and nothing is left.

With ``zones=[A]`` the same events relaunch spot in A every time, as a run with ``zone=A`` always did:
B is never tried and no row is a move.

On EC2 each ranked spot launch also asks for the zones' Spot placement scores: a run that has seen
nothing launches where EC2 scores highest, and where the role may not ask (``UnauthorizedOperation``)
it launches in the user's order, asking once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, xcom
from test_checkpoint_resume import Interrupter, resume_dag

from airflow_cloudtrain.lifecycle.resume.history import format_ledger
from airflow_cloudtrain.storage import open_run_folder

ZONES = {"aws": ("us-east-1a", "us-east-1b"), "gcp": ("us-central1-a", "us-central1-b")}
TYPE = {"aws": "t3.medium", "gcp": "n1-standard-2"}
SPOT_CLOUD = {"aws": "ec2spot", "gcp": "gcspot"}


class CapacityBackWith:
    """The emulator, whose ``interrupt`` number ``at`` first lifts the capacity faults: the relaunch
    after that preemption finds capacity everywhere (and cannot race the lift)."""

    def __init__(self, emu: Any, at: int) -> None:
        self.emu, self.at, self.calls = emu, at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.emu, name)

    def interrupt(self, instance_id: str, notice_s: float = 5.0) -> None:
        self.calls += 1
        if self.calls == self.at:
            self.emu.clear_faults()
        self.emu.interrupt(instance_id, notice_s=notice_s)


def run_preempted_twice(
    emu: Any, tmp_path: Path, provider: str, zones: tuple[str, ...], deferrable: bool
) -> Any:
    first, other = ZONES[provider]
    emu.fail_capacity(TYPE[provider], zone=other)  # B: no capacity until the second preemption
    done = tmp_path / "preempted"
    interrupter = Interrupter(
        CapacityBackWith(emu, at=2), [3, 3], notice_s=[0, 0], uploaded=True, done_flag=done
    )
    extra = (
        f"policy='deadline', deadline=timedelta(hours=6), expected_duration=60, "
        f"instance_type={TYPE[provider]!r}, zones={list(zones)!r}"
    )
    dag_id = f"zone_move_{provider}_{len(zones)}"
    command = f"STEPS_FINISH_AFTER={done} python3 steps.py 24 2 0.25"
    run = resume_dag(dag_id, provider, command, deferrable, extra=extra).test()
    interrupter.join()
    assert task_states(run) == {"train": "success"}
    return xcom(run, "train"), interrupter


@pytest.mark.parametrize(
    ("provider", "deferrable"), [("aws", False), ("gcp", True)], ids=["ec2-blocking", "gce-deferrable"]
)
def test_a_spot_run_preempted_twice_in_one_zone_moves_to_a_zone_with_capacity(
    emu, airflow_db, tmp_path: Path, provider: str, deferrable: bool
) -> None:
    first, other = ZONES[provider]
    result, interrupter = run_preempted_twice(emu, tmp_path, provider, (first, other), deferrable)
    rows = result["attempts"]
    assert [r["ended"] for r in rows] == ["interrupted_no_notice", "interrupted_no_notice", "finished"], rows
    assert [r["instance_id"] for r in rows[:2]] == [iid for iid, _ in interrupter.done]
    assert [(r["cloud"], r["spot"], r["zone"]) for r in rows] == [
        (SPOT_CLOUD[provider], True, first),
        (SPOT_CLOUD[provider], True, first),  # B was tried first, had no capacity: failed over to A
        (SPOT_CLOUD[provider], True, other),  # spot in B, not on-demand
    ]
    assert [r["no_capacity_in"] for r in rows] == [[], [other], []]
    assert [r["moved_from"] for r in rows] == [None, None, first]
    assert f"{first}: 2 preemption(s)" in rows[2]["move_reason"]
    # it resumed from the checkpoint the attempt in A uploaded, read from the bucket in B
    assert rows[2]["restored_step"] is not None and rows[2]["restored_step"] > 0
    assert rows[2]["restored_step"] >= rows[1]["restored_step"]
    assert f"resumed from step {rows[2]['restored_step']}" in emu.agent_log(rows[2]["instance_id"])
    assert result["zone"] == other and result["interruptions"] == 2
    ledger = json.loads(open_run_folder(result["run_uri"]).get_text(f"ledger/{result['run_id']}.json"))
    assert [r["moved_from"] for r in ledger["attempts"]] == [None, None, first]
    assert f"moved from {first} to {other}:" in format_ledger(ledger)


def test_with_one_zone_allowed_it_relaunches_there_as_before(emu, airflow_db, tmp_path: Path) -> None:
    first, _ = ZONES["aws"]
    result, _ = run_preempted_twice(emu, tmp_path, "aws", (first,), deferrable=False)
    rows = result["attempts"]
    assert [(r["ended"], r["spot"], r["zone"]) for r in rows] == [
        ("interrupted_no_notice", True, first),
        ("interrupted_no_notice", True, first),
        ("finished", True, first),
    ]
    assert all(r["no_capacity_in"] == [] and r["moved_from"] is None for r in rows)
    assert rows[2]["restored_step"] > 0


@pytest.mark.parametrize("denied", [False, True], ids=["scored", "refused"])
def test_the_first_spot_launch_goes_where_ec2_scores_highest_else_in_the_users_order(
    emu, airflow_db, denied: bool
) -> None:
    first, other = ZONES["aws"]
    emu.set_spot_placement_score(first, 2)
    emu.set_spot_placement_score(other, 9, instance_type=TYPE["aws"])
    emu.set_spot_placement_score("us-east-1c", 10, instance_type="m5.large")  # another type's: not ours
    if denied:
        emu.deny_spot_placement_scores()
    emu.reset_counts()
    extra = f"instance_type={TYPE['aws']!r}, zones={[first, other]!r}"
    dag = resume_dag(
        f"zone_scores_{'refused' if denied else 'scored'}", "aws", "python3 steps.py 2 1 0.1", extra=extra
    )
    run = dag.test()
    assert task_states(run) == {"train": "success"}
    rows = xcom(run, "train")["attempts"]
    assert [(r["spot"], r["zone"], r["ended"]) for r in rows] == [
        (True, first if denied else other, "finished")
    ]
    assert emu.request_counts().get("GetSpotPlacementScores") == 1

"""A gang in ``CheckpointResumeOperator``: the ledger's rows and totals, the gang's outcome when a node
is lost, ``checkpoint_ranks`` (parse time, and which node syncs where), and old ledgers still loading.

The arithmetic a user reads in the XCom and ``cloudtrain runs show``: a row per node-attempt, the cost
the sum of the rows, an interrupted gang ONE interruption (not three), the budgets per attempt.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_cloudtrain.contract.gang import checkpoint_base, uploads
from airflow_cloudtrain.contract.runs import RunSpec, RunStatus
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.records import Attempt, LaunchRecord, Outcome
from airflow_cloudtrain.core.waiting import GangWatch
from airflow_cloudtrain.lifecycle.resume.history import AttemptRow, RunHistory, format_ledger
from airflow_cloudtrain.lifecycle.resume.recovery import RecoverySettings, gang_rows, next_step
from airflow_cloudtrain.operators.resume_config import parse_checkpoint_ranks

IDS = ["i-head", "i-one", "i-two"]


def launch(ids: list[str] = IDS) -> LaunchRecord:
    nodes = [
        {"rank": r, "instance_id": iid, "zone": "us-east-1a", "private_ip": f"10.0.0.{r + 1}"}
        for r, iid in enumerate(ids)
    ]
    return LaunchRecord(
        run_id="ct-0123456789ab",
        run_uri="s3://b/r",
        cloud="ec2spot",
        region="us-east-1",
        instance_id=ids[0],
        instance_type="m5.large",
        zone="us-east-1a",
        spot=True,
        hourly_usd=0.03,
        launched_at=1000.0,
        nodes=nodes,
    )


def status(iid: str, restored: int | None, checkpoint: int | None = None, notice: bool = False) -> RunStatus:
    return RunStatus(
        state="interrupted" if notice else "running",
        instance_id=iid,
        job_started_at=1010.0,
        restored_step=restored,
        checkpoint={"step": checkpoint, "saved_at": 1050.0} if checkpoint is not None else None,
        interruption={"notice_at": 1055.0, "job_stopped_at": 1056.0} if notice else None,
    )


def interrupted_gang(
    number: int, ids: list[str], restored: int | None, lost: int, notice: bool
) -> list[AttemptRow]:
    rec = launch(ids)
    nodes = [{"rank": r, "instance_id": i, "exit_code": None, "state": "stopped"} for r, i in enumerate(ids)]
    nodes[lost]["state"] = "interrupted"
    outcome = Outcome("error", "interrupted", interrupted=True, interruptions=1, nodes=nodes, rank=lost)
    done = Attempt(
        rec, outcome, released_at=1060.0, duration_s=60.0, cost_usd=0.0015, cost_basis="per-second"
    )
    statuses = [status(ids[0], restored, checkpoint=8)] + [
        status(i, restored, notice=notice and r == lost) for r, i in enumerate(ids) if r
    ]
    return gang_rows(done, statuses, number, 1)


def test_a_gang_attempt_is_a_row_per_node_and_one_interruption() -> None:
    rows = interrupted_gang(1, IDS, None, lost=1, notice=True)
    assert [(r.attempt, r.rank, r.instance_id) for r in rows] == [(1, k, iid) for k, iid in enumerate(IDS)]
    assert {r.ended for r in rows} == {"interrupted"}  # the lost node had a notice
    assert [r.node_state for r in rows] == ["stopped", "interrupted", "stopped"]
    assert sum(r.cost_usd for r in rows) == pytest.approx(0.0015)  # the attempt's cost, shared
    assert [r.private_ip for r in rows] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    head, *others = rows
    assert head.checkpoint_step == 8 and head.progress_s > 0 and head.work_lost_s is not None
    assert all(r.work_lost_s is None and r.progress_s == 0.0 for r in others)  # the gang's, once

    second = interrupted_gang(2, ["i-a", "i-b", "i-c"], 8, lost=2, notice=False)
    assert {r.ended for r in second} == {"interrupted_no_notice"}
    assert {r.restored_step for r in second} == {8}
    history = RunHistory("ct-0123456789ab", "s3://b/r", "spot_first", 900.0, attempts=rows + second)
    totals = history.totals()
    assert totals["attempts"] == 2 and totals["rows"] == 6 and totals["launches"] == 2
    assert totals["interruptions"] == 2 and totals["error_restarts"] == 0 and history.restarts == 2
    assert totals["cost_usd"] == pytest.approx(sum(r.cost_usd for r in history.attempts))
    assert totals["work_lost_s"] == pytest.approx(sum(r.work_lost_s or 0.0 for r in history.attempts))
    assert history.next_attempt == 3
    # the budgets count the gang's attempts: max_restarts=2 lets a third gang launch, 1 does not
    assert next_step(history, RecoverySettings("ec2spot", max_restarts=2), 1, 2000.0).kind == "launch"
    assert next_step(history, RecoverySettings("ec2spot", max_restarts=1), 1, 2000.0).kind == "fail"
    # on_demand_after counts gang attempts too: after 2, the whole next gang is on-demand
    after_two = next_step(history, RecoverySettings("ec2spot", on_demand_after=2), 1, 2000.0)
    assert (after_two.kind, after_two.cloud) == ("launch", "ec2")
    assert next_step(history, RecoverySettings("ec2spot", on_demand_after=3), 1, 2000.0).cloud == "ec2spot"

    table = history.table()
    assert "2 attempt(s) (6 node rows), 2 interruption(s) (a gang's attempt counts once" in table
    lines = table.splitlines()
    assert any(line.startswith(" 1 0/3") and "i-head" in line for line in lines), table
    assert any(line.startswith(" 2 2/3") and "i-c interrupted" in line for line in lines), table


def test_an_old_ledger_without_ranks_still_loads_and_counts_per_row() -> None:
    old = {
        "run_id": "ct-0123456789ab",
        "run_uri": "s3://b/r",
        "policy": "spot_first",
        "started_at": 900.0,
        "attempts": [
            {"attempt": 1, "try_number": 1, "ended": "interrupted", "instance_id": "i-1", "cost_usd": 0.1},
            {"attempt": 2, "try_number": 1, "ended": "finished", "instance_id": "i-2", "cost_usd": 0.2},
        ],
    }
    history = RunHistory.from_dict(json.loads(json.dumps(old)))
    assert [r.rank for r in history.attempts] == [None, None]
    totals = history.totals()
    assert totals["attempts"] == totals["rows"] == 2 and totals["interruptions"] == 1
    assert totals["cost_usd"] == pytest.approx(0.3)
    assert "node rows" not in format_ledger(history.to_dict())


def inst(iid: str, state: str = "running", preempted: bool = False) -> Instance:
    return Instance(iid, state, "m5.large", "us-east-1a", True, preempted=preempted)


def test_a_node_lost_makes_the_gang_interrupted_even_when_a_peer_failed_first() -> None:
    # rank 2 got a notice and is still stopping; the head's job already failed (its peer went away)
    watch = GangWatch(IDS, None)
    head_failed = RunStatus("failed", IDS[0], exit_code=1, message="connection reset")
    noticed = RunStatus("running", IDS[2], interruption={"notice_at": 1.0})
    event = watch.decide([head_failed, None, noticed], [inst(i) for i in IDS])
    assert event is not None and event.state == "interrupted" and event.interrupted
    assert event.rank == 2 and "rank 2" in event.message

    # without notice: rank 1's instance was taken back (still in the ended grace), the head failed
    watch = GangWatch(IDS, None)
    event = watch.decide(
        [head_failed, None, None], [inst(IDS[0]), inst(IDS[1], "terminated", preempted=True), inst(IDS[2])]
    )
    assert event is not None and event.interrupted and event.rank == 1

    # no node lost: the job's own failure, as before
    watch = GangWatch(IDS, None)
    event = watch.decide([None, head_failed, None], [inst(i) for i in IDS])
    assert event is not None and event.state == "failed" and not event.interrupted and event.rank == 1


@pytest.mark.parametrize("value", ["head", "all"])
def test_checkpoint_ranks_accepts_head_and_all(value: str) -> None:
    assert parse_checkpoint_ranks(value) == value


@pytest.mark.parametrize("value", [None, "", "every", "HEAD", " all", 1, True, ["head"]])
def test_checkpoint_ranks_refuses_anything_else_naming_the_forms(value: Any) -> None:
    with pytest.raises(ValueError, match="checkpoint_ranks=") as err:
        parse_checkpoint_ranks(value)
    assert repr(value) in str(err.value) and "'head'" in str(err.value) and "'all'" in str(err.value)


def test_who_syncs_checkpoints_where() -> None:
    # "head": rank 0 uploads to checkpoints/, every rank restores from there; a single run uploads
    assert [uploads(r, 3, "head") for r in (0, 1, 2, None)] == [True, False, False, False]
    assert uploads(None, 1, "head") and uploads(0, 1, "all")
    assert {checkpoint_base(r, "head") for r in range(3)} == {None}
    # "all": every rank uploads, rank r >= 1 under ranks/<r>/, the head where a single run's go
    assert all(uploads(r, 3, "all") for r in range(3))
    assert [checkpoint_base(r, "all") for r in range(3)] == [None, "ranks/1", "ranks/2"]
    # an old spec (no checkpoint_ranks) reads as "head"
    spec = RunSpec.from_json(
        json.dumps({"run_id": "r", "run_uri": "s3://b/r", "command": "x", "cloud": "ec2"})
    )
    assert spec.checkpoint_ranks == "head"

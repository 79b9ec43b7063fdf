"""The checkpoint-resume loop's decisions and ledger, on hand-made histories (no cloud)."""

from __future__ import annotations

from airflow_cloudtrain.lifecycle.resume.history import AttemptRow, RunHistory, format_ledger
from airflow_cloudtrain.lifecycle.resume.recovery import (
    RecoverySettings,
    ending_of,
    next_step,
    policy_state,
)

T0 = 1_000_000.0


def row(n: int, ended: str, spot: bool = True, try_number: int = 1, **kw: object) -> AttemptRow:
    base = {
        "instance_id": f"i-{n}",
        "launched_at": T0 + 100 * n,
        "job_started_at": T0 + 100 * n + 20,
        "ended_at": T0 + 100 * n + 80,
        "cost_usd": 0.01,
    }
    return AttemptRow(attempt=n, try_number=try_number, ended=ended, spot=spot, **{**base, **kw})  # type: ignore[arg-type]


def history(*rows: AttemptRow, waits: list | None = None) -> RunHistory:
    return RunHistory("ct-0123456789ab", "s3://b/r", "spot_first", T0, attempts=list(rows), waits=waits or [])


def test_spot_first_relaunches_on_spot_until_on_demand_after() -> None:
    settings = RecoverySettings(cloud="gcspot", on_demand_after=2)
    assert next_step(history(), settings, 1, T0).cloud == "gcspot"
    assert next_step(history(row(1, "interrupted")), settings, 1, T0).cloud == "gcspot"
    two = history(row(1, "interrupted"), row(2, "interrupted_no_notice"))
    assert next_step(two, settings, 1, T0).cloud == "gcloud"


def test_budgets_are_separate_and_per_try() -> None:
    settings = RecoverySettings(cloud="ec2spot", max_restarts=1, max_restarts_on_errors=1)
    one_each = history(row(1, "interrupted"), row(2, "job_error"))
    assert next_step(one_each, settings, 1, T0).kind == "launch"
    spent = history(row(1, "interrupted"), row(2, "capacity_error", instance_id=None))
    step = next_step(spent, settings, 1, T0)
    assert step.kind == "fail" and "max_restarts=1" in step.reason
    errors = history(row(1, "job_error"), row(2, "idle"))
    assert "max_restarts_on_errors=1" in next_step(errors, settings, 1, T0).reason
    silent = history(row(1, "lost"), row(2, "lost"))  # a broken bootstrap is not the cloud's doing
    assert "max_restarts_on_errors=1" in next_step(silent, settings, 1, T0).reason
    assert next_step(spent, settings, 2, T0).kind == "wait"  # a retry gets fresh budgets (then waits)


def test_capacity_errors_wait_also_after_on_demand_after() -> None:
    settings = RecoverySettings(cloud="ec2spot", on_demand_after=1, relaunch_wait_s=5)
    gap = history(row(1, "interrupted"), row(2, "capacity_error", instance_id=None, spot=False))
    assert next_step(gap, settings, 1, T0).kind == "wait"


def test_finished_timed_out_and_capacity() -> None:
    settings = RecoverySettings(cloud="ec2spot", relaunch_wait_s=42)
    assert next_step(history(row(1, "finished")), settings, 1, T0).kind == "done"
    assert next_step(history(row(1, "timed_out")), settings, 1, T0).kind == "fail"
    assert next_step(history(row(1, "timed_out")), settings, 2, T0).kind == "launch"  # a new try
    gap = history(row(1, "capacity_error", instance_id=None))
    assert next_step(gap, settings, 1, T0).kind == "wait"
    assert next_step(gap, settings, 1, T0).seconds == 42
    waited = history(row(1, "capacity_error", instance_id=None), waits=[{"from": T0 + 200, "to": T0 + 242}])
    assert next_step(waited, settings, 1, T0 + 242).kind == "launch"


def test_deadline_policy_state_comes_from_the_history() -> None:
    settings = RecoverySettings(
        cloud="ec2spot", policy="deadline", deadline_at=T0 + 10 * 3600, expected_duration_s=4 * 3600
    )
    h = history(row(1, "interrupted", checkpoint_saved_at=T0 + 170, progress_s=50.0))
    state = policy_state(h, settings, T0 + 300)
    assert state.elapsed == 300 / 3600 and state.deadline == 10
    assert state.work_done == 50 / 3600 and state.work_remaining == (4 * 3600 - 50) / 3600
    assert state.changeover == 20 / 3600  # this run's measured startup (no work lost recorded)
    assert state.interruptions == 1 and state.launches == 1 and state.spot_spells == 1
    assert next_step(h, settings, 1, T0 + 300).cloud == "ec2spot"  # 6 h of slack: spot
    late = policy_state(h, settings, T0 + 6 * 3600 + 30)
    assert late.slack * 3600 < 60 + 20  # less than a tick plus a changeover
    assert next_step(h, settings, 1, T0 + 6 * 3600 + 30).cloud == "ec2"  # no slack left: on-demand


def test_endings() -> None:
    assert ending_of("succeeded", False, False) == "finished"
    assert ending_of("interrupted", True, True) == "interrupted"
    assert ending_of("interrupted", True, False) == "interrupted_no_notice"
    assert ending_of("failed", False, False) == "job_error"
    assert ending_of("idle", False, False) == "idle"
    assert ending_of("lost", False, False) == "lost"


def test_ledger_totals_add_up_and_print() -> None:
    h = history(
        row(1, "interrupted", work_lost_s=1.5),
        row(2, "capacity_error", instance_id=None, cost_usd=0.0),
        row(3, "finished", spot=False, cost_usd=0.05, work_lost_s=0.0),
    )
    totals = h.totals()
    assert totals["cost_usd"] == 0.06 and totals["spot_cost_usd"] == 0.01
    assert totals["on_demand_cost_usd"] == 0.05 and totals["interruptions"] == 1  # spot ones only
    assert totals["launches"] == 2 and h.restarts == 1 and totals["work_lost_s"] == 1.5
    text = format_ledger(h.to_dict())
    assert "capacity_error" in text and "on-demand" in text and "$0.060000" in text
    assert RunHistory.from_dict(h.to_dict()).attempts == h.attempts


def test_a_relaunch_that_restored_nothing_warns_and_counts_the_progress_lost() -> None:
    """The agent's reason lands in the row; the loop logs it once and counts the earlier attempts'
    progress as work lost (the job ran from the beginning again)."""
    import logging

    from airflow_cloudtrain.contract.runs import RunStatus
    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop

    status = RunStatus(state="succeeded", instance_id="i-2", restore={"note": "checkpoint-3/ held no state"})
    assert (status.restore or {}).get("note") == "checkpoint-3/ held no state"
    first = row(1, "interrupted", progress_s=40.0, work_lost_s=2.0)
    second = row(2, "finished", restore_note="checkpoint-3/ held no state")
    loop = RecoveryLoop.__new__(RecoveryLoop)
    loop.history = history(first, second)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    loop.log = logging.getLogger("test.recovery")
    loop.log.addHandler(handler)
    loop._progress_lost(second)
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "restored no checkpoint" in records[0].getMessage() and "held no state" in records[0].getMessage()
    assert (first.work_lost_s, first.progress_s) == (42.0, 0.0)


def test_a_relaunch_that_restored_an_older_checkpoint_moves_the_work_lost() -> None:
    """Attempt 1 uploaded a checkpoint saved at T0+170, but attempt 2 restored one saved at T0+150
    (the newer one failed verification): attempt 1 lost 20 s more than its own upload suggested."""
    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop

    first = row(1, "interrupted", checkpoint_saved_at=T0 + 170, work_lost_s=5.0, progress_s=50.0)
    second = row(2, "finished", restored_saved_at=T0 + 150)
    loop = RecoveryLoop.__new__(RecoveryLoop)
    loop.history = history(first, second)
    loop._restored_older(second)
    assert (first.work_lost_s, first.progress_s) == (25.0, 30.0)
    same = row(3, "finished", restored_saved_at=T0 + 170)
    loop.history = history(row(1, "interrupted", checkpoint_saved_at=T0 + 170, work_lost_s=5.0), same)
    loop._restored_older(same)
    assert loop.history.attempts[0].work_lost_s == 5.0  # the checkpoint it uploaded: nothing moves

"""The bucket's cost index: records, the totals ``cloudtrain costs`` prints, and its ``--since``."""

from __future__ import annotations

import argparse

import pytest

from airflow_cloudtrain.cli_costs import parse_since
from airflow_cloudtrain.lifecycle.cost_index import CostRecord, grand_total, select, totals

DAY = 1_764_201_600.0  # 2025-11-27 00:00 UTC


def record(
    dag: str, run: str, cost: float, at: float, cloud: str = "ec2spot", interrupted: bool = False
) -> CostRecord:
    return CostRecord(
        dag,
        "train",
        "manual__x",
        -1,
        run,
        f"s3://b/{run}",
        cloud,
        f"i-{run}-{at}",
        "m5.large",
        1,
        True,
        "interrupted" if interrupted else "succeeded",
        interrupted,
        at - 100,
        at,
        cost,
        "basis",
    )


def test_totals_group_and_sort() -> None:
    rows = [
        record("a", "ct-1", 0.25, DAY + 10, interrupted=True),
        record("a", "ct-1", 0.5, DAY + 20),
        record("b", "ct-2", 1.0, DAY + 86_400 + 5, cloud="gcspot"),
    ]
    by_dag = totals(rows, "dag")
    assert [(r["dag"], r["runs"], r["attempts"], r["interruptions"], r["cost_usd"]) for r in by_dag] == [
        ("b", 1, 1, 0, 1.0),
        ("a", 1, 2, 1, 0.75),
    ]
    assert [r["day"] for r in totals(rows, "day")] == ["2025-11-27", "2025-11-28"]
    assert {r["cloud"] for r in totals(rows, "cloud")} == {"ec2spot", "gcspot"}
    assert rows[0].key() == f"_cloudtrain/costs/2025-11-27/ct-1-i-ct-1-{DAY + 10}.json"
    assert CostRecord.from_json(__import__("json").dumps(rows[0].__dict__)) == rows[0]


def test_since_takes_a_day_or_an_age() -> None:
    assert parse_since("2025-11-27") == DAY
    assert parse_since("7d", now=DAY) == DAY - 7 * 86_400
    assert parse_since("36h", now=DAY) == DAY - 36 * 3600
    with pytest.raises(argparse.ArgumentTypeError, match="give a day"):
        parse_since("last week")


def test_weeks_are_iso_weeks_in_time_order() -> None:
    rows = [
        record("a", "ct-1", 1.0, DAY + 5 * 86_400),  # Tuesday 2025-12-02: week 49
        record("a", "ct-2", 0.5, DAY),  # Thursday 2025-11-27: week 48
        record("b", "ct-3", 0.25, DAY + 3 * 86_400 + 10),  # Sunday 2025-11-30: still week 48
    ]
    weeks = totals(rows, "week")
    assert [(r["week"], r["runs"], r["cost_usd"]) for r in weeks] == [
        ("2025-W48", 2, 0.75),
        ("2025-W49", 1, 1.0),
    ]


def test_select_keeps_whole_runs_by_dag_state_and_cloud() -> None:
    spot_then_on_demand = [
        record("a", "ct-1", 0.25, DAY + 10, interrupted=True),
        record("a", "ct-1", 0.5, DAY + 20, cloud="ec2"),  # the on-demand fallback: the run's last
    ]
    failed = [
        CostRecord(**{**record("b", "ct-2", 1.0, DAY + 30, cloud="gcspot").__dict__, "state": "failed"})
    ]
    rows = spot_then_on_demand + failed
    assert select(rows) == rows
    assert select(rows, dag="a") == spot_then_on_demand
    assert select(rows, state="failed") == failed
    assert select(rows, state="interrupted") == []  # ct-1 ended succeeded: its last attempt decides
    # a run is found under every cloud it ran on, with all its attempts (its totals stay whole)
    assert select(rows, cloud="ec2spot") == select(rows, cloud="ec2") == spot_then_on_demand
    assert grand_total(select(rows, cloud="ec2spot"), "dag")["cost_usd"] == 0.75
    assert select(rows, dag="a", cloud="gcspot") == []


def test_a_vertex_retry_keeps_the_failed_job_s_row() -> None:
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.lifecycle.cost_index import vertex_record

    key = RunKey("d", "train", "manual__1", -1, "gs://b/j")
    failed, retried = (
        vertex_record({"job_id": "train_1", "job_name": f"projects/p/locations/r/customJobs/{n}",
                       "state": state, "duration_s": 60, "cost_usd": 0.1}, key, 1_764_201_600.0 + n)
        for n, state in ((11, "JOB_STATE_FAILED"), (12, "JOB_STATE_SUCCEEDED"))
    )  # fmt: skip
    assert failed.run_id == retried.run_id == "train_1"  # one run on the page, two rows
    assert failed.key() != retried.key() and retried.instance_id == "12"

"""The bucket's cost index: records, the totals ``cloudtrain costs`` prints, and its ``--since``."""

from __future__ import annotations

import argparse

import pytest

from airflow_cloudtrain.cli_costs import parse_since
from airflow_cloudtrain.lifecycle.cost_index import CostRecord, totals

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

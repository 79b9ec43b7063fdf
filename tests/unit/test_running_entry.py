"""A fleet's or a Vertex AI job's record in the bucket's running index (``lifecycle.running_entry``):
rewritten only when what the page shows changes or its refresh is due, its cost so far carried from
write to write, and stale once its wait stopped refreshing it. Over the wire (a real fleet and a real
Vertex job, on and off the page): tests/cloud/test_spot_fleet.py, tests/cloud/test_mlengine_train.py;
``cloudtrain gc`` deleting a silent one: tests/cloud/test_gc.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_cloudtrain.contract.runs import RunKey
from airflow_cloudtrain.lifecycle.cost_index import RUNNING_PREFIX, WATCH_SILENT, CostRecord, stale_reason
from airflow_cloudtrain.lifecycle.running_entry import (
    REFRESH_S,
    SILENT_AFTER_S,
    RunningEntry,
    cost_so_far,
)

T0 = 1_764_201_600.0
LOG = logging.getLogger(__name__)


class Bucket:
    """The part of a ``RunFolder`` the entry uses: ``at`` a bucket, then puts and deletes there."""

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}
        self.puts = 0

    def at(self, uri: str) -> Bucket:
        assert uri == "s3://b"
        return self

    def put_text(self, key: str, text: str) -> None:
        self.objects[key] = text
        self.puts += 1

    def delete_key(self, key: str) -> None:
        self.objects.pop(key, None)


def entry() -> RunningEntry:
    return RunningEntry.of(
        "s3://b",
        RunKey("sweep_dag", "sweep", "manual__1"),
        operator="SpotFleetOperator",
        run_id="ct-abc",
        run_uri="s3://b/runs/x",
        cloud="ec2spot",
        name="ct-fleet-abc",
        instance_type="m5.large",
        nodes=0,
        spot=True,
        hourly_usd=0.0,
        started_at=T0,
    )


def stored(bucket: Bucket) -> CostRecord:
    (text,) = bucket.objects.values()
    return CostRecord.from_json(text)


def test_the_record_is_rewritten_only_when_the_page_would_show_something_new() -> None:
    bucket, e = Bucket(), entry()
    e.write(bucket, LOG)  # type: ignore[arg-type]
    assert list(bucket.objects) == [f"{RUNNING_PREFIX}ct-abc-ct-fleet-abc.json"]
    assert stored(bucket).operator == "SpotFleetOperator" and stored(bucket).state == "running"
    # polls with the same workers: no write, however much was spent
    assert not e.update(bucket, LOG, T0 + 10, nodes=0, hourly_usd=0.0, spent_usd=0.0)  # type: ignore[arg-type]
    # a second worker: written, with what was spent by then
    assert e.update(bucket, LOG, T0 + 20, nodes=2, hourly_usd=0.2, spent_usd=0.01)  # type: ignore[arg-type]
    assert not e.update(bucket, LOG, T0 + 30, nodes=2, hourly_usd=0.2, spent_usd=0.02)  # type: ignore[arg-type]
    assert bucket.puts == 2
    r = stored(bucket)
    assert (r.num_nodes, r.hourly_usd, r.cost_usd, r.updated_at) == (2, 0.2, 0.01, T0 + 20)
    # the page's cost so far: spent by the write, plus the price per hour since
    assert cost_so_far(r, T0 + 20 + 360) == pytest.approx(0.01 + 0.2 * 0.1)
    # unchanged, but its refresh is due: rewritten, carrying the cost forward when none is given
    assert e.update(bucket, LOG, T0 + 20 + REFRESH_S)  # type: ignore[arg-type]
    assert stored(bucket).cost_usd == pytest.approx(0.01 + 0.2 * REFRESH_S / 3600, abs=1e-6)
    assert stored(bucket).updated_at == T0 + 20 + REFRESH_S
    e.clear(bucket, LOG)  # type: ignore[arg-type]
    assert bucket.objects == {}


def test_it_crosses_into_the_triggerer_as_plain_json_and_a_missing_one_is_none() -> None:
    e = entry()
    back = RunningEntry.from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e
    assert RunningEntry.from_dict(None) is None and RunningEntry.from_dict({"bucket": ""}) is None


def test_a_watched_record_is_stale_once_its_wait_stopped_refreshing_it() -> None:
    r = entry().record
    nobody: dict[str, Any] = {}  # no agent beacons: a fleet has none of its own
    assert stale_reason(r, nobody, T0 + SILENT_AFTER_S - 1) is None  # an hour-long fleet stays
    assert stale_reason(r, nobody, T0 + SILENT_AFTER_S + 1) == WATCH_SILENT

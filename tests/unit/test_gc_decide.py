"""The decision table of ``cloudtrain gc`` (``lifecycle.gc``): what a run folder says about the run's
lease, and what that and the resource's age make of it: finished / lapsed / orphaned / live / unknown
(no lease, no run folder) × younger or older than ``--older-than``."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned
from airflow_cloudtrain.contract.runs import SPEC_KEY, RunStatus, status_key
from airflow_cloudtrain.lifecycle.gc import decide, fmt_duration, run_view
from airflow_cloudtrain.storage import RunFolder

NOW = 1_800_000_000.0
HOUR = 3600.0


class Folder:
    """A run folder's keys and texts (the two calls ``run_view`` makes)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def list(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.files if k.startswith(prefix))

    def get_text(self, key: str) -> str | None:
        return self.files.get(key)


def view(files: dict[str, str]) -> tuple[str, str]:
    got = run_view(cast(RunFolder, Folder(files)), NOW)
    return got.lease, got.why


def status(state: str, iid: str = "i-1") -> dict[str, str]:
    return {status_key(iid): RunStatus(state, iid).to_json()}


def lease(renewed_ago: float, timeout: float | None = 1800.0) -> dict[str, str]:
    return {LEASE_KEY: Lease(NOW - renewed_ago, timeout, "triggerer").to_json()}


SPEC = {SPEC_KEY: "{}"}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, "finished"),  # the run folder is gone
        ({**SPEC, **status("succeeded")}, "finished"),
        ({**SPEC, **status("failed"), **status("interrupted", "i-2")}, "finished"),
        ({**SPEC, **status("succeeded"), **status("running", "i-2")}, "unknown"),  # a retry still runs
        ({**SPEC, **lease(60)}, "live"),
        ({**SPEC, **lease(60), **status("succeeded")}, "live"),  # a fresh lease wins: never touched
        ({**SPEC, **lease(1801)}, "lapsed"),
        ({**SPEC, **lease(1801), **status("succeeded")}, "finished"),
        ({**SPEC, **lease(60), ORPHANED_KEY: Orphaned(NOW - 10, "agent", NOW).to_json()}, "lapsed"),
        # orphaned once, then a retry took the run over and renews its lease: watched again
        ({**SPEC, **lease(60), ORPHANED_KEY: Orphaned(NOW - 900, "agent", NOW - 600).to_json()}, "live"),
        ({**SPEC, ORPHANED_KEY: "{torn"}, "lapsed"),
        ({**SPEC, **lease(3 * HOUR, timeout=None)}, "unknown"),  # orphan_timeout=None: no lease at all
        ({**SPEC, LEASE_KEY: "{torn"}, "unknown"),
        (SPEC, "unknown"),  # a release without leases
        # a CheckpointResumeOperator loop: its ledger, not one attempt's status, says when it ended
        ({**SPEC, **status("interrupted"), "ledger/ct-1.json": json.dumps({"state": "running"})}, "unknown"),
        ({**SPEC, **status("succeeded"), "ledger/ct-1.json": json.dumps({"state": "succeeded"})}, "finished"),
    ],
)
def test_what_the_run_folder_says(files: dict[str, str], expected: str) -> None:
    assert view(files)[0] == expected


def test_a_lapsed_lease_says_since_when() -> None:
    got = run_view(cast(RunFolder, Folder({**SPEC, **lease(2 * HOUR)})), NOW)
    assert got.lapsed_at == NOW - 2 * HOUR + 1800 and "lapsed 1h30m ago" in got.why


@pytest.mark.parametrize(
    ("lease_state", "age", "action", "words"),
    [
        ("finished", 2 * HOUR, "delete", "run finished"),
        ("finished", 10.0, "keep", "younger than 1h"),
        ("lapsed", 2 * HOUR, "delete", "lease lapsed"),
        ("lapsed", 10.0, "keep", "younger than 1h"),
        ("live", 30 * 24 * HOUR, "keep", "lease fresh"),
        ("live", 10.0, "keep", "lease fresh"),
        ("unknown", 2 * HOUR, "delete", "no lease, older than 1h"),
        ("unknown", 10.0, "keep", "younger than 1h"),
        ("unknown", None, "keep", "no age"),
        ("finished", None, "delete", "run finished"),  # the run folder says so: age unknown is no reason
    ],
)
def test_the_decision_table(lease_state: str, age: float | None, action: str, words: str) -> None:
    got_action, why = decide(lease_state, age, HOUR)
    assert got_action == action and words in why


def test_without_a_run_folder_the_listing_says_the_age_decided() -> None:
    assert decide("unknown", 2 * HOUR, HOUR, has_run=False) == (
        "delete",
        "no run folder known, by age: older than 1h",
    )


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (90, "1m30s"), (3600, "1h"), (90061, "1d1h1m1s")])
def test_durations_read_as_the_operators_write_them(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


def test_to_dict_is_json_safe() -> None:
    from airflow_cloudtrain.lifecycle.gc import Leftover, RunView, Source

    x = Leftover("instance", "i-1", "us-east-1", "d" * 20, None, 5.0, "running", 0.1, "live", "keep", "w",
                 source=Source("aws", object(), object()), view=RunView("live", "w"))  # fmt: skip
    data: dict[str, Any] = x.to_dict()
    assert json.loads(json.dumps(data))["id"] == "i-1" and "source" not in data


def test_names_made_from_a_run_key_give_it_back() -> None:
    from airflow_cloudtrain.core.inventory import digest_in_name

    d = "0123456789abcdef0123"
    for name in (f"ct-{d}", f"ct-{d}-items", f"projects/p/topics/ct-{d}-dlq", f"https://sqs/1/ct-{d}-items"):
        assert digest_in_name(name) == d
    for name in ("ct-short", f"my-{d}", f"ct-{d.upper()}", "default-allow-ssh"):
        assert digest_in_name(name) is None


@pytest.mark.parametrize(
    ("value", "stamp"),
    [
        ("2026-11-27T05:00:00+00:00", 1795755600.0),
        ("2026-11-27T05:00:00Z", 1795755600.0),
        ("1795755600000", 1795755600.0),  # milliseconds, as SQS and our Pub/Sub label give them
        (1795755600, 1795755600.0),
        (None, None),
        ("", None),
        ("soon", None),
    ],
)
def test_creation_times_in_every_form_the_apis_use(value: object, stamp: float | None) -> None:
    from airflow_cloudtrain.core.inventory import timestamp

    assert timestamp(value) == stamp


def test_with_a_zone_only_that_zones_vms_and_groups_are_listed() -> None:
    from airflow_cloudtrain.lifecycle.gc import _other_zone

    assert _other_zone("us-central1-b", "us-central1-a")
    assert not _other_zone("us-central1-a", "us-central1-a")
    assert not _other_zone("us-central1", "us-central1-a")  # a regional policy
    assert not _other_zone("my-project", "us-central1-a")  # a firewall rule (its project)
    assert not _other_zone("us-central1-b", None)

"""``idle_timeout`` on every operator that runs our agent (issue 25): parsed like
``CheckpointResumeOperator``'s (``parse_duration``), refused at parse time naming the field, the value
and the forms, and carried into the run spec (``JobOptions.idle_timeout_s``); off by default.

The bad-inputs table (``test_bad_inputs_table``) runs its ``idle_timeout`` row against every
operator whose signature has the argument; here: the same message on each, the value reaching the
spec the agent reads, and the gang's idle record (``contract.gang.IdleRecord``) rule.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_cloudtrain.contract import gang
from airflow_cloudtrain.operators import (
    CheckpointResumeOperator,
    CloudTrainOperator,
    PreemptibleGroupOperator,
    SpotFleetOperator,
)

BASES: dict[str, tuple[type, dict[str, Any]]] = {
    "ct_ec2": (CloudTrainOperator, {"cloud": "ec2", "command": "python t.py", "bucket": "s3://bkt/p"}),
    "ct_gce": (CloudTrainOperator, {"cloud": "gcloud", "command": "python t.py", "bucket": "gs://bkt/p"}),
    "resume": (
        CheckpointResumeOperator,
        {"cloud": "ec2spot", "command": "python t.py", "bucket": "s3://bkt/p"},
    ),
    "fleet": (SpotFleetOperator, {"command": "python i.py", "bucket": "s3://bkt/p", "work_items": ["a"]}),
    "group": (
        PreemptibleGroupOperator,
        {"command": "python i.py", "bucket": "gs://bkt/p", "work_items": ["a"]},
    ),
}


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse time must not touch the network."""
    import socket

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("parse time touched the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def build(base: str, **changes: Any) -> Any:
    cls, args = BASES[base]
    return cls(task_id=f"t_{base}", **{**args, "live_prices": False, **changes})


def idle_seconds(op: Any) -> float | None:
    """Where each operator keeps the parsed value (the resume loop keeps its own, unchanged)."""
    return op.resume.idle_timeout_s if isinstance(op, CheckpointResumeOperator) else op.idle_timeout_s


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        (5, 5.0),
        ("5s", 5.0),
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        (timedelta(minutes=2), 120.0),
    ],
)
def test_idle_timeout_takes_every_duration_form(base: str, value: Any, seconds: float | None) -> None:
    assert idle_seconds(build(base, idle_timeout=value)) == seconds


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("value", [0, -5, "0s", "soon", "1h1h", float("nan"), True, ["5m"], "400d"])
def test_a_bad_idle_timeout_fails_at_parse_time_naming_field_value_and_forms(base: str, value: Any) -> None:
    with pytest.raises(ValueError) as caught:
        build(base, idle_timeout=value)
    message = str(caught.value)
    assert message.startswith(f"idle_timeout={value!r} is not a valid duration: use "), message
    assert "'1h30m'" in message or "1h30m" in message, message  # the accepted forms are shown
    assert "more than zero and at most 366 days" in message, message


@pytest.mark.parametrize("base", ["ct_ec2", "ct_gce", "fleet", "group"])
def test_idle_timeout_is_kept_for_the_job_options(base: str) -> None:
    """The parsed value the operator hands to the run's job options (``ctx.job`` / the fleet's
    ``JobOptions``; end to end in ``tests/cloud/test_idle_everywhere.py``); off unless asked for."""
    assert build(base, idle_timeout="90s").idle_timeout_s == 90.0
    assert build(base).idle_timeout_s is None


def test_checkpoint_resume_keeps_its_own_idle_timeout() -> None:
    op = build("resume", idle_timeout="2h")
    assert op.resume.idle_timeout_s == 7200.0
    assert op.idle_timeout_s is None  # CloudTrainOperator's is not set: the loop's job options win


# --- the gang's rule, record by record ------------------------------------------------------------


def record(idle_since: float | None, at: float, ended: bool = False) -> gang.IdleRecord:
    return gang.IdleRecord(1, "i-1", idle_since, at, ended)


def test_an_idle_record_round_trips_and_its_key_is_under_the_gangs_folder() -> None:
    rec = record(100.0, 130.0, ended=True)
    assert gang.IdleRecord.from_json(rec.to_json()) == rec
    assert gang.IdleRecord.from_json(record(None, 5.0).to_json()).idle_since is None
    assert gang.idle_key(2) == "nodes/idle/2.json" and gang.idle_key(2).startswith(gang.NODES_PREFIX)
    assert gang.idle_key(2) != gang.node_key(2)


@pytest.mark.parametrize(
    ("rec", "now", "idle"),
    [
        (record(100.0, 130.0), 131.0, True),  # idle for 31 s >= 30, written 1 s ago
        (record(110.0, 130.0), 131.0, False),  # idle for 21 s only
        (record(None, 130.0), 131.0, False),  # busy again
        (record(100.0, 130.0), 130.0 + 10.1, False),  # not rewritten for longer than stale_s: busy
        (record(100.0, 130.0, ended=True), 1000.0, True),  # its job ended: idle however old
    ],
    ids=["idle", "not-long-enough", "busy-again", "stale", "ended"],
)
def test_a_rank_counts_as_idle_only_through_a_fresh_record(
    rec: gang.IdleRecord, now: float, idle: bool
) -> None:
    assert rec.idle_for(now, timeout_s=30.0, stale_s=10.0) is idle


def test_stale_is_a_couple_of_samples_and_never_under_ten_seconds() -> None:
    assert gang.idle_stale_s(0.5) == 10.0
    assert gang.idle_stale_s(10.0) == 30.0

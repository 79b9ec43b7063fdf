"""Leaving a running on-demand attempt for spot (issue 29): the decisions, on hand-made histories.

While an on-demand attempt of ``policy="deadline"`` runs, its wait stops at ``next_probe_at`` and the
loop asks ``probe_step`` what the policy would do if spot were there; a spot launch beside the
attempt is the probe (``lifecycle.resume.switch``). No cloud here: the emulator test is
tests/cloud/test_leave_on_demand.py.
"""

from __future__ import annotations

import pytest

from airflow_cloudtrain.core.records import LaunchRecord
from airflow_cloudtrain.core.waiting import PROBE_DUE, RunWatch
from airflow_cloudtrain.lifecycle.resume.history import AttemptRow, RunHistory
from airflow_cloudtrain.lifecycle.resume.recovery import (
    RecoverySettings,
    ending_of,
    last_unavailable,
    next_probe_at,
    probe_step,
)
from airflow_cloudtrain.operators.resume_config import DEFAULT_PROBE_INTERVAL_S, parse_resume_args

T0 = 1_000_000.0
HOUR = 3600.0
SETTINGS = RecoverySettings(
    cloud="ec2spot",
    policy="deadline",
    deadline_at=T0 + 30 * HOUR,
    expected_duration_s=20 * HOUR,
    relaunch_wait_s=60.0,
    probe_interval_s=600.0,
)


def on_demand(at: float, **kw: object) -> LaunchRecord:
    return LaunchRecord("ct-0123456789ab", "s3://b/r", "ec2", "us-east-1", "i-od", launched_at=at, **kw)  # type: ignore[arg-type]


def history_with_outage(capacity_error_at: float) -> RunHistory:
    """A spot attempt preempted after an hour (measured changeover 100 s), then a spot relaunch
    that found no capacity at ``capacity_error_at``: the run went on-demand right after."""
    spot = AttemptRow(
        attempt=1,
        try_number=1,
        ended="interrupted",
        spot=True,
        instance_id="i-spot",
        launched_at=T0,
        job_started_at=T0 + 100,
        ended_at=T0 + HOUR,
        progress_s=HOUR - 100,
        work_lost_s=0.0,
    )
    gap = AttemptRow(
        attempt=2,
        try_number=1,
        ended="capacity_error",
        spot=True,
        launched_at=capacity_error_at,
        ended_at=capacity_error_at,
    )
    return RunHistory("ct-0123456789ab", "s3://b/r", "deadline", T0, attempts=[spot, gap])


def test_the_policy_leaves_on_demand_for_a_spell_old_enough_and_not_before() -> None:
    history = history_with_outage(T0 + HOUR)
    launch = on_demand(T0 + HOUR + 60)
    young = probe_step(history, SETTINGS, launch, T0 + HOUR + 120)  # spot unseen for 2 min at most
    assert young.kind == "wait" and "on on-demand, if spot were available: on_demand" in young.reason
    later = probe_step(history, SETTINGS, launch, T0 + 2 * HOUR)
    assert (later.kind, later.cloud) == ("launch", "ec2spot"), later.reason


def test_a_probe_that_found_no_capacity_makes_spot_young_again() -> None:
    history = history_with_outage(T0 + HOUR)
    launch = on_demand(T0 + HOUR + 60)
    now = T0 + 2 * HOUR
    assert probe_step(history, SETTINGS, launch, now).kind == "launch"
    history.probes.append({"at": now, "ok": False, "zones": ["us-east-1a"], "message": "no capacity"})
    history.asked_at = now
    assert last_unavailable(history) == now
    # the next look is one interval later (none before), and a spell it sees is at most that old
    assert next_probe_at(history, SETTINGS, launch) == now + 600.0
    assert probe_step(history, SETTINGS, launch, now + 60.0).kind == "wait"  # 60 s: too young to leave for
    history.probes.append(
        {"at": now + 600.0, "ok": True, "zones": ["us-east-1a"]}
    )  # a switch: not unavailability
    assert last_unavailable(history) == now


def test_probes_wait_an_interval_from_the_launch_or_the_last_look() -> None:
    history = history_with_outage(T0 + HOUR)
    launch = on_demand(T0 + HOUR + 60)
    assert next_probe_at(history, SETTINGS, launch) == T0 + HOUR + 660.0
    history.asked_at = T0 + 5 * HOUR
    assert next_probe_at(history, SETTINGS, launch) == T0 + 5 * HOUR + 600.0


@pytest.mark.parametrize(
    ("settings", "launch"),
    [
        (SETTINGS, on_demand(T0, spot=True)),  # spot is what it would switch to
        (SETTINGS, on_demand(T0, nodes=[{"rank": 0, "instance_id": "a"}, {"rank": 1, "instance_id": "b"}])),
        (RecoverySettings(cloud="ec2spot", probe_interval_s=600.0), on_demand(T0)),  # spot_first
        (RecoverySettings(cloud="ec2spot", policy="deadline"), on_demand(T0)),  # no interval
    ],
    ids=["spot", "gang", "spot_first", "no-interval"],
)
def test_only_an_on_demand_single_instance_of_the_deadline_policy_is_probed(
    settings: RecoverySettings, launch: LaunchRecord
) -> None:
    assert next_probe_at(history_with_outage(T0), settings, launch) is None


def test_the_safety_net_keeps_on_demand_near_the_deadline() -> None:
    history = history_with_outage(T0 + HOUR)
    tight = RecoverySettings(**{**SETTINGS.__dict__, "deadline_at": T0 + 20 * HOUR + 300})
    step = probe_step(history, tight, on_demand(T0 + HOUR + 60), T0 + 3 * HOUR)
    assert step.kind == "wait" and ": on_demand" in step.reason


def test_the_wait_stops_for_the_probe_and_only_then() -> None:
    now = [T0]
    watch = RunWatch(None, T0, wall=lambda: now[0])
    watch.probe_at = T0 + 600
    assert watch.decide(None, None) is None
    now[0] = T0 + 600
    event = watch.decide(None, None)
    assert event is not None and event.state == PROBE_DUE


def test_leaving_for_spot_is_its_own_ending_and_spends_no_budget() -> None:
    assert ending_of("left_for_spot", False, False) == "left_for_spot"
    left = AttemptRow(attempt=1, try_number=1, ended="left_for_spot", spot=False, instance_id="i-od")
    history = RunHistory("ct-0123456789ab", "s3://b/r", "deadline", T0, attempts=[left])
    assert history.interruptions() == history.capacity_losses() == history.error_restarts() == 0


def resume_args(policy: str, probe_interval: object) -> object:
    deadline = ("2d", "10h") if policy == "deadline" else (None, None)
    return parse_resume_args(
        "ec2spot", None, 300, 10, 0, None, policy, None, *deadline, None, None, probe_interval
    )


def test_probe_interval_is_parsed_and_checked_at_parse_time() -> None:
    assert resume_args("deadline", None).probe_interval_s == DEFAULT_PROBE_INTERVAL_S  # type: ignore[attr-defined]
    assert resume_args("deadline", "15m").probe_interval_s == 900.0  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="probe_interval='soon' is not a valid duration"):
        resume_args("deadline", "soon")
    with pytest.raises(ValueError, match="probe_interval=0.5 is too short"):
        resume_args("deadline", 0.5)
    with pytest.raises(ValueError, match="probe_interval='10m' applies to policy='deadline' only"):
        resume_args("spot_first", "10m")


def test_a_failed_probe_counts_against_its_zones_in_the_ranking() -> None:
    from airflow_cloudtrain.lifecycle.resume.zones import zone_events
    from airflow_cloudtrain.policy.zones import rank_zones

    history = history_with_outage(T0 + HOUR)
    history.probes.append(
        {"at": T0 + 2 * HOUR, "ok": False, "zones": ["us-east-1a"], "message": "no capacity"}
    )
    history.probes.append({"at": T0 + 3 * HOUR, "ok": True, "zones": ["us-east-1b"], "instance_id": "i-s"})
    events = [e for e in zone_events(history) if e.kind == "capacity_error"]
    assert [(e.zone, e.at) for e in events] == [("us-east-1a", 2.0)]
    assert rank_zones(["us-east-1a", "us-east-1b"], events, 2.1) == ["us-east-1b", "us-east-1a"]

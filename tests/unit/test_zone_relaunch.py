"""The resume loop's zone choice (``lifecycle.resume.zones``) on hand-made ledgers: which zone a spot
relaunch tries first, that a reloaded ledger ranks the same way, and how a move is recorded."""

from __future__ import annotations

import logging

from airflow_cloudtrain.catalog.select import rank_offers
from airflow_cloudtrain.lifecycle.resume.history import AttemptRow, RunHistory, format_ledger
from airflow_cloudtrain.lifecycle.resume.recovery import (
    RecoverySettings,
    capacity_row,
    launch_fields,
    next_step,
)
from airflow_cloudtrain.lifecycle.resume.zones import (
    allowed_zones,
    launch_order,
    no_capacity_zones,
    note_move,
    zone_events,
)
from airflow_cloudtrain.spec import Hardware

T0 = 1_000_000.0
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
LOG = logging.getLogger("test")
GCE = rank_offers("gcspot", Hardware(cpus=2), region="us-central1")[0]  # sold in a, b, c and f
EC2 = rank_offers("ec2spot", Hardware(cpus=2), region="us-east-1")[0]


def row(n: int, ended: str, zone: str | None, spot: bool = True, **kw: object) -> AttemptRow:
    base = {
        "instance_id": f"i-{n}",
        "launched_at": T0 + 100 * n,
        "job_started_at": T0 + 100 * n + 20,
        "ended_at": T0 + 100 * n + 80,
        "cost_usd": 0.01,
        "zone": zone,
    }
    return AttemptRow(attempt=n, try_number=1, ended=ended, spot=spot, **{**base, **kw})  # type: ignore[arg-type]


def history(*rows: AttemptRow) -> RunHistory:
    return RunHistory("ct-0123456789ab", "gs://b/r", "deadline", T0, attempts=list(rows))


def order(h: RunHistory, zones: tuple[str, ...] = (A, B, C), spot: bool = True) -> list[str | None]:
    return launch_order(h, zones, spot, GCE, [A, B, C, "us-central1-f"], T0 + 1000, LOG)


def test_a_run_that_saw_nothing_keeps_the_allowed_order() -> None:
    assert order(history()) == [A, B, C]
    assert launch_order(history(), (), True, GCE, [A, B], T0, LOG) == [A, B]  # no zones: zones_for's


def test_the_zone_that_preempted_goes_last_and_two_preemptions_outweigh_a_capacity_error() -> None:
    once = history(row(1, "interrupted_no_notice", A))
    assert order(once) == [B, C, A]
    # the relaunch found no capacity in B and failed over to A, which preempted again
    twice = history(once.attempts[0], row(2, "interrupted", A, no_capacity_in=[B]))
    assert order(twice, (A, B)) == [B, A]
    assert order(twice) == [C, B, A]


def test_one_zone_on_demand_and_a_cloud_placed_launch_are_left_as_they_were() -> None:
    h = history(row(1, "interrupted", A), row(2, "interrupted", A))
    assert order(h, (A,)) == [A]  # one zone allowed: relaunched there, as zone=A always did
    assert order(h, spot=False) == [A, B, C]  # on-demand: the user's order, no ranking
    assert launch_order(h, (), True, EC2, [None], T0, LOG) == [None]  # EC2 without zones: EC2 places it
    assert launch_order(h, (), True, GCE, [A, B], T0, LOG) == [A, B]  # no zones argument: zones_for's order


def test_the_users_zones_restrict_every_offer_and_the_offers_zones_restrict_them() -> None:
    assert allowed_zones(("us-east-1b", "us-east-1a"), EC2, [None]) == ["us-east-1b", "us-east-1a"]
    assert allowed_zones((A, "us-central1-d"), GCE, [A]) == [A]  # GCE sells it in a, b, c, f only


def test_only_spot_attempts_count_and_a_reloaded_ledger_ranks_the_same() -> None:
    h = history(
        row(1, "interrupted", A),
        row(2, "finished", B, spot=False),  # on-demand says nothing about spot capacity
        capacity_row(3, 1, "gcspot", "no capacity", T0 + 400, [C]),
    )
    kinds = [(e.zone, e.kind) for e in zone_events(h)]
    assert kinds == [(A, "launched"), (A, "preempted"), (C, "capacity_error")]
    again = RunHistory.from_dict(h.to_dict())
    assert order(again) == order(h) == [B, C, A]


def test_a_move_is_recorded_with_its_reason_and_printed() -> None:
    h = history(row(1, "interrupted_no_notice", A), row(2, "interrupted", A, no_capacity_in=[B]))
    third = row(3, "finished", B)
    note_move(h, [third])
    assert third.moved_from == A
    assert third.move_reason is not None
    assert f"{A}: 2 preemption(s), 0 capacity error(s)" in third.move_reason
    assert f"{B}: 0 preemption(s), 1 capacity error(s)" in third.move_reason
    same = row(3, "finished", A)
    note_move(h, [same])
    assert same.moved_from is None  # the same zone is no move
    h.attempts.append(third)
    assert f"moved from {A} to {B}: spot relaunch" in format_ledger(h.to_dict())


def test_a_gang_moves_as_one() -> None:
    h = history(row(1, "interrupted", A, rank=0, num_nodes=2), row(1, "interrupted", A, rank=1, num_nodes=2))
    nodes = [row(2, "finished", B, rank=r, num_nodes=2, instance_id=f"i-2{r}") for r in (0, 1)]
    note_move(h, nodes)
    assert [n.moved_from for n in nodes] == [A, A]
    assert [(e.zone, e.kind) for e in zone_events(h)] == [(A, "launched"), (A, "preempted")]  # once
    h.attempts.extend(nodes)
    assert format_ledger(h.to_dict()).count("moved from") == 1


def test_an_old_ledger_without_the_zone_fields_still_loads() -> None:
    old = history(row(1, "interrupted", A)).to_dict()
    for r in old["attempts"]:
        for key in ("no_capacity_in", "moved_from", "move_reason"):
            r.pop(key)
    loaded = RunHistory.from_dict(old)
    assert loaded.attempts[0].no_capacity_in == [] and loaded.attempts[0].moved_from is None
    assert order(loaded) == [B, C, A]


def test_the_launchers_failover_becomes_the_rows_capacity_zones() -> None:
    tried = [["t3.medium", "us-east-1b", "InsufficientInstanceCapacity"], ["t3.large", "us-east-1", "x"]]
    assert no_capacity_zones(tried, "us-east-1") == ["us-east-1b"]  # the region names no zone

    class Launch:
        cloud, instance_id, instance_type, spot, zone, region = "ec2spot", "i-1", "t3.medium", True, A, "r"
        requested_at = launched_at = hourly_usd = None
        failover = [["t3.medium", B, "ZONE_RESOURCE_POOL_EXHAUSTED"]]

    assert launch_fields(Launch())["no_capacity_in"] == [B]  # type: ignore[arg-type]


def test_the_deadline_policy_relaunches_spot_after_a_preemption_and_says_why_it_would_not() -> None:
    settings = RecoverySettings(
        cloud="gcspot",
        policy="deadline",
        deadline_at=T0 + 6 * 3600,
        expected_duration_s=600,
        zones=(A, B),
    )
    preempted = history(row(1, "interrupted", A), row(2, "interrupted", A, no_capacity_in=[B]))
    step = next_step(preempted, settings, 1, T0 + 300)
    assert (step.kind, step.cloud) == ("launch", "gcspot")  # spot again (in B first), not on-demand
    assert f"after a preemption in {A}" in step.reason
    nowhere = history(row(1, "interrupted", A), capacity_row(2, 1, "gcspot", "none", T0 + 290, [B, A]))
    step = next_step(nowhere, settings, 1, T0 + 300)
    assert step.kind in ("wait", "launch") and step.cloud != "gcspot"
    assert f"no spot capacity in any allowed zone tried ({B}, {A})" in step.reason


def test_placement_scores_are_asked_only_for_a_ranked_spot_launch_and_order_it() -> None:
    asked: list[list[str]] = []

    def scores(zones: list[str]) -> dict[str, float]:
        asked.append(list(zones))
        return {A: 2.0, B: 9.0, C: 6.0}

    assert launch_order(history(), (A, B, C), True, GCE, [A, B, C], T0, LOG, scores) == [B, C, A]
    assert asked == [[A, B, C]]
    once = history(row(1, "interrupted_no_notice", B))  # the best-scored zone just preempted the run
    assert launch_order(once, (A, B, C), True, GCE, [A, B, C], T0 + 1000, LOG, scores) == [C, A, B]
    # not asked where nothing is ranked: on-demand, one zone, no zones argument
    asked.clear()
    assert launch_order(once, (A, B, C), False, GCE, [A, B, C], T0, LOG, scores) == [A, B, C]
    assert launch_order(once, (A,), True, GCE, [A, B, C], T0, LOG, scores) == [A]
    assert launch_order(once, (), True, EC2, [None], T0, LOG, scores) == [None]
    assert asked == []
    # the cloud gives none (GCE) or would not say: the order without scores
    assert launch_order(history(), (A, B, C), True, GCE, [A, B, C], T0, LOG, lambda z: None) == [A, B, C]

"""The zone ranking the resume loop and the simulator share (airflow_cloudtrain.policy.zones)."""

from airflow_cloudtrain.policy.zones import ZoneEvent, rank_zones, zone_trouble


def test_nothing_seen_keeps_the_offer_order() -> None:
    assert rank_zones(["b", "a", "c", "a"], [], now=1.0) == ["b", "a", "c"]


def test_the_zone_that_just_preempted_goes_last() -> None:
    events = [ZoneEvent("a", "launched", 0.0), ZoneEvent("a", "preempted", 0.9)]
    assert rank_zones(["a", "b", "c"], events, now=1.0) == ["b", "c", "a"]


def test_older_trouble_weighs_less_than_recent_trouble() -> None:
    events = [ZoneEvent("a", "preempted", 0.0), ZoneEvent("b", "preempted", 2.0)]
    assert rank_zones(["b", "a"], events, now=2.1) == ["a", "b"]
    assert zone_trouble("a", events, now=0.5) == 0.5


def test_future_events_are_not_counted() -> None:
    assert zone_trouble("a", [ZoneEvent("a", "preempted", 3.0)], now=1.0) == 0.0


def test_placement_scores_order_the_untroubled_zones_and_never_outrank_fresh_trouble() -> None:
    scores = {"a": 3.0, "b": 9.0, "c": 6.0}
    assert rank_zones(["a", "b", "c"], [], now=1.0, scores=scores) == ["b", "c", "a"]
    # b preempted the run ten minutes ago: first-hand trouble outranks b's score
    fresh = [ZoneEvent("b", "preempted", 0.85)]
    assert rank_zones(["a", "b", "c"], fresh, now=1.0, scores=scores) == ["c", "a", "b"]
    # a preemption 3 h ago has faded below one step of SCORED_TIE: the score decides again
    faded = [ZoneEvent("b", "preempted", 0.0)]
    assert zone_trouble("b", faded, now=3.0) < 0.1
    assert rank_zones(["a", "b", "c"], faded, now=3.0, scores=scores) == ["b", "c", "a"]
    # without scores the same faded trouble still counts: the order is exactly as before scores
    assert rank_zones(["a", "b", "c"], faded, now=3.0) == ["a", "c", "b"]


def test_a_zone_without_a_score_counts_as_the_lowest_and_equal_scores_keep_the_offer_order() -> None:
    assert rank_zones(["a", "b", "c"], [], now=0.0, scores={"c": 1.0}) == ["c", "a", "b"]
    assert rank_zones(["c", "a", "b"], [], now=0.0, scores={"a": 5.0, "b": 5.0, "c": 5.0}) == ["c", "a", "b"]
    assert rank_zones(["a", "b"], [], now=0.0, scores={}) == ["a", "b"]  # none known: as without

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

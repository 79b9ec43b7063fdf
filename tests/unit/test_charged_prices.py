"""The cost of an attempt at the prices charged: the step-function integral of a price history (per
second, 60 s minimum), gang nodes and root volumes; and the emulated DescribeSpotPriceHistory's window."""

from __future__ import annotations

import pytest

from airflow_cloudtrain.core.billing import PriceHistory, instance_cost, integrate_usd, volume_usd
from airflow_cloudtrain.emulator.aws.pricing import _in_window


def test_a_price_that_doubles_halfway_costs_one_and_a_half_times() -> None:
    history = PriceHistory(((0.0, 1.0), (1000.0 + 1800.0, 2.0)), "h")
    assert integrate_usd(history, 1000.0, 3600.0) == pytest.approx(1.5)


def test_the_minimum_is_billed_at_the_prices_of_the_first_minute() -> None:
    history = PriceHistory(((0.0, 3.6), (130.0, 7.2)), "h")  # the change comes 30 s into the run
    assert integrate_usd(history, 100.0, 5.0) == pytest.approx((3.6 * 30 + 7.2 * 30) / 3600)


def test_a_history_that_starts_late_prices_the_start_at_its_first_price() -> None:
    history = PriceHistory(((500.0, 3.6),), "h")
    assert history.price_at(100.0) == 3.6
    assert integrate_usd(history, 100.0, 100.0) == pytest.approx(0.1)


def test_gang_nodes_and_volumes_are_added() -> None:
    history = PriceHistory(((0.0, 3.6),), "EC2 spot price history of m5.large in us-east-1a")
    cost, basis = instance_cost(1.0, 0.0, 100.0, count=3, history=history, disk=(50.0, 0.08))
    volume = volume_usd(50.0, 0.08, 100.0)
    assert volume == pytest.approx(50 * 0.08 * 100 / (730 * 3600))
    assert cost == pytest.approx(3 * (0.1 + volume), abs=1e-6)
    assert basis.startswith("EC2 spot price history") and "x 3 nodes" in basis and "50 GiB" in basis


def test_without_history_the_launch_price_stands() -> None:
    cost, basis = instance_cost(3.6, 0.0, 10.0)
    assert cost == pytest.approx(0.06) and basis.startswith("$3.6/h x 60 s billed")
    assert instance_cost(None, 0.0, 10.0)[0] is None


def test_the_emulated_history_returns_what_was_in_effect_in_the_window() -> None:
    points = [(0.0, 1.0), (50.0, 2.0), (150.0, 3.0), (300.0, 4.0)]
    assert _in_window(points, 100.0, 200.0) == [(50.0, 2.0), (150.0, 3.0)]
    assert _in_window(points, None, None) == points
    assert _in_window(points, 400.0, 500.0) == [(300.0, 4.0)]

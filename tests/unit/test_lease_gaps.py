"""``LeaseGaps``: the longest span from the start of one lease call to the end of the next, which
bounds how long the queue went without hearing from the worker (``agent.worker``)."""

from __future__ import annotations

import time

import pytest

from airflow_cloudtrain.agent.worker import LeaseGaps


def test_a_span_runs_from_one_calls_start_to_the_next_calls_end() -> None:
    asked = time.monotonic() - 5.0  # the receive began 5 s ago
    gaps = LeaseGaps(asked)
    gaps.call(lambda: None)  # the first renewal: 5 s since the receive's start
    assert 5.0 <= gaps.longest < 60.0
    first = gaps.longest
    gaps.since -= 10.0  # as if that renewal had begun 10 s before this ack
    gaps.call(lambda: None)
    assert gaps.longest >= 10.0 > first


def test_a_call_that_fails_does_not_count_as_reaching_the_queue() -> None:
    gaps = LeaseGaps(time.monotonic() - 3.0)

    def refused() -> None:
        raise ConnectionError("throttled")

    with pytest.raises(ConnectionError):
        gaps.call(refused)
    assert gaps.longest == 0.0  # nothing measured yet: the span still runs from the receive
    gaps.call(lambda: None)
    assert gaps.longest >= 3.0

"""Log chunks reach the task log in order, each once, even when listing is out of order or has gaps."""

from __future__ import annotations

import pytest

from airflow_cloudtrain.contract.runs import log_key
from airflow_cloudtrain.core.logstream import LogFollower


def test_chunks_in_order_without_duplicates_and_stops_at_a_gap() -> None:
    store = {log_key("i-1", 0): b"a\nb\n", log_key("i-1", 2): b"e\n", log_key("i-1", 1): b"c\nd\n"}
    follower = LogFollower("i-1")
    listed = [log_key("i-1", 2), log_key("i-1", 0)]  # chunk 1 not visible yet
    assert follower.poll(lambda prefix: listed, store.get) == ["a", "b"]  # 2 waits for 1
    assert follower.poll(lambda prefix: listed, store.get) == []  # nothing shown twice
    listed.append(log_key("i-1", 1))
    assert follower.poll(lambda prefix: listed, store.get) == ["c", "d", "e"]
    assert follower.next_seq == 3


def test_a_resumed_follower_starts_where_the_trigger_stopped() -> None:
    store = {log_key("i-1", n): f"line {n}\n".encode() for n in range(4)}
    follower = LogFollower("i-1", next_seq=2)
    assert follower.poll(lambda prefix: sorted(store), store.get) == ["line 2", "line 3"]


def test_a_chunk_whose_read_fails_is_read_again_on_the_next_poll() -> None:
    store = {log_key("i-1", 0): b"a\n", log_key("i-1", 1): b"b\n"}
    follower = LogFollower("i-1")
    calls = []

    def flaky(key: str) -> bytes | None:
        calls.append(key)
        if len(calls) == 2:  # the second chunk's first read is throttled
            raise ConnectionError("throttled")
        return store[key]

    with pytest.raises(ConnectionError):
        follower.poll(lambda prefix: sorted(store), flaky)
    assert follower.next_seq == 1  # chunk 1 not lost...
    assert follower.poll(lambda prefix: sorted(store), flaky) == ["a", "b"]  # ...nor chunk 0's lines

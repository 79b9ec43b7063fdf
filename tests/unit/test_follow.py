"""``hooks.follow.Following``: a client kept for a long poll is rebuilt when its connection changed,
checked at most every ``RECHECK_S`` and right after a failed call; never rebuilt for nothing."""

from __future__ import annotations

import json
import os

import pytest

from airflow_cloudtrain.hooks import follow


@pytest.fixture
def conn(monkeypatch: pytest.MonkeyPatch):
    def set_endpoint(endpoint: str) -> None:
        extra = {"project": "p", "vertex_endpoint": endpoint, "credentials": "anonymous"}
        monkeypatch.setenv(
            "AIRFLOW_CONN_FOLLOWED", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
        )

    set_endpoint("http://127.0.0.1:1111")
    return set_endpoint


def test_the_client_is_rebuilt_only_when_the_connection_changed(conn) -> None:
    built: list[str] = []
    closed: list[str] = []

    def make() -> str:
        built.append(json.loads(os.environ["AIRFLOW_CONN_FOLLOWED"])["extra"]["vertex_endpoint"])
        return built[-1]

    following = follow.Following("followed", make, closed.append, recheck_s=0.0)
    assert following.get() == "http://127.0.0.1:1111"
    assert following.get() == "http://127.0.0.1:1111" and len(built) == 1  # same connection: kept
    conn("http://127.0.0.1:2222")
    assert following.get() == "http://127.0.0.1:2222" and len(built) == 2
    assert closed == []  # the old one may still be in use by another thread of the poll...
    following.close()
    assert sorted(closed) == ["http://127.0.0.1:1111", "http://127.0.0.1:2222"]  # ...closed at the end


def test_between_rechecks_only_a_failure_makes_it_look_again(conn) -> None:
    following = follow.Following("followed", object, lambda _: None, recheck_s=3600.0)
    first = following.get()
    conn("http://127.0.0.1:2222")
    assert following.get() is first  # not due yet
    following.failed()
    assert following.get() is not first  # a failed call: the connection is read again at once
    assert following.builds == 2


def test_the_fingerprint_tells_a_change_without_holding_the_secret(conn, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SECRETIVE", json.dumps({"conn_type": "aws", "password": "hunter2"}))
    digest = follow.connection_fingerprint("secretive")
    assert "hunter2" not in digest and len(digest) == 64
    monkeypatch.setenv("AIRFLOW_CONN_SECRETIVE", json.dumps({"conn_type": "aws", "password": "hunter3"}))
    assert follow.connection_fingerprint("secretive") != digest
    assert follow.connection_fingerprint("no_such_connection").startswith("unreadable:")

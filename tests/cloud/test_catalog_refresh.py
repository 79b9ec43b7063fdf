"""What a live catalog refresh may cost a run, on both clouds (the ``provider`` parameter): a refresh
that fails is remembered, so it costs one run only (not every parse or launch until it works again),
and an endpoint that accepts the connection and never answers ends at the refresh's budget, not at
the client's read timeout.

AWS: the real boto3 EC2 and Pricing clients (Pricing throttled by the emulator); GCP: the real
google-cloud-compute clients against the GCE emulator and the Billing Catalog served by the local
server of ``test_catalog_live_gcp.py``. What only one cloud's refresh does (its prices, its pages, its
shapes) stays in ``test_catalog_live.py`` / ``test_catalog_live_gcp.py``.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_catalog_live_gcp import REGION as GCP_REGION
from test_catalog_live_gcp import _Billing, billing, gce, refresh  # noqa: F401  (fixtures, by name)

from airflow_cloudtrain.catalog import live
from airflow_cloudtrain.catalog.snapshot import snapshot_rows

PROVIDERS = ["aws", "gcp"]


def _warnings(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture()
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CLOUDTRAIN_CACHE_DIR", str(tmp_path))
    live._memo.clear()
    yield tmp_path / "catalog"
    live._memo.clear()


@dataclass
class Failing:
    """One cloud's refresh of one region whose price endpoint fails: ``run`` refreshes, ``asked`` counts
    the calls that reached the failing endpoint, ``heal`` makes it answer again; ``cache`` is the
    catalog cache folder."""

    provider: str
    region: str
    run: Callable[[], list[Any]]
    asked: Callable[[], int]
    heal: Callable[[], Any]
    cache: Path


def failing_refresh(request: pytest.FixtureRequest, provider: str) -> Failing:
    if provider == "aws":  # the Pricing API refuses every call
        import boto3
        from botocore.config import Config

        emu = request.getfixturevalue("emu")
        cache = request.getfixturevalue("own_cache")
        once = Config(retries={"mode": "standard", "total_max_attempts": 1})
        ec2 = boto3.client("ec2", region_name="eu-west-1", config=once)
        pricing = boto3.client("pricing", region_name="us-east-1", config=once)
        emu.throttle(1.0, api="GetProducts")
        return Failing(
            "aws", "eu-west-1", lambda: live.refresh_aws("eu-west-1", ec2, pricing),
            lambda: int(emu.request_counts().get("GetProducts", 0)), emu.clear_faults, cache,
        )  # fmt: skip
    run, url = request.getfixturevalue("refresh"), request.getfixturevalue("billing")
    base = {"url": f"{url}/broken"}  # the Billing Catalog answers 500
    return Failing(
        "gcp", GCP_REGION, lambda: run(base["url"]), lambda: len(_Billing.requests),
        lambda: base.update(url=url), live.cache_dir() / "catalog",
    )  # fmt: skip


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_failed_refresh_is_remembered_and_costs_one_run_only(
    request: pytest.FixtureRequest, provider: str, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = failing_refresh(request, provider)
    asked = r.asked()
    with caplog.at_level(logging.INFO):
        assert r.run() == []
    assert r.asked() == asked + 1
    [warning] = _warnings(caplog)
    assert f"Live catalog refresh for {r.provider}/{r.region} failed, using the snapshot" in warning
    if provider == "aws":
        assert "ThrottlingException" in warning or "Rate exceeded" in warning

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert r.run() == []  # the next run: no call, no warning
    assert r.asked() == asked + 1
    assert _warnings(caplog) == [] and "next try in" in caplog.text
    assert live.current_rows(r.provider) == snapshot_rows(r.provider)

    monkeypatch.setenv("CLOUDTRAIN_CATALOG_RETRY_S", "0")  # once the retry delay is over, it tries again
    r.heal()
    assert r.run()
    assert r.asked() > asked + 1
    if provider == "gcp":
        assert r.asked() == asked + 3  # the failed call, then both pages (cached)
    assert not (r.cache / f".{r.provider}-{r.region}.failed").exists()


def hanging_endpoint(accepted: list[socket.socket]) -> tuple[socket.socket, str]:
    """A listener that accepts connections and never reads or answers; its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_refresh_that_does_not_answer_ends_at_its_budget(
    request: pytest.FixtureRequest, provider: str, own_cache: Path, caplog: Any
) -> None:
    """An endpoint that accepts the connection and never answers (AWS: EC2 and Pricing; GCP: the
    Billing Catalog, after the zones listed): the refresh gives up at its budget, and the next run does
    not try again."""
    accepted: list[socket.socket] = []
    listener, hanging = hanging_endpoint(accepted)
    closing: list[Any] = []
    if provider == "aws":
        import boto3
        from botocore.config import Config

        slow = Config(
            retries={"mode": "standard", "total_max_attempts": 1}, read_timeout=60, connect_timeout=5
        )
        kw = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}  # none else here
        ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=hanging, config=slow, **kw)
        pricing = boto3.client("pricing", region_name="us-east-1", endpoint_url=hanging, config=slow, **kw)
        region = "us-east-1"

        def run() -> list[Any]:
            return live.refresh_aws("us-east-1", ec2, pricing, budget_s=1.0)

    else:
        from google.auth.credentials import AnonymousCredentials
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import compute_v1

        from airflow_cloudtrain.catalog import live_gcp
        from airflow_cloudtrain.clouds.gcp.gce import zones_of
        from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs

        server = request.getfixturevalue("gce")
        kwargs = compute_client_kwargs(server.endpoint)
        mt, at = compute_v1.MachineTypesClient(**kwargs), compute_v1.AcceleratorTypesClient(**kwargs)
        session = AuthorizedSession(AnonymousCredentials())
        closing.append(session)
        region = GCP_REGION

        def run() -> list[Any]:
            return live_gcp.refresh_gcp(
                GCP_REGION,
                mt,
                at,
                session,
                zones_of(GCP_REGION),
                server.project,
                billing_url=hanging,
                budget_s=1.0,
            )

    try:
        with caplog.at_level(logging.WARNING):
            assert run() == []
        [warning] = _warnings(caplog)
        # the refresh's own budget, or its requests' read timeout (the same 1 s), whichever fires
        # first on the machine's load: the user is told of the budget either way
        assert "no answer within its 1 s budget" in warning, warning
        assert (own_cache / f".{provider}-{region}.failed").exists()
        deadline = time.monotonic() + 60
        while not accepted:  # the refresh did reach the server (and is still waiting there)
            assert time.monotonic() < deadline, "the refresh never reached the hanging endpoint"
            time.sleep(0.05)
        assert run() == []
        assert len(accepted) == 1  # remembered: the second run did not contact the server
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
        for item in closing:
            item.close()


def _requests_read_timeout() -> BaseException:
    import requests

    return requests.exceptions.ReadTimeout("HTTPConnectionPool(host='127.0.0.1'): Read timed out.")


def _botocore_read_timeout() -> BaseException:
    from botocore.exceptions import ReadTimeoutError

    return ReadTimeoutError(endpoint_url="http://127.0.0.1:1/")


@pytest.mark.parametrize("timeout", [_requests_read_timeout, _botocore_read_timeout])
def test_a_request_timing_out_before_the_budget_wait_is_reported_as_the_budget(
    timeout: Callable[[], BaseException], own_cache: Path, caplog: Any
) -> None:
    """A loaded machine lets a request's own read timeout (set to the budget) fire before the
    refresh's wait for the budget ends: the user reads the same reason, with the client's words."""

    def fetch(budget: float) -> list[Any]:
        raise timeout()

    with caplog.at_level(logging.WARNING):
        assert live.refreshed("aws", "us-east-1", fetch, budget_s=1.0) == []
    [warning] = _warnings(caplog)
    assert "no answer within its 1 s budget" in warning and str(timeout()) in warning, warning
    assert (own_cache / ".aws-us-east-1.failed").exists()


def test_a_refresh_that_fails_otherwise_names_its_own_error(own_cache: Path, caplog: Any) -> None:
    def fetch(budget: float) -> list[Any]:
        raise PermissionError("AccessDenied: ec2:DescribeInstanceTypes")

    with caplog.at_level(logging.WARNING):
        assert live.refreshed("aws", "us-east-1", fetch, budget_s=1.0) == []
    [warning] = _warnings(caplog)
    assert "AccessDenied: ec2:DescribeInstanceTypes" in warning and "budget" not in warning, warning

"""The emulated Google REST APIs share one request pipeline (``emulator.gcp.rest``): route -> own client
-> throttle -> count -> dispatch -> Google's JSON error. The pipeline is checked on a small server of
its own, then every real server (Compute Engine with the Billing Catalog, Pub/Sub with Monitoring,
Secret Manager, Vertex AI with Logging) is checked over the wire to take it, so that a server that
routed, counted or throttled its own way would fail here."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT
from airflow_cloudtrain.emulator.gcp.gce import GceServer
from airflow_cloudtrain.emulator.gcp.pubsub import PubSubServer
from airflow_cloudtrain.emulator.gcp.rest import GoogleError, GoogleRestServer
from airflow_cloudtrain.emulator.gcp.secretmanager import SecretManagerServer
from airflow_cloudtrain.emulator.gcp.vertex import VertexServer

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _call(
    url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with _NO_PROXY.open(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class _Refused(ValueError):
    """A validator's fault, which the pipeline answers as a 400."""


class _Things(GoogleRestServer):
    service = "things"
    services = {"stats.get": "monitoring"}
    invalid_errors = (_Refused,)

    def __init__(self) -> None:
        super().__init__(
            [
                Rule("/v1/things/<name>", endpoint="things.get", methods=["GET"]),
                Rule("/v1/things/<name>", endpoint="things.create", methods=["POST"]),
                Rule("/v1/stats", endpoint="stats.get", methods=["GET"]),
            ]
        )

    def _h_things_get(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        if name == "gone":
            raise GoogleError(404, "Thing [gone] not found.")
        if name == "refused":
            raise _Refused("Field thing.name: refused.")
        return {"name": name}

    def _h_things_create(self, req: Request, body: dict[str, Any], name: str) -> dict[str, Any]:
        return {"name": name, **body}

    def _h_stats_get(self, req: Request, body: dict[str, Any]) -> dict[str, Any]:
        return {"count": 1}


@pytest.fixture
def things() -> Iterator[_Things]:
    server = _Things()
    server.start()
    yield server
    server.stop()


def test_a_route_dispatches_to_its_handler_and_is_counted(things: _Things) -> None:
    assert _call(f"{things.endpoint}/v1/things/a") == (200, {"name": "a"})
    assert _call(f"{things.endpoint}/v1/things/b", "POST", b'{"size": 2}') == (200, {"name": "b", "size": 2})
    assert _call(f"{things.endpoint}/v1/things/c") == (200, {"name": "c"})
    assert things.counts() == {"things.get": 2, "things.create": 1}
    things.reset_counts()
    assert things.counts() == {}


def test_the_emulators_own_requests_are_neither_counted_nor_throttled(things: _Things) -> None:
    things.throttle.set(1.0)
    for header in ("User-Agent", "x-goog-api-client"):
        own = {header: f"gl-python/3.11 {EMULATOR_USER_AGENT}/1"}
        assert _call(f"{things.endpoint}/v1/things/a", headers=own) == (200, {"name": "a"})
    assert things.counts() == {}


def test_a_throttled_request_is_a_429_in_googles_json_and_counted_twice(things: _Things) -> None:
    things.throttle.set(1.0, "things.get")
    status, body = _call(f"{things.endpoint}/v1/things/a")
    assert status == 429
    assert body["error"]["code"] == 429 and body["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert "things.googleapis.com" in body["error"]["message"]
    assert _call(f"{things.endpoint}/v1/things/b", "POST")[0] == 200  # another method: not selected
    things.throttle.set(1.0, "monitoring")  # a second API on the port is throttled as its own service
    status, body = _call(f"{things.endpoint}/v1/stats")
    assert status == 429 and "monitoring.googleapis.com" in body["error"]["message"]
    assert things.counts() == {
        "things.get": 1,
        "throttled:things.get": 1,
        "things.create": 1,
        "stats.get": 1,
        "throttled:stats.get": 1,
    }


def test_an_unknown_route_is_a_404_in_googles_json_and_not_counted(things: _Things) -> None:
    status, body = _call(f"{things.endpoint}/v1/nothing/here")
    assert status == 404
    assert body == {
        "error": {
            "code": 404,
            "message": "Requested entity was not found. (GET /v1/nothing/here)",
            "status": "NOT_FOUND",
        }
    }
    assert things.counts() == {}


def test_handler_errors_and_bad_bodies_are_googles_json(things: _Things) -> None:
    assert _call(f"{things.endpoint}/v1/things/gone") == (
        404,
        {"error": {"code": 404, "message": "Thing [gone] not found.", "status": "NOT_FOUND"}},
    )
    status, body = _call(f"{things.endpoint}/v1/things/refused")
    assert (status, body["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert body["error"]["message"] == "Field thing.name: refused."
    status, body = _call(f"{things.endpoint}/v1/things/x", "POST", b"[1, 2]")
    assert (status, body["error"]["message"]) == (400, "Invalid JSON payload received.")


def test_google_error_keys_come_in_the_apis_order() -> None:
    error = GoogleError(429, "slow down", errors=[{"reason": "rateLimitExceeded"}], details=[{"@type": "x"}])
    assert list(error.body()["error"]) == ["code", "message", "errors", "status", "details"]
    assert list(GoogleError(409, "there").body()["error"]) == ["code", "message", "status"]
    assert GoogleError(409, "there").status == "ALREADY_EXISTS"
    assert (
        GoogleError(400, "late", status="FAILED_PRECONDITION").body()["error"]["status"]
        == "FAILED_PRECONDITION"
    )


# --- every real server takes the pipeline -------------------------------------------------------------

P = "cloudtrain-emulated"
# server factory, one plain request (method, path, the method name it is counted as), throttled service
SERVERS: dict[str, tuple[Callable[[], GoogleRestServer], str, str, str]] = {
    "compute": (GceServer, f"/compute/v1/projects/{P}/zones", "zones.list", "compute"),
    "billing": (
        GceServer,
        "/v1/services/6F81-5844-456A/skus?pageSize=1",
        "services.skus.list",
        "cloudbilling",
    ),
    "pubsub": (PubSubServer, f"/v1/projects/{P}/topics", "topics.list", "pubsub"),
    "monitoring": (
        PubSubServer,
        f"/v3/projects/{P}/timeSeries?filter=metric.type%3D%22x%22&interval.endTime=2026-01-01T00:00:00Z",
        "timeSeries.list",
        "monitoring",
    ),
    "secretmanager": (SecretManagerServer, f"/v1/projects/{P}/secrets", "secrets.list", "secretmanager"),
    "aiplatform": (
        VertexServer,
        f"/v1/projects/{P}/locations/us-central1/customJobs",
        "customJobs.list",
        "aiplatform",
    ),
}


@pytest.mark.parametrize("api", sorted(SERVERS))
def test_every_google_server_takes_the_shared_pipeline(api: str) -> None:
    make, path, op, service = SERVERS[api]
    server = make()
    assert isinstance(server, GoogleRestServer)
    assert type(server)._wsgi is GoogleRestServer._wsgi  # no pipeline of its own
    server.start()
    try:
        url = server.endpoint + path
        assert _call(url)[0] == 200
        assert _call(url, headers={"User-Agent": EMULATOR_USER_AGENT})[0] == 200
        assert server.counts() == {op: 1}
        server.throttle.set(1.0, service)
        status, body = _call(url)
        assert (status, body["error"]["code"], body["error"]["status"]) == (429, 429, "RESOURCE_EXHAUSTED")
        assert f"{service}.googleapis.com" in body["error"]["message"]
        assert _call(url, headers={"x-goog-api-client": f"gl-python/3 {EMULATOR_USER_AGENT}"})[0] == 200
        assert server.counts() == {op: 2, f"throttled:{op}": 1}
        server.throttle.clear()
        status, body = _call(server.endpoint + "/v9/no/such/route")
        assert (status, body["error"]["code"]) == (404, 404)
        assert server.counts() == {op: 2, f"throttled:{op}": 1}
    finally:
        server.stop()


def test_a_server_error_is_a_503_backend_error_counted_as_unavailable(things: _Things) -> None:
    from airflow_cloudtrain.emulator.faults import UNAVAILABLE

    things.throttle.set(1.0, "things.get", kind=UNAVAILABLE)
    status, body = _call(f"{things.endpoint}/v1/things/a")
    assert status == 503
    assert body["error"]["status"] == "UNAVAILABLE" and body["error"]["errors"][0]["reason"] == "backendError"
    things.throttle.set(0.0, "things.get", kind=UNAVAILABLE)
    assert _call(f"{things.endpoint}/v1/things/a")[0] == 200
    assert things.counts() == {"things.get": 2, "unavailable:things.get": 1}


def test_one_draw_per_request_serves_throttling_and_server_errors() -> None:
    from airflow_cloudtrain.emulator.faults import THROTTLED, UNAVAILABLE, Throttle

    throttle = Throttle()
    throttle.set(0.25, "ec2")
    throttle.set(0.25, "ec2", kind=UNAVAILABLE)
    drawn = [throttle.draw("ec2", "DescribeInstances") for _ in range(4000)]
    assert 800 < drawn.count(THROTTLED) < 1200 and 800 < drawn.count(UNAVAILABLE) < 1200
    assert throttle.draw("s3", "GetObject") is None  # another service: no rule
    throttle.set(0.0, "ec2")
    assert THROTTLED not in {throttle.draw("ec2", "RunInstances") for _ in range(200)}
    throttle.clear()
    assert {throttle.draw("ec2", "RunInstances") for _ in range(50)} == {None}

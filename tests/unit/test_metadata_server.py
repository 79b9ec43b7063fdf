"""The emulator's metadata server enforces what real IMDSv2 / GCE metadata enforce, and the agent's
clients (plus botocore's own IMDS client) read it the way they read the real services."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from airflow_cloudtrain.agent.watcher import AwsMetadata, GceMetadata, parse_time
from airflow_cloudtrain.emulator.metadata import MetadataServer

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    with MetadataServer() as srv:
        yield srv


def _call(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, str]:
    req = urllib.request.Request(
        url, headers=headers or {}, method=method, data=b"" if method == "PUT" else None
    )
    try:
        with _NO_PROXY.open(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _token(base: str) -> str:
    status, token = _call(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT")
    assert status == 200 and token
    return token


def test_endpoints_have_per_instance_prefix(server: MetadataServer) -> None:
    assert server.endpoint_for("i-0abc") == f"http://127.0.0.1:{server.port}/i-0abc"
    assert server.gce_host_for("vm-1") == f"127.0.0.1:{server.port}/vm-1"


def test_imdsv2_requires_token(server: MetadataServer) -> None:
    base = server.endpoint_for("i-0abc")
    assert _call(f"{base}/latest/meta-data/instance-id")[0] == 401
    assert _call(f"{base}/latest/api/token", method="PUT")[0] == 400  # ttl header is required
    assert _call(f"{base}/latest/api/token")[0] == 405
    token = _token(base)
    assert _call(f"{base}/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": "forged"})[0] == 401
    assert _call(f"{base}/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token}) == (
        200,
        "i-0abc",
    )
    # tokens belong to one instance
    other = server.endpoint_for("i-0other")
    assert _call(f"{other}/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token})[0] == 401


def test_spot_instance_action(server: MetadataServer) -> None:
    base = server.endpoint_for("i-spot")
    headers = {"X-aws-ec2-metadata-token": _token(base)}
    url = f"{base}/latest/meta-data/spot/instance-action"
    assert _call(url, headers)[0] == 404
    server.set_spot_action("i-spot", "stop", at=1_795_000_000)
    status, body = _call(url, headers)
    assert status == 200
    data = json.loads(body)
    assert data["action"] == "stop"
    assert data["time"].endswith("Z") and parse_time(data["time"]) == 1_795_000_000
    before = time.time()
    server.set_spot_action("i-spot")  # default: two minutes from now
    at = parse_time(json.loads(_call(url, headers)[1])["time"])
    assert before + 119 <= at <= time.time() + 121  # whole seconds; however slow the call was
    server.clear("i-spot")
    assert _call(url, headers)[0] == 401  # tokens are forgotten with the instance
    assert _call(url, {"X-aws-ec2-metadata-token": _token(base)})[0] == 404


def test_gce_requires_flavor_header(server: MetadataServer) -> None:
    base = f"http://{server.gce_host_for('vm-1')}/computeMetadata/v1/instance"
    assert _call(f"{base}/name")[0] == 403
    flavor = {"Metadata-Flavor": "Google"}
    assert _call(f"{base}/name", flavor) == (200, "vm-1")
    assert _call(f"{base}/id", flavor)[1].isdigit()
    assert _call(f"{base}/preempted", flavor) == (200, "FALSE")
    assert _call(f"{base}/maintenance-event", flavor) == (200, "NONE")
    server.set_preempted("vm-1")
    assert _call(f"{base}/preempted", flavor) == (200, "TRUE")
    assert _call(f"{base}/nothing-here", flavor)[0] == 404
    assert _call(f"http://127.0.0.1:{server.port}/vm-1/elsewhere")[0] == 404


def test_agent_clients_read_it(server: MetadataServer) -> None:
    aws = AwsMetadata(server.endpoint_for("i-0abc") + "/")
    assert aws.instance_id() == "i-0abc"
    assert aws.poll() is None
    at = time.time() + 60
    server.set_spot_action("i-0abc", "terminate", at=at)
    notice = aws.poll()
    assert notice is not None and notice.kind == "spot" and notice.action == "terminate"
    assert notice.at is not None and abs(notice.at - at) <= 1  # the time set (whole seconds), not "now"

    gce = GceMetadata(server.gce_host_for("vm-2"))
    assert gce.instance_id() == "vm-2"
    assert gce.poll() is None
    server.set_maintenance_event("vm-2", "MIGRATE_ON_HOST_MAINTENANCE")
    assert gce.poll() is None  # live migration is not an interruption
    server.set_maintenance_event("vm-2")
    assert gce.poll().action == "TERMINATE_ON_HOST_MAINTENANCE"  # type: ignore[union-attr]
    server.set_preempted("vm-2")
    notice = gce.poll()
    assert notice is not None and notice.kind == "preemption"


def test_botocore_imds_client_reads_it(server: MetadataServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The standard variable really redirects botocore's own IMDS client (what the agent's boto3 uses)."""
    import botocore.session
    from botocore.utils import IMDSRegionProvider

    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", server.endpoint_for("i-0abc"))
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
    assert IMDSRegionProvider(botocore.session.get_session()).provide() == "us-east-1"


def test_a_client_going_away_mid_request_is_not_an_error(
    server: MetadataServer, capfd: pytest.CaptureFixture[str]
) -> None:
    import socket
    import struct

    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        request = "PUT /i-gone/latest/api/token HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\npart"
        sock.sendall(request.encode())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not FIN
        sock.close()
    deadline = time.monotonic() + 60  # bounds a hang only
    while _call(f"{server.endpoint_for('i-0abc')}/latest/meta-data/instance-id")[0] != 401:
        assert time.monotonic() < deadline  # still answering
    server.stop()  # joins the handler threads, those of the dropped connections too
    assert "Traceback" not in capfd.readouterr().err

"""The emulators' servers keep a client's connection open between requests
(``emulator.serving.keep_alive_handler``): the next request on it is answered right, whatever the
app read of the body before, and a stopped server leaves no connection that still answers."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.serving import make_server

from airflow_cloudtrain.emulator.serving import InThread, keep_alive_handler


def _app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    """``/echo`` reads the body, ``/ignore`` does not, ``/chunks`` answers with no length."""
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return iter([body])
    if path == "/chunks":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"one ", b"", b"two"])
    start_response("200 OK", [("Content-Length", "7")])
    return iter([b"ignored"])


@pytest.fixture()
def server() -> Iterator[InThread]:
    serving = InThread(
        make_server("127.0.0.1", 0, _app, threaded=True, request_handler=keep_alive_handler()), "t"
    )
    try:
        yield serving
    finally:
        serving.stop()


def _ask(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> bytes:
    conn.request(method, path, body=body)
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Connection") != "close"
    return response.read()


def test_one_connection_serves_requests_whatever_the_app_read_of_their_bodies(server: InThread) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    assert _ask(conn, "POST", "/ignore", b"x" * 100_000) == b"ignored"  # body left unread by the app
    assert _ask(conn, "POST", "/echo", b"next") == b"next"  # the next request is read whole
    assert _ask(conn, "GET", "/chunks") == b"one two"  # no length: chunked, and the connection stays
    assert _ask(conn, "HEAD", "/echo") == b""
    assert _ask(conn, "PUT", "/echo", b"last") == b"last"
    assert len(server.server.kept_connections) == 1  # one connection for all five
    conn.close()


def test_a_stopped_server_answers_nothing_on_a_kept_connection(server: InThread) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    assert _ask(conn, "POST", "/echo", b"before") == b"before"
    server.stop()
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        _ask(conn, "POST", "/echo", b"after")
    conn.close()


@pytest.fixture()
def gcs() -> Iterator[Any]:
    from airflow_cloudtrain.emulator.gcp import GcsServer

    server = GcsServer()
    server.start()
    try:
        server.create_bucket("kept")
        yield server
    finally:
        server.stop()


def test_a_refused_gcs_request_keeps_the_connection_and_a_closing_answer_says_so(gcs: Any) -> None:
    """The GCS emulator refused a throttled request with a 429 and then closed the connection, which
    the 429 did not say: a client's next request on its pooled connection met the close ("Remote end
    closed connection without response", seen beside another suite). A refused request's connection
    now serves the next one; an answer after which the server does close says "Connection: close"."""
    port = int(gcs.endpoint.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    path = "/storage/v1/b/kept/o"
    gcs.throttle.set(1.0, "storage")
    conn.request("GET", path)
    refused = conn.getresponse()
    assert (refused.status, refused.getheader("Connection")) == (429, None)
    refused.read()
    gcs.throttle.set(0.0, "storage")
    conn.request("GET", path)  # the same connection
    answered = conn.getresponse()
    assert answered.status == 200 and b'"kind"' in answered.read()
    # a chunked upload is read by the package to its end: the server closes after it, and says so
    conn.putrequest("POST", "/upload/storage/v1/b/kept/o?uploadType=media&name=a.txt")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.putheader("Content-Type", "text/plain")
    conn.endheaders()
    conn.send(b"5\r\nhello\r\n0\r\n\r\n")
    uploaded = conn.getresponse()
    uploaded.read()
    assert uploaded.getheader("Connection") == "close", uploaded.getheaders()
    conn.close()

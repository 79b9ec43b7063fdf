"""The emulated Cloud Storage: ``gcp-storage-emulator`` (PyPI, BSD) served in-process on loopback.

The real ``google-cloud-storage`` client talks to it unchanged when ``STORAGE_EMULATOR_HOST`` points
at it (the client then also skips authentication)::

    server = GcsServer(); endpoint = server.start()        # "http://127.0.0.1:PORT"
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint           # or server.env()
    client = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials())

The package serves what the client uses (bucket create/get, media, multipart and resumable uploads,
``alt=media`` downloads with Range, delete, metadata), checked against the real client in
``tests/cloud/test_gce_emulator.py``. Two things are done here instead:

* Object listing: the package ignores ``maxResults``/``pageToken`` and ``startOffset``/``endOffset``;
  code that reads "objects after X" or pages would then see more than real GCS returns, so
  ``objects.list`` is answered here from the package's storage, with those parameters honoured
  (``maxResults`` counts items and prefixes together, as GCS does).
* Compose: the package concatenates the sources with ``bytes +=`` (quadratic: 2 min for a 4 GB
  checkpoint's parts, all under the storage lock), so ``objects.compose`` is answered by ``_compose``,
  the same answer built with one join (real GCS composes in constant time, server-side).
* Serving: its own ``Server`` takes a fixed port and one request at a time; here its request handler
  runs on a threaded server bound to port 0, with a lock around each request because its storage is
  not thread-safe (agents in separate processes upload logs while the operator polls).

Requests are counted per JSON API method (``objects.get``, ``objects.insert``, ``objects.list``, ...;
``counts()``), the emulator's own excluded, and a share of them can be refused as throttled
(``throttle.set(rate, api)``, see ``emulator.faults``): HTTP 429 ``rateLimitExceeded`` in GCS's JSON
error format, counted also as ``throttled:<method>``; a run folder's writes can be refused with a 503
or a 403 ``forbidden`` (``fail_writes``), counted as ``unavailable:`` / ``denied:<method>``.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import threading
from collections import deque
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from airflow_cloudtrain.emulator.faults import DENIED, THROTTLED, Throttle
from airflow_cloudtrain.emulator.gcp.rest import Tally, denied, unavailable
from airflow_cloudtrain.emulator.serving import InThread

_OBJECTS = re.compile(r"(?:/storage/v1)?/b/([-.\w]+)/o")
_THROTTLED = "The rate of requests exceeds the rate limit. Please reduce the rate of requests."


def gcs_method(method: str, path: str) -> str:
    """The JSON API method of a request (``GET /storage/v1/b/x/o/y`` -> ``objects.get``)."""
    path = path.split("?", 1)[0]
    if path.startswith("/batch/"):
        return "batch"
    if path.startswith("/upload/"):
        return "objects.insert"
    parts = [p for p in re.sub(r"^(?:/download)?(?:/storage/v1)?", "", path).split("/") if p]
    if parts[:1] != ["b"]:
        return f"storage.{method}"
    if len(parts) <= 2:
        names = {"GET": "get", "POST": "insert", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}
        return (
            "buckets.list" if len(parts) == 1 and method == "GET" else f"buckets.{names.get(method, method)}"
        )
    if len(parts) == 3:
        return "objects.list" if method == "GET" else "objects.insert"
    for verb in ("copyTo", "rewriteTo", "compose"):
        if verb in parts[3:]:
            return f"objects.{verb.removesuffix('To')}"
    names = {"GET": "get", "DELETE": "delete", "PATCH": "patch", "PUT": "update", "POST": "insert"}
    return f"objects.{names.get(method, method)}"


def _list_objects(storage: Any, bucket: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
    """``objects.list`` as GCS answers it, from the package's storage."""
    from gcp_storage_emulator.exceptions import BadRequest, NotFound

    def arg(key: str) -> str | None:
        return query.get(key, [None])[0]

    try:
        files, prefixes = storage.get_file_list(bucket, arg("prefix"), arg("delimiter"), arg("matchGlob"))
    except NotFound:
        return 404, {
            "error": {
                "code": 404,
                "message": "The specified bucket does not exist.",
                "errors": [
                    {
                        "message": "The specified bucket does not exist.",
                        "domain": "global",
                        "reason": "notFound",
                    }
                ],
            }
        }
    except BadRequest as exc:
        return 400, {
            "error": {
                "code": 400,
                "message": str(exc),
                "errors": [{"message": str(exc), "reason": "invalid"}],
            }
        }
    start, end = arg("startOffset") or "", arg("endOffset")
    after = base64.urlsafe_b64decode(arg("pageToken") or "").decode()
    entries = sorted([(f["name"], f) for f in files] + [(p, None) for p in prefixes], key=lambda e: e[0])
    entries = [e for e in entries if e[0] >= start and (end is None or e[0] < end) and e[0] > after]
    size = max(1, min(int(arg("maxResults") or 1000), 1000))
    chunk = entries[:size]
    out: dict[str, Any] = {
        "kind": "storage#objects",
        "items": [f for _, f in chunk if f is not None],
        "prefixes": [n for n, f in chunk if f is None],
    }
    if len(entries) > size:
        out["nextPageToken"] = base64.urlsafe_b64encode(chunk[-1][0].encode()).decode()
    return 200, out


def _compose(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """``objects.compose`` as the package answers it, its sources joined once (not ``+=`` each)."""
    from http import HTTPStatus

    from gcp_storage_emulator.exceptions import Conflict, NotFound
    from gcp_storage_emulator.handlers import objects

    bucket, name = request.params["bucket_name"], request.params["object_id"]
    try:
        sources = request.data["sourceObjects"]
        content_type = storage.get_file_obj(bucket, sources[0]["name"])["contentType"] if sources else None
        data = b"".join(storage.get_file(bucket, src["name"]) for src in sources)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    dest = objects._make_object_resource(
        request.base_url, bucket, name, content_type, len(data), request.data["destination"]
    )
    try:
        dest = objects._checksums(data, dest)
        storage.create_file(bucket, name, data, dest)
        response.json(dest)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
    except Conflict as err:
        objects._handle_conflict(response, err)


def _use_linear_compose() -> None:
    """Route ``objects.compose`` of the package's handler table to ``_compose`` (idempotent)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    for _, handlers in server.HANDLERS:
        if handlers.get(server.POST) is objects.compose:
            handlers[server.POST] = _compose


def _send_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class GcsServer:
    """A GCS JSON API emulator on 127.0.0.1 (random port); in memory unless ``data_dir`` is given."""

    def __init__(self, data_dir: str | Path | None = None, throttle: Throttle | None = None) -> None:
        self.data_dir = Path(data_dir).resolve() if data_dir else None
        self.throttle = throttle or Throttle()
        self.tally = Tally(self.throttle)  # own client -> throttle -> count, as every emulated Google API
        self.endpoint = ""
        self._serving: InThread | None = None
        self._storage: Any = None
        self._lock = threading.Lock()  # the package's storage is not thread-safe
        self.requests: deque[str] = deque(
            maxlen=1000
        )  # recent request lines, e.g. "POST /upload/...?uploadType=resumable"

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:``port`` (0: a free port)."""
        from gcp_storage_emulator.server import RequestHandler
        from gcp_storage_emulator.storage import Storage

        _use_linear_compose()
        # it logs every request at INFO and every read of a missing object (a normal poll) at ERROR
        logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)

        class NoMetadataFileInMemory(Storage):
            """The package rewrites one file holding every object's metadata, as indented JSON, on
            each write: O(objects) per write, 5 s at a 10,000-object bucket. In memory (how the
            emulator runs it) nothing reads that file back, so there it is not written."""

            def _write_config_to_file(self) -> None:
                if not self._use_memory_fs:
                    super()._write_config_to_file()

        self._storage = NoMetadataFileInMemory(
            use_memory_fs=self.data_dir is None, data_dir=str(self.data_dir or Path.cwd())
        )
        lock, seen, gcs = self._lock, self.requests, self

        class Handler(RequestHandler):
            def handle_one_request(self) -> None:  # one request per connection (HTTP/1.0)
                with lock:
                    super().handle_one_request()

            def parse_request(self) -> bool:  # headers read: count, maybe refuse as throttled
                if not super().parse_request():
                    return False
                return not gcs._throttled(self)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if m := _OBJECTS.fullmatch(url.path):
                    _send_json(self, *_list_objects(self.storage, m.group(1), parse_qs(url.query)))
                else:
                    super().do_GET()

            def log_request(self, code: Any = "-", size: Any = "-") -> None:
                seen.append(self.requestline.rsplit(" ", 1)[0])

        httpd = ThreadingHTTPServer(("127.0.0.1", port), partial(Handler, self._storage))
        httpd.daemon_threads = True
        self._serving = InThread(httpd, "gcs-emulator")
        self.endpoint = self._serving.endpoint
        return self.endpoint

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def _throttled(self, handler: BaseHTTPRequestHandler) -> bool:
        """Count the request; True (and the 429, or the 503 or 403 of a fault, sent) when it is refused."""
        method = gcs_method(handler.command, handler.path)
        body = None
        obj = None
        if self.throttle.wants_object(method):  # writes under a prefix fail: which object is this?
            body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
            obj = self._object_of(handler.path, body)
        fault = self.tally.admit(handler.headers, "storage", method, obj)
        if not fault:
            if body is not None:  # the package's handler reads the body it was sent
                handler.rfile = io.BytesIO(body)
            return False
        length = int(handler.headers.get("Content-Length") or 0)
        if length and body is None:
            handler.rfile.read(length)  # what the client sends, before answering
        if fault == THROTTLED:
            error = {"message": _THROTTLED, "domain": "usageLimits", "reason": "rateLimitExceeded"}
            _send_json(handler, 429, {"error": {"code": 429, "message": _THROTTLED, "errors": [error]}})
        elif fault == DENIED:  # a bucket policy or an IAM change took the write permission away
            _send_json(handler, 403, denied("storage.objects.create").body())
        else:
            _send_json(handler, 503, unavailable().body())
        handler.close_connection = True
        return True

    def _object_of(self, path: str, body: bytes) -> str | None:
        """``bucket/name`` of an object write: from the path (compose, copy and rewrite name their
        target there), the query (a media upload's ``name``), the metadata part of a multipart
        upload's body, or the session of a resumable upload's ``upload_id``."""
        url = urlparse(path)
        query = parse_qs(url.query)
        targets = re.findall(r"/b/([^/]+)/o(?:/([^/]+))?", url.path)
        if not targets:
            return None
        bucket, name = targets[-1]
        if name:
            return f"{bucket}/{unquote(name)}"
        if "name" in query:
            return f"{bucket}/{query['name'][0]}"
        if "upload_id" in query:
            session = self._storage.resumable.get(query["upload_id"][0]) or {}
            return f"{bucket}/{session['name']}" if session.get("name") else None
        found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body[:65536])
        if not found:
            return None
        name = json.loads(b'"' + found.group(1) + b'"')  # JSON escapes, as the client wrote them
        return f"{bucket}/{name}"

    def counts(self) -> dict[str, int]:
        """Requests per JSON API method since start or reset, the emulator's excluded."""
        return self.tally.counts()

    def reset_counts(self) -> None:
        self.tally.reset()

    def env(self) -> dict[str, str]:
        """The environment that points ``google-cloud-storage`` (and gcsfs, Airflow's GCSHook) here."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, name: str) -> None:
        """Create ``name`` if it does not exist (the emulated project's buckets are made up front)."""
        from gcp_storage_emulator.handlers.buckets import create_bucket

        if self._storage is None:
            raise RuntimeError("GcsServer is not started")
        with self._lock:
            create_bucket(name, self._storage)

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
  the same answer built with one join, or for a big object with no bytes copied (below).
* Big objects: in memory, objects larger than ``disk_threshold`` (4 MiB) are kept in files of a temp
  dir of the server, compose and copy hard-link them, ranged reads read only their range, and
  resumable uploads append to a file (``gcs_disk``): a 16 GB checkpoint needs disk, not memory.
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
from airflow_cloudtrain.emulator.gcp import gcs_disk
from airflow_cloudtrain.emulator.gcp.rest import Tally, denied, unavailable
from airflow_cloudtrain.emulator.serving import InThread, KeptConnection

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
        pieces = [storage.get_file(bucket, src["name"]) for src in sources]
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    concat = getattr(storage._store, "concat", None)
    if concat is not None and sum(len(p) for p in pieces) > storage._store.threshold:
        _compose_on_disk(request, response, storage, bucket, name, content_type, pieces)
        return
    data = b"".join(pieces)
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


def _compose_on_disk(
    request: Any, response: Any, storage: Any, bucket: str, name: str, content_type: Any, pieces: list[Any]
) -> None:
    """A big compose as GCS does it: no bytes read or copied (the sources' files hard-linked), the
    crc32c combined from theirs, no md5Hash (GCS gives composite objects none)."""
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    data = storage._store.concat(pieces)
    sources = [storage.get_file_obj(bucket, src["name"]) for src in request.data["sourceObjects"]]
    dest = objects._make_object_resource(
        request.base_url, bucket, name, content_type, len(data), request.data["destination"]
    )
    dest["crc32c"] = data.sums["crc32c"] = gcs_disk.composed_crc32c(
        [(meta["crc32c"], len(piece)) for meta, piece in zip(sources, pieces, strict=True)]
    )
    dest["etag"] = dest["crc32c"]
    dest.pop("md5Hash", None)
    try:
        storage.create_file(bucket, name, data, dest)
        response.json(dest)
    except NotFound:
        from http import HTTPStatus

        response.status = HTTPStatus.NOT_FOUND


def _download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """The package's ``objects.download``; a composite's md5 is computed for a whole-object GET."""
    from gcp_storage_emulator.handlers import objects

    whole = not request.get_header("range", None)
    objects.download(request, response, gcs_disk.Md5OnWholeReads(storage, whole), *args, **kwargs)


def _use_linear_compose() -> None:
    """Route ``objects.compose`` of the package's handler table to ``_compose``, and let its checksums
    stream big objects (idempotent)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    gcs_disk.checksum_patches(objects)
    for _, handlers in server.HANDLERS:
        if handlers.get(server.POST) is objects.compose:
            handlers[server.POST] = _compose
        if handlers.get(server.GET) is objects.download:
            handlers[server.GET] = _download


def _send_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class GcsServer:
    """A GCS JSON API emulator on 127.0.0.1 (random port); in memory (objects over ``disk_threshold``
    bytes in a temp dir, removed at ``stop``) unless ``data_dir`` is given (the package's own files)."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        throttle: Throttle | None = None,
        disk_threshold: int = gcs_disk.THRESHOLD,
    ) -> None:
        self.data_dir = Path(data_dir).resolve() if data_dir else None
        self.disk_threshold = disk_threshold
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
        from gcp_storage_emulator.storage import Storage, _FileStore

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

            def add_to_resumable_upload(
                self,
                file_id: str,
                content: bytes,
                total_size: int | None = None,
                expected_start: int | None = None,
            ) -> Any:
                """The package's, appending to a file instead of rewriting the whole upload."""
                if not hasattr(self._store, "append"):
                    return super().add_to_resumable_upload(file_id, content, total_size, expected_start)
                from gcp_storage_emulator.exceptions import BadRequest
                from gcp_storage_emulator.storage import RESUMABLE_DIR

                rel = self._object_path(RESUMABLE_DIR, self.safe_id(file_id))
                received = self.get_resumable_byte_count(file_id)
                if expected_start is not None and expected_start != received:
                    raise BadRequest(
                        f"Invalid Content-Range start: expected {received}, got {expected_start}"
                    )
                data = self._store.append(rel, content or b"")
                if total_size is None or len(data) < total_size:
                    return None
                return data if len(data) == total_size else self._store.truncate(rel, total_size)

        self._storage = NoMetadataFileInMemory(
            use_memory_fs=self.data_dir is None, data_dir=str(self.data_dir or Path.cwd())
        )
        if self.data_dir is None:
            self._storage._store = gcs_disk.disk_store(_FileStore, self.disk_threshold)
        lock, seen, gcs = self._lock, self.requests, self

        class Handler(KeptConnection, RequestHandler):
            # HTTP/1.1 kept connections, as the other emulators (``serving.keep_alive_handler`` says
            # why): the package's answers all carry Content-Length; the lock is taken once the next
            # request has begun (an idle kept connection must not hold it)
            rfile: Any

            def setup(self) -> None:
                super().setup()
                self.wfile: Any = gcs_disk.StreamingWriter(self.wfile)  # a big object's GET, in pieces

            def handle_one_request(self) -> None:
                self.connection_rfile = self.rfile
                try:  # the next request's first byte, outside the lock: a kept connection may idle
                    if not self.rfile.peek(1):
                        self.close_connection = True
                        return
                except OSError:
                    self.close_connection = True
                    return
                try:
                    with lock:
                        super().handle_one_request()
                finally:  # the body, as the package and _throttled read it, ends here
                    body, self.rfile = self.rfile, self.connection_rfile
                    if body is not self.rfile and not self.close_connection:
                        self.drain(body)

            def parse_request(self) -> bool:  # headers read: count, maybe refuse as throttled
                if not super().parse_request():
                    return False
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    self.close_connection = True  # read by the package to its end: no next request
                else:  # the package reads Content-Length bytes, or none: the rest is drained after
                    self.rfile = self.limited_body(self.rfile, self.headers.get("Content-Length"))
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
        close = getattr(getattr(self._storage, "_store", None), "close", None)
        if close is not None:
            close()  # the big objects' files go with the server

    def on_disk(self, bucket: str, name: str) -> bool:
        """Whether ``bucket/name`` is kept in files (over ``disk_threshold``), not in memory."""
        store = self._storage._store
        return isinstance(store._files.get(f"{bucket}/{name}"), gcs_disk.DiskBlob)

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
        # the connection stays open: its body was read, so the next request line is what comes next (a
        # close here, after an answer that did not say so, raced the client's next request on it)
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

"""The emulated instances' metadata services (AWS IMDSv2 and GCE), one local server for all of them.

Each emulated instance gets its own path prefix (``/<instance-id>``), handed to its agent the standard
way (``AWS_EC2_METADATA_SERVICE_ENDPOINT`` = ``endpoint_for(id)``, ``GCE_METADATA_HOST`` =
``gce_host_for(id)``), so the agent makes the same requests it makes on a real instance. The server
enforces what the real ones enforce and our code must cope with: IMDSv2 session tokens (tokens are
required on our instances) and the ``Metadata-Flavor: Google`` header. The emulator injects spot
notices and preemptions through ``set_spot_action`` / ``set_preempted``, and each instance's private address (``set_address``).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import threading
import time
import zlib
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from airflow_cloudtrain.emulator.serving import InThread

AWS_NOTICE_S = 120.0  # AWS gives two minutes' notice


class _InstanceState:
    def __init__(self) -> None:
        self.spot_action: tuple[str, float] | None = None
        self.preempted = False
        self.maintenance_event = "NONE"
        self.project: str | None = None  # a GCE VM's project and zone (``describe_vm``)
        self.zone: str | None = None
        self.address: str | None = None  # the private address (``emulator.addresses``)
        self.tokens: dict[str, float] = {}  # token -> expiry (unix time)


_DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class _QuietServer(ThreadingHTTPServer):
    """An instance ends mid-request all the time (its agent killed with it): the client is gone, nobody
    is left to answer, and that is no error worth a traceback on the emulator's console."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], _DISCONNECTS):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class MetadataServer:
    """A threaded HTTP server on 127.0.0.1 (random port) serving every emulated instance's metadata."""

    def __init__(self, host: str = "127.0.0.1", region: str = "us-east-1") -> None:
        self.host = host
        self.region = region
        self._lock = threading.Lock()
        self._instances: dict[str, _InstanceState] = {}
        self._serving: InThread | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, port: int = 0) -> MetadataServer:
        """Serve on ``host``:``port`` (0: a free port)."""
        if self._serving is None:
            httpd = _QuietServer((self.host, port), _make_handler(self))
            self._serving = InThread(httpd, "cloudtrain-metadata")
        return self

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def __enter__(self) -> MetadataServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._serving is None:
            raise RuntimeError("MetadataServer is not started")
        return self._serving.port

    def endpoint_for(self, instance_id: str) -> str:
        """The instance's IMDS base URL (``AWS_EC2_METADATA_SERVICE_ENDPOINT``)."""
        return f"http://{self.host}:{self.port}/{instance_id}"

    def gce_host_for(self, instance_id: str) -> str:
        """The instance's ``GCE_METADATA_HOST`` value: host, port and prefix, no scheme."""
        return f"{self.host}:{self.port}/{instance_id}"

    # -- what the emulator injects -------------------------------------------------------------------
    def _state(self, instance_id: str) -> _InstanceState:
        with self._lock:
            return self._instances.setdefault(instance_id, _InstanceState())

    def set_spot_action(self, instance_id: str, action: str = "terminate", at: float | None = None) -> None:
        """Announce a spot interruption (``terminate``/``stop``/``hibernate``) happening at ``at``."""
        self._state(instance_id).spot_action = (action, time.time() + AWS_NOTICE_S if at is None else at)

    def set_preempted(self, instance_id: str) -> None:
        self._state(instance_id).preempted = True

    def set_maintenance_event(self, instance_id: str, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        self._state(instance_id).maintenance_event = event

    def describe_vm(self, instance_id: str, project: str, zone: str) -> None:
        """A GCE VM's ``project/project-id`` and ``instance/zone`` (any project: the VM's own)."""
        state = self._state(instance_id)
        state.project, state.zone = project, zone

    def set_address(self, instance_id: str, address: str | None) -> None:
        """The instance's private address: IMDS ``local-ipv4``, GCE ``network-interfaces/0/ip``."""
        self._state(instance_id).address = address

    def clear(self, instance_id: str) -> None:
        """Forget notices (and tokens) of an instance, e.g. when its id is reused by a test."""
        with self._lock:
            self._instances.pop(instance_id, None)

    # -- answers -------------------------------------------------------------------------------------
    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str, str]:
        """(status, content type, body) for one request; the handler only does the HTTP around it."""
        instance_id, _, rest = path.split("?", 1)[0].lstrip("/").partition("/")
        if not instance_id:
            return 404, "text/plain", "not found"
        rest = "/" + rest
        state = self._state(instance_id)
        if rest.startswith("/latest/"):
            return self._aws(method, rest, headers, instance_id, state)
        if rest.startswith("/computeMetadata/v1/"):
            return self._gce(method, rest, headers, instance_id, state)
        return 404, "text/plain", "not found"

    def _aws(
        self, method: str, rest: str, headers: dict[str, str], instance_id: str, state: _InstanceState
    ) -> tuple[int, str, str]:
        if rest == "/latest/api/token":
            if method != "PUT":
                return 405, "text/plain", "method not allowed"
            try:
                ttl = int(headers.get("x-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                return 400, "text/plain", "missing or invalid X-aws-ec2-metadata-token-ttl-seconds"
            if not 1 <= ttl <= 21600:
                return 400, "text/plain", "token ttl must be 1..21600"
            session = secrets.token_urlsafe(32)
            with self._lock:
                state.tokens[session] = time.time() + ttl
            return 200, "text/plain", session
        if method != "GET":
            return 405, "text/plain", "method not allowed"
        with self._lock:
            expiry = state.tokens.get(headers.get("x-aws-ec2-metadata-token", ""), 0.0)
        if expiry < time.time():
            return 401, "text/plain", "unauthorized"
        if rest == "/latest/meta-data/instance-id":
            return 200, "text/plain", instance_id
        if rest == "/latest/meta-data/placement/region":
            return 200, "text/plain", self.region
        if rest.rstrip("/") == "/latest/meta-data/placement/availability-zone":  # botocore asks with a slash
            return 200, "text/plain", self.region + "a"
        if rest == "/latest/meta-data/local-ipv4" and state.address:
            return 200, "text/plain", state.address
        if rest == "/latest/meta-data/spot/instance-action" and state.spot_action:
            action, at = state.spot_action
            when = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, "application/json", json.dumps({"action": action, "time": when})
        return 404, "text/plain", "not found"

    def _gce(
        self, method: str, rest: str, headers: dict[str, str], instance_id: str, state: _InstanceState
    ) -> tuple[int, str, str]:
        if headers.get("metadata-flavor") != "Google":
            return 403, "text/plain", "Missing Metadata-Flavor:Google header."
        if method != "GET":
            return 405, "text/plain", "method not allowed"
        values = {
            "preempted": "TRUE" if state.preempted else "FALSE",
            "maintenance-event": state.maintenance_event,
            "name": instance_id,
            "id": str(zlib.crc32(instance_id.encode()) * 1000003 + 7),  # stable and numeric, like GCE's
        }
        if state.address:
            values["network-interfaces/0/ip"] = state.address
        if state.zone:  # the real server writes the project number where we write the id
            values["zone"] = f"projects/{state.project}/zones/{state.zone}"
        prefix = "/computeMetadata/v1/instance/"
        value = values.get(rest[len(prefix) :]) if rest.startswith(prefix) else None
        if rest == "/computeMetadata/v1/project/project-id":
            value = state.project
        if value is None:
            return 404, "text/plain", "not found"
        return 200, "application/text", value


def _make_handler(server: MetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _respond(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, content_type, body = server.answer(self.command, self.path, headers)
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if content_type == "application/text":
                self.send_header("Metadata-Flavor", "Google")
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = _respond

        def handle(self) -> None:
            # the client went away mid-request (an agent killed, a timeout): nobody to answer, no traceback
            with contextlib.suppress(*_DISCONNECTS):
                super().handle()

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: agents poll every few seconds

    return Handler

"""The one request pipeline of the emulated Google REST APIs (Compute Engine with the Billing Catalog,
Pub/Sub with Monitoring, Secret Manager, Vertex AI with Logging), so that every server meets a client
the same way:

    route (method + path) -> own client? -> record -> throttle -> count -> dispatch -> JSON, or Google's JSON error

* Route: a werkzeug ``Map`` whose endpoints are the API's method names (``instances.list``). A request
  no rule matches is answered by ``unknown_route`` (a 404 in the API's own words), never counted.
* Own client: requests whose ``User-Agent`` or ``x-goog-api-client`` carries ``cloudtrain-emulator`` are
  the emulator's own polling: neither throttled nor counted (``faults.is_own``). The REST transports of
  the GAPIC clients put their ``client_info`` user agent in ``x-goog-api-client``, so both are read.
* Record: which side (``emulator.calls.google_side``) called which method, for the permission documents.
* Faults: ``Throttle.draw(service, method)``; a hit is counted under ``<fault>:<method>`` too and
  answered with ``throttled(service)`` (HTTP 429) or ``unavailable()`` (HTTP 503) before anything
  is done.
* Dispatch: ``handle(op, request, args)``; by default the JSON body is parsed (400 when it is not an
  object) and ``_h_<op with . as _>(request, body, **args)`` answers.
* Errors: a ``GoogleError`` (or one of ``invalid_errors``, as a 400) becomes its JSON body,
  ``{"error": {"code", "message", ["errors"], "status", ["details"]}}``, the keys in that order.

``GcsServer`` wraps a package's own HTTP handler, so it shares only the own-client/throttle/count step
(``Tally``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from airflow_cloudtrain.emulator import calls
from airflow_cloudtrain.emulator.faults import THROTTLED, Throttle, is_own
from airflow_cloudtrain.emulator.serving import InThread, json_body, keep_alive_handler

__all__ = ["STATUS", "GoogleError", "GoogleRestServer", "Tally"]

# HTTP status -> the canonical ``error.status`` Google's APIs pair with it
STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
WsgiStart = Callable[..., Any]


class GoogleError(Exception):
    """An HTTP error in Google's JSON shape. ``status`` defaults to the code's canonical one;
    ``errors`` (the Compute and Storage APIs' ``[{message, domain, reason}]``) and ``details``
    (``google.rpc`` details such as ErrorInfo) appear only when given."""

    def __init__(
        self,
        code: int,
        message: str,
        status: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.status = status or STATUS.get(code, "UNKNOWN")
        self.errors, self.details = errors or [], details or []

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.errors:
            error["errors"] = self.errors
        error["status"] = self.status
        if self.details:
            error["details"] = self.details
        return {"error": error}


class Tally:
    """Requests per API method since start or reset, the emulator's own excluded, and the throttle's
    draw for each: the own-client -> throttle -> count step every emulated Google API takes."""

    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def admit(
        self, headers: Mapping[str, str] | Any, service: str, op: str, obj: str | None = None
    ) -> str | None:
        """Count one request (unless it is the emulator's own); the fault it is to be refused with
        (``faults.THROTTLED`` or ``UNAVAILABLE``, then counted under ``<fault>:<op>`` too), or None.
        ``obj``: the ``bucket/name`` a write goes to (``Throttle.fail_writes``)."""
        if is_own(headers.get("User-Agent"), headers.get("x-goog-api-client")):
            return None
        side = calls.google_side(headers.get("Host"))
        calls.record("gcp", side, service, op)  # (``emulator.calls``)
        fault = self.throttle.draw(service, op, obj, side)
        with self._lock:
            self._counts[op] += 1
            if fault:
                self._counts[f"{fault}:{op}"] += 1
        return fault

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


def unavailable() -> GoogleError:
    """A Google API's 503 (``backendError``), what a request gets while the service has bad minutes."""
    message = "The service is currently unavailable."
    return GoogleError(
        503, message, errors=[{"message": message, "domain": "global", "reason": "backendError"}]
    )


def denied(permission: str) -> GoogleError:
    """A Google API's 403 (``forbidden``), what a request gets once an IAM change or a bucket policy
    took ``permission`` away (``Throttle.fail_writes(kind=DENIED)``)."""
    message = (
        f"cloudtrain-emulated@cloudtrain-emulated.iam.gserviceaccount.com does not have {permission} "
        f"access to the Google Cloud Storage object. Permission '{permission}' denied on resource "
        "(or it may not exist)."
    )
    return GoogleError(403, message, errors=[{"message": message, "domain": "global", "reason": "forbidden"}])


class GoogleRestServer:
    """A Google REST API on 127.0.0.1 (random port) in a daemon thread: the pipeline of the module doc.

    A server names its ``service`` (the throttle's selector; ``services`` for methods of a second API it
    serves on the same port), gives its rules to ``__init__``, answers ``throttled`` and
    ``unknown_route`` in the API's words, and implements ``_h_<op>`` handlers (or ``handle``)."""

    service: ClassVar[str] = ""
    services: ClassVar[dict[str, str]] = {}  # method -> service, for methods of another API
    invalid_errors: ClassVar[tuple[type[Exception], ...]] = ()  # rendered as 400 INVALID_ARGUMENT
    thread_name: ClassVar[str] = "google-emulator"

    def __init__(self, rules: Iterable[Rule], throttle: Throttle | None = None) -> None:
        self.throttle = throttle or Throttle()
        self.endpoint = ""
        self.tally = Tally(self.throttle)
        self._routes = Map(list(rules))
        self._serving: InThread | None = None

    # --- what a server says in its API's words ---------------------------------------------------

    def throttled(self, service: str) -> GoogleError:
        """The 429 of a request refused as throttled."""
        host = f"{service}.googleapis.com"
        return GoogleError(
            429,
            f"Quota exceeded for quota metric '{host}/requests' and limit 'requests per minute' "
            f"of service '{host}'.",
        )

    def unknown_route(self, request: Request, exc: HTTPException) -> GoogleError:
        """The answer to a request no rule matches."""
        return GoogleError(404, f"Requested entity was not found. ({request.method} {request.path})")

    def handle(self, op: str, request: Request, args: dict[str, Any]) -> Any:
        """Answer one admitted request: ``_h_<op>(request, body, **args)``."""
        body = json_body(request, lambda message: GoogleError(400, message))
        return getattr(self, "_h_" + op.replace(".", "_"))(request, body, **args)

    # --- lifecycle and counts --------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:``port`` (0: a free port)."""
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the task log
        server = make_server(
            "127.0.0.1", port, self._wsgi, threaded=True, request_handler=keep_alive_handler()
        )
        self._serving = InThread(server, self.thread_name)
        self.endpoint = self._serving.endpoint
        return self.endpoint

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

    def counts(self) -> dict[str, int]:
        """Requests per API method since start or reset, the emulator's own excluded;
        ``throttled:<method>`` counts those of them refused as throttled."""
        return self.tally.counts()

    def reset_counts(self) -> None:
        self.tally.reset()

    # --- the pipeline ----------------------------------------------------------------------------

    def _wsgi(self, environ: dict[str, Any], start_response: WsgiStart) -> Any:
        request = Request(environ)
        request.get_data()  # read the body whatever the answer: the client is still sending it
        try:
            try:
                op, args = self._routes.bind_to_environ(environ).match()
            except HTTPException as exc:
                raise self.unknown_route(request, exc) from exc
            service = self.services.get(op, self.service)
            fault = self.tally.admit(request.headers, service, op)
            if fault == THROTTLED:
                raise self.throttled(service)
            if fault:
                raise unavailable()
            status, out = 200, self.handle(op, request, dict(args))
        except GoogleError as exc:
            status, out = exc.code, exc.body()
        except self.invalid_errors as exc:
            status, out = 400, GoogleError(400, str(exc)).body()
        payload = json.dumps(out).encode()
        return Response(payload, status, content_type="application/json; charset=UTF-8")(
            environ, start_response
        )

"""Transient storage errors, told apart from real ones, and one retry loop for the writes that matter.

The agent talks to S3 / GCS for everything, and both answer a busy bucket with throttling (S3
``503 SlowDown``, GCS ``429`` / ``503``) that goes away if asked again a little later. The S3 client
already retries those itself (``storage.S3_RETRIES``: standard mode, 10 retries), and heartbeats and
log chunks are simply tried again on their next round. What the run cannot afford to lose (reading
the spec and the code at start, uploading results, the final log flush and the FINAL status) goes
through ``retry``: exponential backoff with jitter for a few minutes, for transient errors only. A
missing object, a denied permission or a bug fails at once.

``is_transient`` is the one place that classification lives. It imports nothing but the stdlib (the
agent zip must import without the SDKs' exception modules), so it recognises errors by shape:

- botocore ``ClientError`` (anything with ``response = {"Error": {"Code": ...}, "ResponseMetadata":
  {"HTTPStatusCode": ...}}``): a throttling / service-side code, or HTTP 429 / 500 / 502 / 503 / 504;
- ``google.api_core.exceptions`` by class name: ``TooManyRequests``, ``ServiceUnavailable``,
  ``InternalServerError``, ``BadGateway``, ``GatewayTimeout`` (or such an HTTP ``code``);
- connection errors and timeouts: the builtin ``ConnectionError`` / ``TimeoutError`` families,
  botocore's ``EndpointConnectionError`` / ``ConnectTimeoutError`` / ``ReadTimeoutError`` / ...,
  requests' and urllib3's equivalents, google-auth's ``TransportError``;
- wrappers are looked through: boto3's ``S3UploadFailedError`` (raised while handling the
  ``ClientError``), ``RetriesExceededError.last_exception``, api_core's ``RetryError.cause``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("cloudtrain.agent")

T = TypeVar("T")

# Error codes (S3, and AWS APIs generally) that mean "busy or briefly broken: ask again".
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "OperationAborted",
    }
)
TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})

# Class names (anywhere in the exception's MRO) that are transient / never transient.
_TRANSIENT_CLASSES = frozenset(
    {
        # google.api_core.exceptions
        "TooManyRequests",
        "ServiceUnavailable",
        "InternalServerError",
        "BadGateway",
        "GatewayTimeout",
        "DeadlineExceeded",
        # botocore.exceptions (its ConnectionError is not the builtin one)
        "ConnectionError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ResponseStreamingError",
        "IncompleteReadError",
        # requests / urllib3 / http.client / google-auth
        "Timeout",
        "ConnectTimeout",
        "ReadTimeout",
        "ChunkedEncodingError",
        "ProtocolError",
        "NewConnectionError",
        "IncompleteRead",
        "TransportError",
    }
)
_PERMANENT_CLASSES = frozenset(
    {"NotFound", "Forbidden", "PermissionDenied", "Unauthorized", "Unauthenticated", "BadRequest"}
)


def causes(err: BaseException) -> list[BaseException]:
    """``err`` and what it wraps, outermost first (bounded, no cycles)."""
    chain: list[BaseException] = []
    todo: list[BaseException | None] = [err]
    while todo and len(chain) < 8:
        current = todo.pop(0)
        if current is None or any(current is seen for seen in chain):
            continue
        chain.append(current)
        todo.append(current.__cause__)
        if not current.__suppress_context__:
            todo.append(current.__context__)
        for attr in ("last_exception", "cause"):  # boto3/s3transfer RetriesExceededError, api_core RetryError
            inner = getattr(current, attr, None)
            if isinstance(inner, BaseException):
                todo.append(inner)
    return chain


def _verdict(err: BaseException) -> bool | None:
    """True / False when ``err`` itself decides, None to look at what it wraps."""
    response = getattr(err, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        code = str((response.get("Error") or {}).get("Code") or "")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return code in TRANSIENT_CODES or status in TRANSIENT_HTTP or code in {str(s) for s in TRANSIENT_HTTP}
    names = {cls.__name__ for cls in type(err).__mro__}
    if names & _PERMANENT_CLASSES:
        return False
    if names & _TRANSIENT_CLASSES:
        return True
    if isinstance(err, (ConnectionError, TimeoutError)):  # resets, refusals, broken pipes, socket timeouts
        return True
    status_code: object = getattr(err, "code", None)  # api_core's HTTP status, urllib's HTTPError
    if isinstance(status_code, int) and not isinstance(status_code, bool) and 400 <= status_code < 600:
        return status_code in TRANSIENT_HTTP
    return None


def is_transient(err: BaseException) -> bool:
    """Whether asking again later may well succeed (throttling, 5xx, a dropped connection)."""
    for link in causes(err):
        verdict = _verdict(link)
        if verdict is not None:
            return verdict
    return False


def backoff(
    attempt: int, base_s: float = 0.5, cap_s: float = 15.0, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1): doubling, capped, jittered.

    "Equal jitter": between half and all of ``min(cap_s, base_s * 2 ** (attempt - 1))``, so many agents
    throttled at once spread out, yet each still backs off.
    """
    ceiling = min(cap_s, base_s * 2 ** min(attempt - 1, 30))
    return ceiling * (0.5 + 0.5 * rand())


def retry(
    fn: Callable[[], T],
    *,
    budget_s: float = 180.0,
    base_s: float = 0.5,
    cap_s: float = 15.0,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    what: str = "",
) -> T:
    """``fn()``, tried again after transient errors until ``budget_s`` seconds have gone by.

    A non-transient error is raised at once; a transient one is raised when the next wait would end
    past the budget (time spent inside ``fn`` counts too). ``what`` names the call in the log lines.
    """
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as err:
            if not is_transient(err):
                raise
            delay = backoff(attempt, base_s, cap_s)
            spent = clock() - started
            if spent + delay > budget_s:
                log.warning(
                    "%s: giving up after %d tries in %.0f s: %s: %s",
                    what or "storage call",
                    attempt,
                    spent,
                    type(err).__name__,
                    err,
                )
                raise
            log.warning(
                "%s: transient error (try %d), again in %.1f s: %s: %s",
                what or "storage call",
                attempt,
                delay,
                type(err).__name__,
                err,
            )
            sleep(delay)

"""``agent.retry``: which storage errors are transient, and the backoff loop around the calls the agent
cannot afford to lose. Errors are the real ones where the SDKs are installed (botocore's
``ClientError``, boto3's ``S3UploadFailedError``, google-api-core's exceptions) and look-alikes of the
same shape otherwise; the module itself must import with the stdlib alone."""

from __future__ import annotations

import http.client
import subprocess
import sys
import urllib.error
from collections.abc import Callable

import pytest
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from google.api_core import exceptions as gexc

from airflow_cloudtrain.contract import retry as retry_module
from airflow_cloudtrain.contract.retry import backoff, is_transient, retry


def client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, op
    )


class FakeClientError(Exception):
    """Shaped like botocore's, without botocore."""

    def __init__(self, code: str, status: int | None = None) -> None:
        super().__init__(code)
        meta = {} if status is None else {"HTTPStatusCode": status}
        self.response = {"Error": {"Code": code}, "ResponseMetadata": meta}


def upload_failed(inner: BaseException) -> S3UploadFailedError:
    """boto3 raises S3UploadFailedError while handling the ClientError (so only __context__ has it)."""
    try:
        try:
            raise inner
        except ClientError as err:
            raise S3UploadFailedError(f"Failed to upload a to b/c: {err}")  # noqa: B904
    except S3UploadFailedError as wrapped:
        return wrapped


TRANSIENT = [
    client_error("SlowDown", 503),
    client_error("Throttling", 400),
    client_error("ThrottlingException", 400),
    client_error("RequestLimitExceeded", 503),
    client_error("TooManyRequests", 429),
    client_error("InternalError", 500),
    client_error("ServiceUnavailable", 503),
    client_error("RequestTimeout", 400),
    client_error("503", 503, "HeadObject"),  # HEAD errors carry the status as the code
    client_error("SomethingNew", 502),
    client_error("SomethingNew", 504),
    FakeClientError("SlowDown"),
    FakeClientError("Whatever", 500),
    upload_failed(client_error("SlowDown", 503)),
    RetriesExceededError(ReadTimeoutError(endpoint_url="http://s3")),
    EndpointConnectionError(endpoint_url="http://s3"),
    ConnectTimeoutError(endpoint_url="http://s3"),
    ReadTimeoutError(endpoint_url="http://s3"),
    gexc.TooManyRequests("slow down"),
    gexc.ServiceUnavailable("busy"),
    gexc.InternalServerError("oops"),
    gexc.BadGateway("bad gateway"),
    gexc.GatewayTimeout("timeout"),
    gexc.RetryError("deadline exceeded", gexc.ServiceUnavailable("busy")),
    ConnectionResetError(104, "reset by peer"),
    ConnectionRefusedError(111, "refused"),
    BrokenPipeError(),
    TimeoutError("timed out"),
    http.client.RemoteDisconnected("closed"),
    http.client.IncompleteRead(b"partial"),
    urllib.error.HTTPError("http://x", 503, "busy", {}, None),  # type: ignore[arg-type]
]

PERMANENT = [
    client_error("NoSuchKey", 404, "GetObject"),
    client_error("404", 404, "HeadObject"),
    client_error("NoSuchBucket", 404),
    client_error("AccessDenied", 403),
    client_error("403", 403, "HeadObject"),
    client_error("InvalidAccessKeyId", 403),
    client_error("ExpiredToken", 400),
    client_error("InvalidRequest", 400),
    FakeClientError("AccessDenied", 403),
    FakeClientError("Nothing"),
    upload_failed(client_error("AccessDenied", 403)),
    gexc.NotFound("no such object"),
    gexc.Forbidden("denied"),
    gexc.Unauthorized("who are you"),
    gexc.BadRequest("bad"),
    gexc.RetryError("deadline exceeded", gexc.Forbidden("denied")),
    NoCredentialsError(),
    ParamValidationError(report="bad param"),
    urllib.error.HTTPError("http://x", 404, "missing", {}, None),  # type: ignore[arg-type]
    FileNotFoundError(2, "no such file"),
    PermissionError(13, "denied"),
    OSError(28, "no space left on device"),
    ValueError("bug"),
    RuntimeError("no spec.json in s3://b/r"),
    KeyError("x"),
]


@pytest.mark.parametrize("err", TRANSIENT, ids=lambda e: f"{type(e).__name__}-{e}"[:60])
def test_transient(err: BaseException) -> None:
    assert is_transient(err)


@pytest.mark.parametrize("err", PERMANENT, ids=lambda e: f"{type(e).__name__}-{e}"[:60])
def test_not_transient(err: BaseException) -> None:
    assert not is_transient(err)


def test_explicit_cause_is_followed_and_suppressed_context_is_not() -> None:
    try:
        raise RuntimeError("wrapped") from client_error("SlowDown", 503)
    except RuntimeError as err:
        assert is_transient(err)
    try:
        try:
            raise client_error("SlowDown", 503)
        except ClientError:
            raise RuntimeError("unrelated") from None
    except RuntimeError as err:
        assert not is_transient(err)


def test_cycles_in_the_chain_end() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert not is_transient(a)


class Clock:
    """A fake monotonic clock that the fake sleep advances; ``cost`` is what each call of fn takes."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(
    errors: list[BaseException], result: object = "ok", clock: Clock | None = None, cost: float = 0.0
) -> tuple[Callable[[], object], list[int]]:
    calls = [0]

    def fn() -> object:
        calls[0] += 1
        if clock is not None:
            clock.now += cost
        if errors:
            raise errors.pop(0)
        return result

    return fn, calls


def test_retry_rides_out_throttling() -> None:
    clock = Clock()
    fn, calls = failing([client_error("SlowDown", 503)] * 4, result={"x": 1})
    assert retry(fn, sleep=clock.sleep, clock=clock) == {"x": 1}
    assert calls[0] == 5 and len(clock.sleeps) == 4
    # doubling, jittered between half and all of the step: 0.5, 1, 2, 4
    for attempt, slept in enumerate(clock.sleeps, 1):
        step = 0.5 * 2 ** (attempt - 1)
        assert step / 2 <= slept <= step


def test_retry_first_try_success_does_not_sleep() -> None:
    clock = Clock()
    assert retry(lambda: 7, sleep=clock.sleep, clock=clock) == 7 and clock.sleeps == []


def test_retry_raises_permanent_errors_at_once() -> None:
    clock = Clock()
    fn, calls = failing([client_error("AccessDenied", 403)])
    with pytest.raises(ClientError, match="AccessDenied"):
        retry(fn, sleep=clock.sleep, clock=clock)
    assert calls[0] == 1 and clock.sleeps == []


def test_retry_gives_up_within_the_budget() -> None:
    clock = Clock()
    fn, calls = failing([gexc.TooManyRequests("busy")] * 1000)
    with pytest.raises(gexc.TooManyRequests):
        retry(fn, budget_s=180, base_s=0.5, cap_s=15, sleep=clock.sleep, clock=clock)
    assert sum(clock.sleeps) <= 180 and sum(clock.sleeps) > 180 - 15  # used (nearly) all of it
    assert max(clock.sleeps) <= 15  # capped
    assert 12 < calls[0] < 40  # a few minutes of tries, not a hammering


def test_retry_counts_time_spent_in_the_calls() -> None:
    clock = Clock()
    fn, calls = failing([ConnectionResetError()] * 100, clock=clock, cost=50.0)  # each try hangs 50 s
    with pytest.raises(ConnectionResetError):
        retry(fn, budget_s=180, sleep=clock.sleep, clock=clock)
    assert calls[0] <= 4 and clock.now - 100 <= 180 + 50


def test_retry_zero_budget_is_one_try() -> None:
    clock = Clock()
    fn, calls = failing([client_error("SlowDown", 503)])
    with pytest.raises(ClientError):
        retry(fn, budget_s=0, sleep=clock.sleep, clock=clock)
    assert calls[0] == 1


def test_retry_logs_what_it_does(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    fn, _ = failing([client_error("SlowDown", 503)])
    with caplog.at_level("WARNING", logger="cloudtrain.agent"):
        retry(fn, sleep=clock.sleep, clock=clock, what="final status")
    assert "final status: transient error (try 1)" in caplog.text and "SlowDown" in caplog.text


def test_backoff_is_capped_and_jittered() -> None:
    assert backoff(1, 0.5, 15, rand=lambda: 0.0) == 0.25 and backoff(1, 0.5, 15, rand=lambda: 1.0) == 0.5
    assert backoff(100, 0.5, 15, rand=lambda: 1.0) == 15 and backoff(100, 0.5, 15, rand=lambda: 0.0) == 7.5


def test_retry_module_is_stdlib_only() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('r', {retry_module.__file__!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('botocore', 'boto3', 'google', 'airflow')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-S", "-c", code], check=True, timeout=60)

"""The lifecycle's pure parts: records round-trip, the ledger's order and write-ahead, the retry policy."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.ledger import (
    KINDS,
    STORE_KEY,
    ResourceKind,
    ResourceLedger,
    register_kind,
)
from airflow_cloudtrain.core.records import Attempt, LaunchRecord, Outcome
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry, is_transient
from airflow_cloudtrain.lifecycle.prepare import hard_stop_s
from airflow_cloudtrain.operators.config import DEFAULT_MAX_RUNTIME_S, parse_max_runtime


class Store:
    """task_state_store's get/set/delete, in memory; counts writes."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.writes = 0

    def get(self, key: str) -> Any:
        return json.loads(json.dumps(self.data.get(key)))

    def set(self, key: str, value: Any) -> None:
        self.writes += 1
        self.data[key] = json.loads(json.dumps(value))  # plain JSON only, as the real store

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


class FakeCloud:
    """Instances by tag for the sweep; records terminate calls."""

    def __init__(self, tagged: list[Instance]) -> None:
        self.tagged = tagged

    def find(self, digest: str, ended: bool = False) -> list[Instance]:
        return list(self.tagged)


class Backend:
    def __init__(self, tagged: list[Instance] | None = None) -> None:
        self.cloud = FakeCloud(tagged or [])
        self.terminated: list[list[tuple[str, str | None]]] = []
        self.deleted: list[tuple[str, list[str]]] = []

    def location(self, zone: str | None) -> str | None:
        return "us-east-1"

    def terminate_instances(self, pairs: list[tuple[str, str | None]]) -> None:
        self.terminated.append(pairs)


@pytest.fixture(autouse=True)
def test_group_kind() -> Any:
    """A second resource kind, as later operators register (groups, queues...), for these tests only."""
    kind = register_kind(
        ResourceKind(
            "test_group",
            find=lambda backend, digest: [],
            delete=lambda backend, rs: backend.deleted.append(("test_group", [r.id for r in rs])),
        )
    )
    yield kind
    KINDS.pop("test_group", None)


def inst(iid: str, state: str = "running") -> Instance:
    return Instance(iid, state, "t3.small", "us-east-1a", False)


def test_records_round_trip_through_json() -> None:
    launch = LaunchRecord(
        "ct-1",
        "s3://b/r",
        "ec2spot",
        "us-east-1",
        "i-1",
        "t3.small",
        "us-east-1a",
        True,
        0.0123,
        1.5e9,
        failover=[["t3.micro", "us-east-1", "InsufficientInstanceCapacity"]],
    )
    outcome = Outcome("error", "interrupted", None, "spot", True, 1, {"id": "i-1"})
    attempt = Attempt(launch, outcome, 1.5e9 + 60, 60.0, 0.0002, "basis")
    for record in (launch, outcome, attempt):
        assert type(record).from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert LaunchRecord.from_dict({**launch.to_dict(), "from_a_newer_version": 1}) == launch
    result = attempt.result()
    assert result["results_uri"] == "s3://b/r/results/i-1" and result["interruptions"] == 1
    json.dumps(result)


def test_the_ledger_is_written_before_the_create_call_and_reloads() -> None:
    store = Store()
    ledger = ResourceLedger("key-1", store)
    entry = ledger.intend("instance", "us-east-1", token="tok")
    assert store.data[STORE_KEY]["entries"] == [
        {"kind": "instance", "id": None, "location": "us-east-1", "token": "tok"}
    ]
    ledger.created(entry, "i-1")
    again = ResourceLedger.load("key-1", store)
    assert [(e.kind, e.id) for e in again.entries] == [("instance", "i-1")]
    assert ResourceLedger.load("another-run", store).entries == []  # never another run's resources


def test_release_goes_newest_kind_first_and_empties_the_ledger() -> None:
    store, backend = Store(), Backend()
    ledger = ResourceLedger("key-1", store)
    ledger.created(ledger.intend("test_group", "us-east-1"), "asg-1")
    ledger.created(ledger.intend("instance", "us-east-1"), "i-1")
    released = ledger.release(backend, sweep=False)
    assert [r.id for r in released] == ["i-1", "asg-1"]
    assert backend.terminated == [[("i-1", "us-east-1")]] and backend.deleted == [("test_group", ["asg-1"])]
    assert ResourceLedger.load("key-1", store).entries == []


def test_a_create_call_that_never_returned_is_found_by_its_tag() -> None:
    """The worker died inside RunInstances: the id never reached the store, the tag finds it."""
    store = Store()
    ResourceLedger("key-1", store).intend("instance", "us-east-1", token="tok")
    backend = Backend(tagged=[inst("i-9")])
    ledger = ResourceLedger.load("key-1", store)
    ledger.release(backend, sweep=False)  # an entry without id forces the sweep anyway
    assert backend.terminated == [[("i-9", "us-east-1")]]


def test_one_failing_deleter_does_not_stop_the_others() -> None:
    class Failing(Backend):
        def terminate_instances(self, pairs: list[tuple[str, str | None]]) -> None:
            raise RuntimeError("boom")

    backend = Failing()
    ledger = ResourceLedger("key-1")
    ledger.created(ledger.intend("test_group", None), "asg-1")
    ledger.created(ledger.intend("instance", None), "i-1")
    with pytest.raises(RuntimeError, match="boom"):
        ledger.release(backend, sweep=False)
    assert backend.deleted == [("test_group", ["asg-1"])]
    assert [e.id for e in ledger.entries] == ["i-1"]  # kept for the next teardown path


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="register_kind"):
        ResourceLedger("k").intend("volcano", None)


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "DescribeInstances",
    )


def test_what_counts_as_transient() -> None:
    from airflow_cloudtrain.clouds.aws.errors import map_client_error

    def mapped(err: ClientError) -> Exception:
        """As the cloud module raises it: our vocabulary, from the SDK's error."""
        try:
            raise map_client_error(err) from err
        except Exception as raised:
            return raised

    assert is_transient(mapped(client_error("Unavailable", 503)))  # EC2's own 5xx, behind CloudError
    assert is_transient(mapped(client_error("RequestLimitExceeded", 503)))
    assert not is_transient(mapped(client_error("InsufficientInstanceCapacity", 500)))
    assert not is_transient(mapped(client_error("InvalidParameterValue", 400)))
    assert is_transient(client_error("RequestLimitExceeded", 503))
    assert is_transient(client_error("SlowDown", 503))
    assert is_transient(client_error("InternalError", 500))
    assert is_transient(EndpointConnectionError(endpoint_url="http://x"))
    assert not is_transient(client_error("InsufficientInstanceCapacity", 500))  # the launcher moves on
    assert not is_transient(client_error("InvalidInstanceID.NotFound", 400))
    assert not is_transient(ValueError("bad"))


def test_transient_errors_are_retried_with_backoff_within_the_budget() -> None:
    now = [0.0]
    sleeps: list[float] = []
    calls = iter([client_error("Throttling", 400), client_error("SlowDown", 503), "ok"])

    def fn() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    assert call_with_retry(fn, TransientBudget(60, base_s=1.0, clock=lambda: now[0]), sleep=sleep) == "ok"
    assert len(sleeps) == 2
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0  # exponential, with jitter
    budget = TransientBudget(budget_s=10, clock=lambda: now[0])
    budget.failed(client_error("Throttling", 400))
    now[0] += 11
    with pytest.raises(ClientError):  # errors for longer than the budget: the run is lost
        budget.failed(client_error("Throttling", 400))
    with pytest.raises(ValueError):
        TransientBudget().failed(ValueError("not transient"))


def test_max_runtime_defaults_to_a_7_day_cap_and_can_be_lifted() -> None:
    assert parse_max_runtime(None) == DEFAULT_MAX_RUNTIME_S == 7 * 86400
    assert parse_max_runtime("unlimited") is None
    assert parse_max_runtime("2h") == 7200
    with pytest.raises(ValueError, match="unlimited"):
        parse_max_runtime("forever")
    assert hard_stop_s(None) is None
    assert hard_stop_s(4) == 34  # at least 30 s for the agent's own graceful stop
    assert hard_stop_s(7200) == 7200 + 600  # at most 10 minutes past max_runtime


def test_a_teardown_during_the_create_call_does_not_lose_the_instance() -> None:
    """on_kill runs while RunInstances is in flight: its sweep finds nothing yet; when the call
    returns, the id must land in the ledger again for the next release."""
    store, backend = Store(), Backend()
    ledger = ResourceLedger("key-1", store)
    entry = ledger.intend("instance", "us-east-1")
    ledger.release(backend)  # the sweep found nothing: the pending entry is dropped
    ledger.created(entry, "i-late")
    assert [e.id for e in ResourceLedger.load("key-1", store).entries] == ["i-late"]
    ledger.release(backend, sweep=False)
    assert backend.terminated[-1] == [("i-late", "us-east-1")]


def test_a_failed_sweep_keeps_unresolved_entries_and_is_raised() -> None:
    class Unlisted(Backend):
        def __init__(self) -> None:
            super().__init__()
            self.cloud.find = self._fail  # type: ignore[method-assign]

        def _fail(self, digest: str, ended: bool = False) -> list[Instance]:
            raise ConnectionError("DescribeInstances timed out")

    backend = Unlisted()
    ledger = ResourceLedger("key-1")
    ledger.created(ledger.intend("instance", None), "i-1")
    pending = ledger.intend("instance", None)
    with pytest.raises(ConnectionError):
        ledger.release(backend)
    assert backend.terminated == [[("i-1", None)]]  # the known one still went
    assert ledger.entries == [pending]  # the unknown one waits for a sweep that works


@pytest.mark.parametrize(
    ("cloud", "instance_type", "gpus", "gpu_type", "want"),
    [
        ("gcloud", "n1-standard-8", 1, None, (1, "T4")),
        ("gcloud", "n1-standard-8", 2, "P4", (2, "P4")),
        ("gcloud", "n1-standard-8", 0, None, (0, None)),
    ],
)
def test_an_explicit_type_keeps_the_gpus_asked(
    cloud: str, instance_type: str, gpus: int, gpu_type: str | None, want: tuple[int, str | None]
) -> None:
    """An N1 type is listed once per accelerator it takes: asking for GPUs must not launch it bare."""
    import logging

    from airflow_cloudtrain.lifecycle.prepare import offers_for
    from airflow_cloudtrain.operators.config import check_run_args

    config = check_run_args(
        {
            "cloud": cloud,
            "command": "true",
            "bucket": "gs://my-bucket/runs",
            "instance_type": instance_type,
            "gpus": gpus,
            "gpu_type": gpu_type,
            "region": "us-central1",
        },
        rendered=True,
    )
    assert config is not None
    (offer,) = offers_for(config, None, logging.getLogger("test"))
    assert (offer.instance_type, offer.gpus, offer.gpu_type) == (instance_type, *want)

"""The fleet's shared core: a worker's cost through the one billing function (60 s minimum), the one
find-or-create under the ledger (``ResourceLedger.ensure``), and each kind's release order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_cloudtrain.clouds.aws.fleet import AwsFleet
from airflow_cloudtrain.clouds.gcp import fleet as _gcp_fleet  # noqa: F401  (registers the GCP kinds)
from airflow_cloudtrain.contract.workqueue import WorkerRecord
from airflow_cloudtrain.core.cloud import Instance
from airflow_cloudtrain.core.ledger import (
    KINDS,
    RELEASE_FIRST,
    RELEASE_LAST,
    STORE_KEY,
    ResourceKind,
    ResourceLedger,
    _reverse_kinds,
    register_kind,
)
from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle
from airflow_cloudtrain.lifecycle.fleet.watch import FleetWatch
from airflow_cloudtrain.storage import RunFolder

LAUNCH = 1_800_000_000.0


class Store:
    """task_state_store's get/set, in memory, plain JSON only (as the real store)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str) -> Any:
        return json.loads(json.dumps(self.data.get(key)))

    def set(self, key: str, value: Any) -> None:
        self.data[key] = json.loads(json.dumps(value))


def handle(prices: dict[str, float]) -> FleetHandle:
    return FleetHandle(
        run_id="r1",
        run_uri="s3://b/r1",
        run_key="k1",
        cloud="ec2spot",
        region="us-east-1",
        queue="q",
        dead_letter="dlq",
        group="ct-k1",
        item_ids=["0000"],
        prices=prices,
        num_workers=1,
        max_workers=2,
        started_at=LAUNCH,
    )


def watch_of(prices: dict[str, float], members: list[Instance]) -> FleetWatch:
    """A watch whose members are known (the cost reads nothing else: no cloud or folder call)."""
    import logging

    watch = FleetWatch(
        handle(prices), AwsFleet(None, None, None, "us-east-1"), RunFolder("s3://b/r1"), logging.getLogger()
    )
    watch.members = {m.id: m for m in members}
    return watch


def worker(iid: str, itype: str = "c5.large") -> Instance:
    return Instance(iid, "terminated", itype, "us-east-1a", True, launch_time=LAUNCH)


def test_a_worker_that_lived_20_s_is_billed_60_s() -> None:
    """EC2 bills per second with a 60 s minimum, each worker on its own (``core.billing``)."""
    watch = watch_of({"c5.large": 0.036}, [worker("i-short"), worker("i-long")])
    records = {
        "i-short": WorkerRecord("i-short", LAUNCH, "left", ended_at=LAUNCH + 20),  # billed 60 s
        "i-long": WorkerRecord("i-long", LAUNCH, "left", ended_at=LAUNCH + 120),  # billed 120 s
    }
    usd, basis = watch.cost(records, now=LAUNCH + 500)
    assert usd == round(0.036 * (60 + 120) / 3600, 6) == 0.0018
    assert basis == "2 worker(s), 180 s billed in all (each worker per second, 60 s minimum)"


def test_a_worker_seen_ending_is_billed_to_then_and_an_unpriced_type_is_named() -> None:
    watch = watch_of({"c5.large": 0.036}, [worker("i-1"), worker("i-2", "x9.odd")])
    watch.ended_seen["i-1"] = LAUNCH + 90.2  # no record of its own: when the watch saw it end
    usd, basis = watch.cost({}, now=LAUNCH + 1000)
    assert usd == round(0.036 * 91 / 3600, 6)  # whole seconds, rounded up
    assert basis.endswith("; 1 worker(s) of a type with no known price not counted")


def test_spot_workers_are_costed_at_the_prices_they_were_charged() -> None:
    """The delivered result prices each spot worker from its zone's history (a price that doubles
    halfway through its life is integrated), and a worker whose prices cannot be read stays at the
    group's price, without failing the result."""
    from airflow_cloudtrain.core.billing import PriceHistory

    doubling = PriceHistory(((LAUNCH - 3600, 0.04), (LAUNCH + 60, 0.08)), "EC2 spot price history")
    asked: list[tuple[Any, ...]] = []

    def charged(itype: str, zone: str | None, spot: bool, start: float, end: float) -> PriceHistory | None:
        asked.append((itype, zone, spot, start, end))
        if zone == "us-east-1b":
            raise RuntimeError("DescribeSpotPriceHistory throttled")
        return doubling

    in_b = Instance("i-b", "terminated", "c5.large", "us-east-1b", True, launch_time=LAUNCH)
    on_demand = Instance("i-od", "terminated", "c5.large", "us-east-1a", False, launch_time=LAUNCH)
    watch = watch_of({"c5.large": 0.036}, [worker("i-a"), in_b, on_demand])
    records = {
        iid: WorkerRecord(iid, LAUNCH, "left", ended_at=LAUNCH + 120) for iid in ("i-a", "i-b", "i-od")
    }
    usd, basis = watch.cost(records, now=LAUNCH + 500, charged=charged)
    # i-a: 60 s at 0.04 then 60 s at 0.08; i-b (no history) and the on-demand worker at the group's price
    assert usd == round((60 * 0.04 + 60 * 0.08) / 3600 + 2 * 120 * 0.036 / 3600, 6)
    assert asked == [
        ("c5.large", "us-east-1a", True, LAUNCH, LAUNCH + 120),
        ("c5.large", "us-east-1b", True, LAUNCH, LAUNCH + 120),
    ]
    assert basis == (
        "3 worker(s), 360 s billed in all (each worker per second, 60 s minimum); 1 at the prices "
        "charged (EC2 spot price history); 2 at the group's price for their type"
    )
    # the budget's projection during the run: the group's price, no price read
    assert watch.cost(records, now=LAUNCH + 500)[0] == round(3 * 120 * 0.036 / 3600, 6)


def test_ensure_finds_by_name_else_makes_under_a_write_ahead_entry() -> None:
    store = Store()
    ledger = ResourceLedger("k1", store)
    seen_during_create: list[Any] = []

    def create() -> str:
        seen_during_create.append(store.data[STORE_KEY]["entries"][-1])  # intended before the call
        return "https://sqs/ct-k1-items"

    url, made = ledger.ensure("sqs_queue", "us-east-1", "ct-k1-items", find=lambda: None, create=create)
    assert (url, made) == ("https://sqs/ct-k1-items", True)
    assert seen_during_create == [
        {"kind": "sqs_queue", "id": None, "location": "us-east-1", "token": "ct-k1-items"}
    ]
    assert [(e.kind, e.id) for e in ResourceLedger.load("k1", store).entries] == [("sqs_queue", url)]

    again = ResourceLedger.load("k1", store)  # a retried task: found by name, recorded once
    calls: list[str] = []
    found, made = again.ensure(
        "sqs_queue", "us-east-1", "ct-k1-items", find=lambda: url, create=lambda: calls.append("x") or ""
    )
    assert (found, made, calls) == (url, False, [])
    assert len(again.entries) == 1


def test_ensure_records_the_name_when_asked_and_a_killed_task_makes_nothing() -> None:
    ledger = ResourceLedger("k1", Store())
    template_id, _ = ledger.ensure(
        "launch_template", "us-east-1", "ct-k1", find=lambda: None, create=lambda: "lt-0abc", record="ct-k1"
    )
    assert template_id == "lt-0abc" and [e.id for e in ledger.entries] == ["ct-k1"]

    def killed() -> None:
        raise RuntimeError("the task was killed")

    with pytest.raises(RuntimeError, match="killed"):
        ledger.ensure(
            "asg", "us-east-1", "ct-k1", find=lambda: None, create=lambda: "x", before_create=killed
        )
    assert [e.kind for e in ledger.entries] == ["launch_template"]


def test_each_kind_carries_its_release_order() -> None:
    """Groups first (they would replace members deleted before them), firewall rules last, the rest
    newest first: one definition, on each ``ResourceKind``."""
    assert KINDS["asg"].release_order == KINDS["mig"].release_order == RELEASE_FIRST
    assert KINDS["firewall"].release_order == RELEASE_LAST
    from airflow_cloudtrain.core.ledger import Resource

    aws = [Resource(k, "x") for k in ("sqs_queue", "launch_template", "asg", "instance")]
    assert _reverse_kinds(aws) == ["asg", "instance", "launch_template", "sqs_queue"]
    gcp = ["firewall", "pubsub_topic", "pubsub_subscription", "instance_template", "mig", "instance"]
    assert _reverse_kinds([Resource(k, "x") for k in gcp]) == [
        "mig",
        "instance",
        "instance_template",
        "pubsub_subscription",
        "pubsub_topic",
        "firewall",
    ]


def test_a_ledger_written_by_the_previous_release_loads_and_orders_the_same() -> None:
    """The stored form is unchanged: a ledger written by the old code is read (and a newer writer's
    extra key is ignored, ``contract.records.load_known``)."""
    store = Store()
    store.data[STORE_KEY] = {
        "run_key": "k1",
        "entries": [
            {"kind": "sqs_queue", "id": "https://q/ct-k1-dlq", "location": "us-east-1", "token": ""},
            {"kind": "sqs_queue", "id": "https://q/ct-k1-items", "location": "us-east-1", "token": ""},
            {"kind": "launch_template", "id": "ct-k1", "location": "us-east-1", "token": "ct-k1"},
            {"kind": "asg", "id": None, "location": "us-east-1", "token": "ct-k1", "newer": "ignored"},
        ],
    }
    ledger = ResourceLedger.load("k1", store)
    assert [(e.kind, e.id) for e in ledger.entries][2:] == [("launch_template", "ct-k1"), ("asg", None)]
    assert _reverse_kinds(ledger.entries) == ["asg", "launch_template", "sqs_queue"]


@pytest.fixture
def fake_kinds() -> Any:
    deleted: list[str] = []

    def deleter(name: str, fail: bool = False) -> Any:
        def delete(backend: Any, resources: list[Any]) -> None:
            if fail:
                raise RuntimeError(f"{name} still busy")
            deleted.append(name)

        return delete

    kinds = [
        ResourceKind("t_queue", lambda b, d: [], deleter("t_queue")),
        ResourceKind("t_group", lambda b, d: [], deleter("t_group", fail=True), release_order=RELEASE_FIRST),
    ]
    for kind in kinds:
        register_kind(kind)
    yield deleted
    for kind in kinds:
        KINDS.pop(kind.name, None)


def test_a_group_that_cannot_go_keeps_the_rest_for_the_next_try(fake_kinds: list[str]) -> None:
    """Deleting the queue (or the members) of a group still there would only make it replace them."""
    ledger = ResourceLedger("k1", Store())
    ledger.created(ledger.intend("t_queue", None), "q")
    ledger.created(ledger.intend("t_group", None), "g")
    with pytest.raises(RuntimeError, match="still busy"):
        ledger.release(object(), sweep=False)  # type: ignore[arg-type]
    assert fake_kinds == [] and sorted(e.id or "" for e in ledger.entries) == ["g", "q"]


def test_the_engine_defers_on_the_same_trigger_and_event_shape_as_before() -> None:
    """Tasks deferred by the previous release resume: the trigger's classpath and kwargs are the same
    (``heartbeat_timeout`` added, optional), and its event is read the same way (a failed one releases
    and fails the task)."""
    import logging
    from types import SimpleNamespace

    from airflow.exceptions import AirflowException

    from airflow_cloudtrain.lifecycle.fleet.engine import FleetEngine
    from airflow_cloudtrain.triggers.fleet import FleetTrigger

    released: list[bool] = []
    fleet = SimpleNamespace(ctx=SimpleNamespace(conn_id="aws_x"), release=lambda: released.append(True))
    engine = FleetEngine(fleet, logging.getLogger(), 900.0, 5.0, None)  # type: ignore[arg-type]
    spec = engine.trigger(handle({"c5.large": 0.036}))
    trigger = spec.build()
    assert isinstance(trigger, FleetTrigger) and spec.method_name == "execute_complete"
    assert trigger.serialize() == (
        "airflow_cloudtrain.triggers.fleet.FleetTrigger",
        {
            "handle": handle({"c5.large": 0.036}).to_dict(),
            "conn_id": "aws_x",
            "poll_interval": 5.0,
            "startup_timeout": 900.0,
            "project_id": None,
            "heartbeat_timeout": None,  # added since: a trigger stored without it builds (below)
        },
    )
    before = {k: v for k, v in trigger.serialize()[1].items() if k != "heartbeat_timeout"}
    assert FleetTrigger(**before).heartbeat_timeout is None
    event = {"status": "error", "message": "FleetFailed: gone", "handle": trigger.handle}
    with pytest.raises(AirflowException, match="fleet r1 failed: FleetFailed: gone"):
        engine.resume(event)
    assert released == [True]


class Listing:
    """An S3 client's listing of the run folder (the workers' records): a bucket that holds what is
    given, or one that cannot be read."""

    def __init__(self, records: dict[str, WorkerRecord], fails: bool = False) -> None:
        self.records, self.fails = records, fails

    def get_paginator(self, name: str) -> Any:
        if self.fails:
            raise ConnectionError("the bucket cannot be reached")
        keys = [{"Key": f"r1/workers/{iid}.json"} for iid in self.records]
        return type("Pages", (), {"paginate": lambda _, **kw: [{"Contents": keys}]})()

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        record = self.records[Key.rsplit("/", 1)[-1].removesuffix(".json")]
        return {"Body": type("Body", (), {"read": lambda _: record.to_json().encode()})()}


class Group:
    """The cloud's side of ``replace_member``: which workers the group was asked to replace."""

    def __init__(self) -> None:
        self.replaced: list[str] = []

    def replace_member(self, group: str, iid: str) -> None:
        self.replaced.append(iid)


@pytest.mark.parametrize("fails", [False, True], ids=["bucket read", "bucket unreadable"])
def test_a_worker_that_never_wrote_its_record_is_replaced_after_startup_timeout(fails: bool) -> None:
    """A running worker whose agent never started writes no record, and a running member counts as
    the fleet's progress, so ``startup_timeout`` alone would never end it: the group replaces it once
    it has run ``startup_timeout``, once per launch. A worker with a fresh record stays, and a bucket
    that cannot be read replaces nobody."""
    import logging

    group = Group()
    beating = WorkerRecord("i-ok", LAUNCH, "busy", updated_at=LAUNCH + 690)
    folder = RunFolder("s3://b/r1", s3_client=Listing({"i-ok": beating}, fails))
    watch = FleetWatch(
        handle({}),
        group,
        folder,
        logging.getLogger(),
        startup_timeout=300,
        heartbeat_timeout=60,  # type: ignore[arg-type]
    )
    running = [
        Instance(iid, "running", "c5.large", "us-east-1a", True, launch_time=LAUNCH)
        for iid in ("i-ok", "i-mute")
    ]
    watch.members = {m.id: m for m in running}
    watch._replace_silent(LAUNCH + 250)  # not yet: within startup_timeout
    assert group.replaced == []
    watch._replace_silent(LAUNCH + 600)
    assert group.replaced == ([] if fails else ["i-mute"])
    watch._replace_silent(LAUNCH + 700)  # asked once for this launch (a GCE successor keeps the name)
    assert group.replaced == ([] if fails else ["i-mute"])

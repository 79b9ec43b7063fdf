"""A gang's pure decisions: its one outcome (``core.waiting.GangWatch``) and its all-or-nothing launch
(``core.launcher.launch_gang_with_failover``), over records as the clouds and the agents report them."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.contract.errors import CapacityUnavailable, InvalidRequest
from airflow_cloudtrain.contract.runs import RUNNING, RunStatus
from airflow_cloudtrain.core.cloud import Instance, LaunchRequest
from airflow_cloudtrain.core.launcher import LaunchFailed, launch_gang_with_failover
from airflow_cloudtrain.core.records import Attempt, LaunchRecord, Outcome
from airflow_cloudtrain.core.waiting import GangWatch

IDS = ["i-a", "i-b", "i-c"]


def running(iid: str) -> Instance:
    return Instance(iid, "running", "c5.large", "us-east-1a", False)


def status(iid: str, state: str = RUNNING, code: int | None = None) -> RunStatus:
    return RunStatus(state, iid, exit_code=code, started_at=1.0, updated_at=1.0, ended_at=2.0)


def watch() -> GangWatch:
    return GangWatch(IDS, None, None, None, None, wall=lambda: 10.0)


def test_the_gang_succeeds_only_when_every_node_has() -> None:
    gang = watch()
    alive = [running(i) for i in IDS]
    assert gang.decide([status("i-a", "succeeded", 0), status("i-b"), status("i-c")], alive) is None
    # the head finished first and its instance is gone: it stays a success while the others run
    gone = Instance("i-a", "terminated", "c5.large", "us-east-1a", False)
    assert gang.decide([None, status("i-b", "succeeded", 0), status("i-c")], [gone, *alive[1:]]) is None
    result = gang.decide([None, None, status("i-c", "succeeded", 0)], [gone, *alive[1:]])
    assert result is not None and result.ok and result.message == "all 3 nodes succeeded"
    assert [n["exit_code"] for n in result.nodes or []] == [0, 0, 0]


def test_the_first_failing_node_ends_the_gang_naming_its_rank_and_code() -> None:
    result = watch().decide(
        [status("i-a"), status("i-b"), status("i-c", "failed", 1)], [running(i) for i in IDS]
    )
    assert result is not None and not result.ok
    assert result.message.startswith("node rank 2 (i-c) exited with code 1")
    assert [n["exit_code"] for n in result.nodes or []] == [None, None, 1]


def test_a_vanished_node_ends_the_gang_after_the_grace() -> None:
    now = [1000.0]
    gang = GangWatch(IDS, None, None, None, None, clock=lambda: now[0], wall=lambda: 10.0)
    gone = Instance("i-b", "terminated", "c5.large", "us-east-1a", False, state_reason="deleted")
    nodes = [running("i-a"), gone, running("i-c")]
    statuses = [status(i) for i in IDS]
    assert gang.decide(statuses, nodes) is None  # the agent may still write its final status
    now[0] = 1100.0
    result = gang.decide(statuses, nodes)
    assert result is not None and result.state == "lost"
    assert result.message.startswith("node rank 1 (i-b) instance i-b ended before the job finished")


def offer(itype: str) -> Offer:
    return Offer("ec2", itype, 2, 4, 0, None, "us-east-1", ("us-east-1a", "us-east-1b"), 0.1, None)


class Cloud:
    """Launches as a cloud with room for ``room[(type, zone)]`` more instances would answer."""

    def __init__(self, room: dict[tuple[str, str | None], int]) -> None:
        self.room = room
        self.live: list[str] = []
        self.released: list[str] = []
        self.count = 0
        self.lock = threading.Lock()  # a gang's create calls come from several threads

    def launch(self, request: LaunchRequest) -> Instance:
        key = (request.offer.instance_type, request.zone)
        if key not in self.room:  # a room for the type in any zone
            key = (request.offer.instance_type, None)
        with self.lock:
            if self.room.get(key, 99) <= 0:
                raise CapacityUnavailable("no room", "InsufficientInstanceCapacity")
            self.room[key] = self.room.get(key, 99) - 1
            self.count += 1
            iid = f"i-{self.count}"
            self.live.append(iid)
        return Instance(iid, "pending", request.offer.instance_type, request.zone or "us-east-1c", False)

    def release(self, instances: list[Instance]) -> None:
        for i in instances:
            self.live.remove(i.id)
            self.released.append(i.id)


def build(offer: Offer, zone: str | None, attempt: int, rank: int) -> LaunchRequest:
    return LaunchRequest(offer, zone, "", {}, f"tok-{attempt}-{rank}", 50)


def test_room_for_two_of_three_releases_them_and_moves_the_whole_gang() -> None:
    cloud = Cloud({("c5.large", "us-east-1a"): 2})
    got, chosen, tried = launch_gang_with_failover(
        cloud.launch, cloud.release, [offer("c5.large")], build, lambda o: list(o.zones), 3
    )
    assert [i.zone for i in got] == ["us-east-1b"] * 3 and chosen.instance_type == "c5.large"
    assert tried == [("c5.large", "us-east-1a", "InsufficientInstanceCapacity at node 3 of 3")]
    assert sorted(cloud.released) == ["i-1", "i-2"] and sorted(cloud.live) == ["i-3", "i-4", "i-5"]


def test_the_nodes_create_calls_are_in_flight_together() -> None:
    """A gang's start costs one launch, not N in turn: no call returns until all N have been made
    (sequential calls would break the barrier: the first would wait for calls never made)."""
    barrier = threading.Barrier(4, timeout=60)
    cloud = Cloud({})

    def launch(request: LaunchRequest) -> Instance:
        barrier.wait()
        return cloud.launch(request)

    got, _, _ = launch_gang_with_failover(
        launch, cloud.release, [offer("c5.large")], build, lambda o: list(o.zones), 4
    )
    assert [i.zone for i in got] == ["us-east-1a"] * 4 and len({i.id for i in got}) == 4


def test_where_the_cloud_picks_the_zone_the_first_node_goes_alone_then_the_rest_together() -> None:
    calls: list[tuple[int, str | None]] = []
    barrier = threading.Barrier(2, timeout=60)  # ranks 1 and 2, together, after rank 0
    cloud = Cloud({})

    def launch(request: LaunchRequest) -> Instance:
        rank = int(request.client_token.rsplit("-", 1)[1])
        calls.append((rank, request.zone))
        if rank:
            barrier.wait()
        return cloud.launch(request)

    got, _, _ = launch_gang_with_failover(
        launch, cloud.release, [offer("c5.large")], build, lambda o: [None], 3
    )
    assert calls[0] == (0, None) and sorted(calls[1:]) == [(1, "us-east-1c"), (2, "us-east-1c")]
    assert [i.zone for i in got] == ["us-east-1c"] * 3


def test_nodes_follow_the_zone_the_cloud_chose_for_the_first() -> None:
    cloud = Cloud({})
    got, _, _ = launch_gang_with_failover(
        cloud.launch, cloud.release, [offer("c5.large")], build, lambda o: [None], 3
    )
    assert [i.zone for i in got] == ["us-east-1c"] * 3


def test_no_room_anywhere_lists_every_try_and_leaves_nothing() -> None:
    cloud = Cloud({("c5.large", None): 1, ("m5.large", None): 0})
    with pytest.raises(LaunchFailed) as err:
        launch_gang_with_failover(
            cloud.launch, cloud.release, [offer("c5.large"), offer("m5.large")], build, lambda o: [None], 2
        )
    assert [t[0] for t in err.value.tried] == ["c5.large", "m5.large"]
    assert "at node 2 of 2" in err.value.tried[0][2] and "at node 1 of 2" in err.value.tried[1][2]
    assert cloud.live == []


def test_another_error_is_not_a_failover() -> None:
    def refuse(request: LaunchRequest) -> Instance:
        raise InvalidRequest("bad image", "InvalidAMIID.Malformed")

    with pytest.raises(InvalidRequest):
        launch_gang_with_failover(refuse, lambda got: None, [offer("c5.large")], build, lambda o: [None], 2)


def test_the_xcom_of_a_gang_has_every_node_and_its_cost() -> None:
    nodes: list[dict[str, Any]] = [
        {"rank": r, "instance_id": i, "zone": "z", "private_ip": f"10.0.0.{r}"} for r, i in enumerate(IDS)
    ]
    launch = LaunchRecord("ct-1", "s3://b/r", "ec2", "us-east-1", "i-a", nodes=nodes)
    outcome = Outcome("error", "failed", 1, nodes=[{"rank": 2, "exit_code": 1}])
    result = Attempt(launch, outcome, 0.0, 10.0, 0.3, "per second").result()
    assert result["num_nodes"] == 3 and result["instance_id"] == "i-a"
    assert [(n["rank"], n["private_ip"], n["exit_code"]) for n in result["nodes"]] == [
        (0, "10.0.0.0", None),
        (1, "10.0.0.1", None),
        (2, "10.0.0.2", 1),
    ]
    old = LaunchRecord.from_dict({k: v for k, v in launch.to_dict().items() if k != "nodes"})
    assert old.nodes == [] and old.num_nodes == 1 and old.node_ids == ["i-a"]  # an older record loads

"""Typed records that travel between the layers of a run: trigger kwargs, events, XCom, the store.

Every record is a dataclass with ``to_dict`` / ``from_dict`` over plain JSON, because each crosses a
serialization boundary (the triggerer's kwargs, a TriggerEvent, ``task_state_store``); ``from_dict``
ignores unknown keys so a record written by a newer version still loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from airflow_cloudtrain.contract.records import load_known

T = TypeVar("T")


_load = load_known  # records from another release load: unknown keys are ignored


@dataclass
class LaunchRecord:
    """What was launched for a run, where, at what price and when (or what was adopted)."""

    run_id: str
    run_uri: str
    cloud: str
    region: str | None
    instance_id: str
    instance_type: str | None = None
    zone: str | None = None
    spot: bool = False
    hourly_usd: float | None = None
    launched_at: float | None = None
    adopted: bool = False
    failover: list[list[str]] = field(default_factory=list)
    run_key: str = ""  # digest of the RunKey: what the tag sweep looks for
    location: str | None = None  # where it is watched and deleted (EC2: region; GCE: zone)
    try_number: int = 1
    requested_at: float | None = None  # when the first create call of this launch was sent
    live_uri: str | None = None  # the bucket's live index the agent publishes to (runs.Beacon)
    # a gang (num_nodes > 1): every node in rank order, {rank, instance_id, zone, private_ip};
    # ``instance_id`` above is the head's (rank 0). Empty: one instance, no gang.
    nodes: list[dict[str, Any]] = field(default_factory=list)
    disk_gib: int | None = None  # each instance's root volume, priced with the instance

    @property
    def num_nodes(self) -> int:
        return max(1, len(self.nodes))

    @property
    def node_ids(self) -> list[str]:
        """Every node's instance id in rank order (the one instance of a single run)."""
        return [str(n["instance_id"]) for n in self.nodes] if self.nodes else [self.instance_id]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchRecord:
        return _load(cls, data)


# Outcome.status values: only "success" lets the task succeed.
SUCCESS, ERROR = "success", "error"


@dataclass
class Outcome:
    """How a run ended, as the agent (final status) or the cloud (instance state) reported it.

    ``state`` is the agent's final state (succeeded, failed, interrupted, timed_out) or one the
    operator concluded (lost, timed_out, wait_failed, killed).
    """

    status: str
    state: str
    exit_code: int | None = None
    message: str = ""
    interrupted: bool = False
    interruptions: int = 0
    instance: dict[str, Any] | None = None
    ended_at: float | None = None  # when the agent reported the end (unix time), if it did
    seen_ended_at: float | None = None  # when the wait first saw the instance ended (unix time)
    # a gang: what each node's end was when the gang's outcome was decided, {rank, exit_code, state}
    nodes: list[dict[str, Any]] | None = None
    rank: int | None = None  # a gang that did not succeed: the rank whose end ended it

    @property
    def ok(self) -> bool:
        return self.status == SUCCESS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        return _load(cls, data)

    @classmethod
    def lost(cls, state: str, message: str) -> Outcome:
        return cls(ERROR, state, None, message)


@dataclass
class Attempt:
    """One launch-run-release cycle: the launch, how it ended, when it was released, what it cost."""

    launch: LaunchRecord
    outcome: Outcome
    released_at: float
    duration_s: float
    cost_usd: float | None
    cost_basis: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "launch": self.launch.to_dict(), "outcome": self.outcome.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        rest = {k: v for k, v in data.items() if k not in ("launch", "outcome")}
        return _load(
            cls,
            {
                **rest,
                "launch": LaunchRecord.from_dict(data["launch"]),
                "outcome": Outcome.from_dict(data["outcome"]),
            },
        )

    def result(self) -> dict[str, Any]:
        """The operator's XCom: JSON-safe, with the contract's keys."""
        from airflow_cloudtrain.contract.runs import join, results_prefix

        launch, outcome = self.launch, self.outcome
        return {
            "run_id": launch.run_id,
            "run_uri": launch.run_uri,
            "results_uri": join(launch.run_uri, results_prefix(launch.instance_id)),
            "cloud": launch.cloud,
            "instance_id": launch.instance_id,
            "instance_type": launch.instance_type,
            "region": launch.region,
            "zone": launch.zone,
            "spot": bool(launch.spot),
            "exit_code": outcome.exit_code,
            "state": outcome.state,
            "launched_at": launch.launched_at,
            "released_at": self.released_at,
            "duration_s": round(self.duration_s, 3),
            "cost_usd": self.cost_usd,
            "cost_basis": self.cost_basis,
            "interruptions": int(outcome.interruptions or 0),
            "adopted": bool(launch.adopted),
            "failover": launch.failover,
            "num_nodes": launch.num_nodes,
            "nodes": self.nodes(),
        }

    def nodes(self) -> list[dict[str, Any]]:
        """XCom ``nodes``: per node rank, instance id, zone, private address and exit code (None for a
        node stopped by the gang's end before its job said)."""
        launch, outcome = self.launch, self.outcome
        if not launch.nodes:
            return [
                {
                    "rank": 0,
                    "instance_id": launch.instance_id,
                    "zone": launch.zone,
                    "private_ip": None,
                    "exit_code": outcome.exit_code,
                }
            ]
        codes = {int(n["rank"]): n.get("exit_code") for n in outcome.nodes or []}
        return [
            {
                "rank": int(n["rank"]),
                "instance_id": n["instance_id"],
                "zone": n.get("zone"),
                "private_ip": n.get("private_ip"),
                "exit_code": codes.get(int(n["rank"])),
            }
            for n in launch.nodes
        ]

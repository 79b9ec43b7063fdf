"""A gang: one job over ``num_nodes`` instances. What every node's job is told, and the barrier's keys.

The nodes of a gang share the run folder. The job starts on no node until every node has reported
its private address: the barrier, through the run folder (``agent.gang``)::

    nodes/ranks.json        operator: {"nodes": [instance id of rank 0, of rank 1, ...]}, written once it
                            knows the gang's instances (a launch gives identical user data to every
                            node, so a node learns its rank here, by its instance id)
    nodes/<rank>.json       agent: NodeRecord (rank, instance id, private address), written on arrival
    ranks/<r>/checkpoints/  agent, with ``checkpoint_ranks="all"``: rank r's checkpoint versions
                            (rank 0's stay in ``checkpoints/``; ``checkpoint_base``)
    nodes/idle/<rank>.json  agent, with ``idle_timeout_s``: IdleRecord, rewritten every watchdog sample
                            once the node's job has been idle for the timeout (``idle_since`` None
                            when it is busy again; ``ended`` once its job exited)

A node's record counts only when its instance id is the one ``ranks.json`` names for that rank, so
records of an earlier gang in the same run folder (a relaunch) never pass the barrier. A spec that
carries its own ``node_rank`` (an agent handed a node's spec) skips ``ranks.json``; the engine then
clears ``nodes/`` before it launches a gang.

The hung-job watchdog of a gang (``agent.gang.gang_idle``): a gang whose every node is idle is hung,
one idle rank of a busy gang is not (it may wait on the others). A node stops its job only once every
rank's idle record says idle for the timeout; a record not rewritten for ``idle_stale_s`` (a node that
died, or one of an earlier gang) counts as busy, unless it says the rank's job ended.

Stdlib only: the agent imports it on the instance.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

NODES_PREFIX = "nodes/"
RANKS_KEY = "nodes/ranks.json"
DEFAULT_MASTER_PORT = 29500  # torchrun's default
DEFAULT_BARRIER_TIMEOUT_S = 600.0
IDLE_PREFIX = "nodes/idle/"
IDLE_STALE_SAMPLES = 3  # an idle record not rewritten for this many sample intervals counts as busy
IDLE_STALE_MIN_S = 10.0  # ... and never sooner than this (a slow storage write is not a busy node)


RANKS_DIR = "ranks/"  # checkpoint_ranks="all": rank r >= 1 keeps its checkpoints under ranks/<r>/


def checkpoint_base(rank: int | None, checkpoint_ranks: str) -> str | None:
    """Where (relative to the run folder) a node's checkpoints live: None for the run folder itself
    (the head, every rank's restore with ``"head"``, a single run), ``ranks/<r>`` for rank r >= 1 with
    ``"all"``. Rank 0 keeps the run folder's own ``checkpoints/`` either way, so the ledger, ``runs
    show`` and ``resume_from`` read the head's checkpoints where a single run's are."""
    if checkpoint_ranks != "all" or not rank:
        return None
    return f"{RANKS_DIR}{int(rank)}"


def uploads(rank: int | None, num_nodes: int, checkpoint_ranks: str) -> bool:
    """Does this node upload its checkpoint_dir? Every node with ``"all"``; with ``"head"`` rank 0
    only, so N agents never race on one checkpoint prefix (a rank not yet past the barrier: no)."""
    if num_nodes <= 1 or checkpoint_ranks == "all":
        return True
    return rank == 0


def node_key(rank: int) -> str:
    """The run-folder key of a node's barrier record."""
    return f"{NODES_PREFIX}{int(rank)}.json"


def idle_key(rank: int) -> str:
    """The run-folder key of a node's idle record (the gang's hung-job watchdog)."""
    return f"{IDLE_PREFIX}{int(rank)}.json"


def idle_stale_s(sample_interval_s: float) -> float:
    """How old an idle record may be and still count: a couple of samples, at least 10 s."""
    return max(IDLE_STALE_MIN_S, IDLE_STALE_SAMPLES * float(sample_interval_s))


@dataclass(frozen=True)
class IdleRecord:
    """A node's watchdog verdict, rewritten every sample while its job has been idle for the timeout."""

    rank: int
    instance_id: str
    idle_since: float | None  # unix time the job was last busy; None: busy again
    at: float  # unix time of this write (a record older than ``idle_stale_s`` counts as busy)
    ended: bool = False  # the rank's job exited: it does nothing any more, however old the record

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> IdleRecord:
        data = json.loads(text)
        since = data.get("idle_since")
        return cls(
            int(data["rank"]),
            str(data["instance_id"]),
            None if since is None else float(since),
            float(data["at"]),
            bool(data.get("ended", False)),
        )

    def idle_for(self, now: float, timeout_s: float, stale_s: float) -> bool:
        """Whether this rank counts as idle for ``timeout_s`` at ``now`` (see the module docstring)."""
        if self.idle_since is None or now - self.idle_since < timeout_s:
            return False
        return self.ended or now - self.at <= stale_s


@dataclass(frozen=True)
class NodeRecord:
    """What a node writes when it reaches the barrier."""

    rank: int
    instance_id: str
    private_ip: str
    at: float  # unix time it arrived

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeRecord:
        data = json.loads(text)
        return cls(int(data["rank"]), str(data["instance_id"]), str(data["private_ip"]), float(data["at"]))


def ranks_json(instance_ids: list[str]) -> str:
    """``nodes/ranks.json``: the gang's instances in rank order (rank 0, the head, first)."""
    if len(set(instance_ids)) != len(instance_ids):
        raise ValueError(f"a gang's instance ids must differ: {instance_ids}")
    return json.dumps({"nodes": list(instance_ids)})


def parse_ranks(text: str) -> list[str]:
    """The instance ids of ``nodes/ranks.json`` in rank order."""
    nodes = json.loads(text).get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise ValueError(f"{RANKS_KEY} has no list of instance ids: {text[:200]!r}")
    return nodes


def node_env(
    rank: int, ips: list[str], gpus_per_node: int, port: int = DEFAULT_MASTER_PORT
) -> dict[str, str]:
    """The environment every node's job gets: ours (``CLOUDTRAIN_*``) and the names ``torchrun`` reads
    (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``NNODES``). ``ips``: private addresses in rank
    order; rank 0 is the head, whose address is the master's."""
    if not ips:
        raise ValueError("a gang has at least one node")
    if not 0 <= rank < len(ips):
        raise ValueError(f"rank {rank} is not in 0..{len(ips) - 1}")
    if not 0 < int(port) < 65536:
        raise ValueError(f"port {port} is not a TCP port (1..65535)")
    return {
        "CLOUDTRAIN_NODE_RANK": str(rank),
        "CLOUDTRAIN_NUM_NODES": str(len(ips)),
        "CLOUDTRAIN_NODE_IPS": "\n".join(ips),
        "CLOUDTRAIN_HEAD_IP": ips[0],
        "CLOUDTRAIN_GPUS_PER_NODE": str(int(gpus_per_node)),
        "MASTER_ADDR": ips[0],
        "MASTER_PORT": str(int(port)),
        "NODE_RANK": str(rank),
        "NNODES": str(len(ips)),
    }

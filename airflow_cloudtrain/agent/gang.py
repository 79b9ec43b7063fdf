"""A gang node's barrier (``contract.gang``): no node starts the job until every node is up.

After its setup commands, each node finds its rank (``spec.node_rank``, else its instance id's place
in ``nodes/ranks.json``), writes its record (rank, instance id, private address) and polls the run
folder until every rank's record is there; then the job runs with ``contract.gang.node_env`` (the
addresses in rank order, the head's as ``MASTER_ADDR``). ``spec.gang_timeout_s`` after the node
reached the barrier, the run fails naming the ranks still missing, so a gang that lost a node at
launch ends (and is released) instead of waiting for ever. A stop (notice, SIGTERM, max runtime)
ends the wait as it ends any step.

The private address comes from the metadata service (IMDS ``local-ipv4``, GCE
``network-interfaces/0/ip``), else from the address the host would reach the network with.

The hung-job watchdog of a gang (``GangIdle``, used by ``runner.Agent`` with ``idle_timeout_s``): a
gang whose every node is idle is hung, one idle rank of a busy gang is not (a rank waiting on a
collective the others are still computing towards uses no CPU). A node whose job has been idle for the
timeout says so in ``nodes/idle/<rank>.json`` (``contract.gang.IdleRecord``) on every sample and
stops its job only when every other rank's record says the same; being busy again rewrites the record.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from airflow_cloudtrain.agent.jobs import StopRequest
from airflow_cloudtrain.agent.watcher import AwsMetadata, GceMetadata
from airflow_cloudtrain.contract import gang, runs
from airflow_cloudtrain.contract.checkpoint_layouts import DCP
from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder

if TYPE_CHECKING:
    from airflow_cloudtrain.agent.checkpoints import CheckpointSync, Restored

POLL_S = 0.5
Ended = tuple[str, int | None, str]  # the run's (state, exit code, message), as Agent._run returns it


def private_ip(metadata: AwsMetadata | GceMetadata | None) -> str:
    """This instance's private address: the metadata service's, else the host's outgoing one."""
    if metadata is not None:
        path = "local-ipv4" if isinstance(metadata, AwsMetadata) else "network-interfaces/0/ip"
        try:
            value = (metadata.get(path) or "").strip()
        except Exception:  # no metadata service: the fallback below
            value = ""
        if value:
            return value
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: only the route is looked up
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def join(
    spec: runs.RunSpec,
    folder: RunFolder,
    instance_id: str,
    metadata: AwsMetadata | GceMetadata | None,
    note: Callable[[str], None],
    should_stop: Callable[[], StopRequest | None],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[runs.RunSpec, Ended | None]:
    """Wait at the barrier: (the spec with the gang's environment and this node's rank, None), or
    (the spec, how the run ends) on a timeout, a stop, or a gang this node is not part of."""
    n = int(spec.num_nodes)
    deadline = clock() + float(spec.gang_timeout_s)
    rank, ranks, ended = _find_rank(spec, folder, instance_id, note, should_stop, clock, deadline)
    if ended is not None or rank is None:
        return spec, ended or (runs.FAILED, None, "gang barrier: no rank")
    if not 0 <= rank < n:
        return spec, (runs.FAILED, None, f"gang barrier: node_rank {rank} is not in 0..{n - 1}")
    ip = private_ip(metadata)
    mine = gang.NodeRecord(rank, instance_id, ip, time.time())
    retry(lambda: folder.put_text(gang.node_key(rank), mine.to_json()), what="gang record")
    note(f"gang: node {rank} of {n} at {ip}, waiting for the others")
    found: dict[int, gang.NodeRecord] = {rank: mine}
    while True:
        try:
            for key in folder.list(gang.NODES_PREFIX):
                record = _record(folder, key, found, ranks, n)
                if record is not None:
                    found[record.rank] = record
        except Exception as err:  # a storage hiccup: the next round reads again
            note(f"gang: reading the barrier failed ({type(err).__name__}: {err}); retrying")
        missing = [r for r in range(n) if r not in found]
        if not missing:
            break
        if stop := should_stop():
            return spec, (stop.state, None, stop.message)
        if clock() >= deadline:
            names = ", ".join(str(r) for r in missing)
            message = (
                f"gang barrier: timed out after {spec.gang_timeout_s:g} s waiting for node rank(s) {names}"
                f" of {n}"
            )
            return spec, (runs.FAILED, None, message)
        time.sleep(POLL_S)
    ips = [found[r].private_ip for r in range(n)]
    note(f"gang: all {n} nodes up; head {ips[0]}:{spec.master_port}")
    env = gang.node_env(rank, ips, spec.gpus, spec.master_port)
    return replace(spec, env={**spec.env, **env}, node_rank=rank), None


def checkpoint_folder(folder: RunFolder, spec: runs.RunSpec, rank: int | None) -> RunFolder:
    """The folder a node's checkpoints sync with (``contract.gang.checkpoint_base``)."""
    base = gang.checkpoint_base(rank, spec.checkpoint_ranks) if spec.num_nodes > 1 else None
    return folder.at(runs.join(folder.uri, base)) if base else folder


def common_steps(folder: RunFolder, spec: runs.RunSpec, note: Callable[[str], None]) -> set[int] | None:
    """``checkpoint_ranks="all"``: the steps of which every rank has a complete checkpoint version.

    Each rank restores its own rank's checkpoints, and the gang must go on from one step: a rank
    whose newest upload is older (it was the node lost, or its last upload did not finish) would
    otherwise resume behind the others, and a data-parallel job would go on with ranks out of step.
    Every node reads every rank's manifests (the same for all), so every node picks the same newest
    common step. None: no rule applies (one node, ``"head"``, a layout without steps, or the
    manifests could not be read: each rank then restores its own newest, as before, and says so).
    """
    if int(spec.num_nodes) <= 1 or spec.checkpoint_ranks != "all":
        return None
    per_rank: list[set[int]] = []
    for rank in range(int(spec.num_nodes)):
        try:
            steps = _rank_steps(checkpoint_folder(folder, spec, rank))
        except Exception as err:
            note(
                f"gang: could not read rank {rank}'s checkpoints ({type(err).__name__}: {err}); "
                "each rank restores its own newest"
            )
            return None
        if steps is None:
            return None  # snapshots carry no step to agree on
        per_rank.append(steps)
    if not any(per_rank):
        return None  # nothing uploaded yet: a first gang
    common = set.intersection(*per_rank)
    newest = [max(steps, default=None) for steps in per_rank]
    if len(set(newest)) > 1:
        chosen = max(common, default=None)
        differ = ", ".join(f"rank {r}: {s}" for r, s in enumerate(newest))
        then = (
            f"every rank restores step {chosen}, the newest they all have"
            if chosen is not None
            else "no step is common to every rank: every rank starts without a checkpoint"
        )
        note(f"gang: the ranks' newest checkpoints differ ({differ}); {then}")
    return common


def merge_ranks(
    folder: RunFolder,
    spec: runs.RunSpec,
    rank: int | None,
    restored: Restored | None,
    sync: CheckpointSync,
    note: Callable[[str], None],
) -> None:
    """``checkpoint_ranks="all"`` and a sharded DCP step restored: add every other rank's files of that
    step (their ``__<rank>_<n>.distcp`` shards, and the coordinator's ``.metadata``), as DCP's load
    reads them all as from one shared directory. Other layouts are each rank's own: nothing to add."""
    if (
        int(spec.num_nodes) <= 1
        or spec.checkpoint_ranks != "all"
        or restored is None
        or restored.step is None
    ):
        return
    if DCP not in str(restored.layout or "").split("+"):
        return
    for other in range(int(spec.num_nodes)):
        if other == rank:
            continue
        try:
            added = sync.merge(checkpoint_folder(folder, spec, other), int(restored.step), DCP)
        except Exception as err:
            note(
                f"gang: could not add rank {other}'s files of DCP step {restored.step} "
                f"({type(err).__name__}: {err}); the job's dcp.load will not find them"
            )
            continue
        note(f"gang: added rank {other}'s {len(added)} file(s) of DCP step {restored.step}")


def _rank_steps(ranked: RunFolder) -> set[int] | None:
    """The steps of one rank's complete checkpoint versions (None: one of them has no step)."""
    keys = retry(lambda: ranked.list(runs.CHECKPOINTS_PREFIX + "/"), what="checkpoint list")
    steps: set[int] = set()
    for version in runs.manifest_versions(keys):
        key = runs.manifest_key(version)
        text = retry(lambda: ranked.get_text(key), what="checkpoint manifest")  # noqa: B023 (called at once)
        if not text:
            continue  # pruned since the listing
        step = runs.Manifest.from_json(text).step
        if step is None:
            return None
        steps.add(int(step))
    return steps


def uploads_checkpoints(spec: runs.RunSpec, rank: int | None) -> bool:
    """Whether this node uploads its checkpoint_dir (``contract.gang.uploads``)."""
    return gang.uploads(rank, int(spec.num_nodes), spec.checkpoint_ranks)


def find_rank(
    spec: runs.RunSpec,
    folder: RunFolder,
    instance_id: str,
    note: Callable[[str], None],
    should_stop: Callable[[], StopRequest | None],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int | None, Ended | None]:
    """This node's rank (``spec.node_rank``, else its place in ``nodes/ranks.json``, waited for up to
    ``spec.gang_timeout_s``), or how the run ends. ``checkpoint_ranks="all"`` needs it before the
    restore: each rank restores its own rank's checkpoints."""
    deadline = clock() + float(spec.gang_timeout_s)
    rank, _, ended = _find_rank(spec, folder, instance_id, note, should_stop, clock, deadline)
    return rank, ended


def _find_rank(
    spec: runs.RunSpec,
    folder: RunFolder,
    instance_id: str,
    note: Callable[[str], None],
    should_stop: Callable[[], StopRequest | None],
    clock: Callable[[], float],
    deadline: float,
) -> tuple[int | None, list[str] | None, Ended | None]:
    n = int(spec.num_nodes)
    ranks: list[str] | None = None
    rank = spec.node_rank
    if rank is None:
        # A relaunched gang shares the run folder with the gang before it, whose ranks stay there until
        # the operator publishes this gang's, right after its launch: an agent up before that reads the
        # old ranks, which do not name it, and waits for its own (up to the gang's timeout)
        while True:
            try:
                text = folder.get_text(gang.RANKS_KEY)
            except Exception as err:  # a storage hiccup: the next round reads again
                note(f"gang: reading {gang.RANKS_KEY} failed ({type(err).__name__}: {err}); retrying")
                text = None
            if text:
                seen = gang.parse_ranks(text)
                if instance_id in seen:
                    ranks = seen
                    break
                if ranks != seen:
                    note(f"gang: {gang.RANKS_KEY} does not name {instance_id} (an earlier gang's?); waiting")
                ranks = seen
            if stop := should_stop():
                return None, None, (stop.state, None, stop.message)
            if clock() >= deadline:
                if ranks is not None:
                    message = f"gang barrier: {instance_id} is not a node of {ranks} after {spec.gang_timeout_s:g} s"
                else:
                    message = f"gang barrier: no {gang.RANKS_KEY} after {spec.gang_timeout_s:g} s"
                return None, None, (runs.FAILED, None, message)
            time.sleep(POLL_S)
        if len(ranks) != n:
            message = f"gang barrier: {len(ranks)} node(s) ranked, num_nodes is {n}"
            return None, None, (runs.FAILED, None, message)
        rank = ranks.index(instance_id)
    return rank, ranks, None


def _record(
    folder: RunFolder, key: str, found: dict[int, gang.NodeRecord], ranks: list[str] | None, n: int
) -> gang.NodeRecord | None:
    """The record at ``key`` when it is a new, valid one of this gang (its rank's instance, if known)."""
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    if not stem.isdigit() or int(stem) in found or int(stem) >= n or key != gang.node_key(int(stem)):
        return None  # not a barrier record (``nodes/idle/<rank>.json`` is listed under nodes/ too)
    text = folder.get_text(key)
    if not text:
        return None
    try:
        record = gang.NodeRecord.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None
    if record.rank != int(stem) or (ranks is not None and ranks[record.rank] != record.instance_id):
        return None  # a record of an earlier gang in this run folder
    return record


class GangIdle:
    """One node's side of the gang's idle rule (module docstring): ``check`` on every watchdog sample.

    A rank counts only through a record of the gang's own instance for it (read from the barrier
    records once), so an earlier gang's records in the same run folder never make this one look idle.
    Storage errors are noted once and count as "not idle": the safe side is to keep the job running.
    """

    def __init__(
        self,
        folder: RunFolder,
        num_nodes: int,
        rank: int,
        instance_id: str,
        timeout_s: float,
        sample_interval_s: float,
        note: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder, self.n, self.rank, self.instance_id = folder, int(num_nodes), int(rank), instance_id
        self.timeout_s = float(timeout_s)
        self.stale_s = gang.idle_stale_s(sample_interval_s)
        self.note, self.clock = note, clock
        self.recorded = False  # our record says idle
        self._members: list[str | None] | None = None  # instance id per rank, from the barrier records
        self._noted: set[str] = set()

    def check(self, idle: bool, idle_since: float) -> bool:
        """``idle``: this node's job used no CPU/GPU for the timeout, since ``idle_since`` (unix time).
        Records it (or, busy again, clears it); True once every rank of the gang is idle too."""
        now = self.clock()
        if not idle:
            if self.recorded and self._write(None, now):
                self.recorded = False
                self._noted.discard("waiting")
            return False
        self.recorded = self._write(idle_since, now) or self.recorded
        busy = self._busy_rank(now)
        if busy is None:
            return True
        self._note_once(
            "waiting",
            f"idle_timeout: no CPU or GPU use for {self.timeout_s:g} s on this node, but rank {busy} of the "
            "gang is busy: not stopping (a gang is stopped only when every node is idle)",
        )
        return False

    def ended(self) -> None:
        """This node's job exited: it does nothing any more, so it counts as idle for the others'
        rule from now on (a finished rank never keeps a hung gang alive). Never raises."""
        now = self.clock()
        self._write(now, now, ended=True)

    def _write(self, idle_since: float | None, now: float, ended: bool = False) -> bool:
        record = gang.IdleRecord(self.rank, self.instance_id, idle_since, now, ended)
        try:
            self.folder.put_text(gang.idle_key(self.rank), record.to_json())
            return True
        except Exception as err:
            self._note_once("write", f"idle_timeout: writing {gang.idle_key(self.rank)} failed: {err}")
            return False

    def _busy_rank(self, now: float) -> int | None:
        """The first other rank that is not idle for the timeout; None when every one is."""
        for rank in range(self.n):
            if rank == self.rank:
                continue
            try:
                members = self._gang_members()
                text = self.folder.get_text(gang.idle_key(rank))
                record = gang.IdleRecord.from_json(text) if text else None
            except Exception as err:  # storage hiccup or a malformed record: busy, for now
                self._note_once("read", f"idle_timeout: reading the gang's idle records failed: {err}")
                return rank
            if record is None or record.rank != rank or record.instance_id != members[rank]:
                return rank
            if not record.idle_for(now, self.timeout_s, self.stale_s):
                return rank
        return None

    def _gang_members(self) -> list[str | None]:
        """Each rank's instance id, from its barrier record (``nodes/<rank>.json``), read once."""
        if self._members is not None:
            return self._members
        members: list[str | None] = []
        for rank in range(self.n):
            text = self.folder.get_text(gang.node_key(rank))
            members.append(gang.NodeRecord.from_json(text).instance_id if text else None)
        if None not in members:  # every node passed the barrier: read again next time otherwise
            self._members = members
        return members

    def _note_once(self, what: str, message: str) -> None:
        if what not in self._noted:
            self._noted.add(what)
            self.note(message)

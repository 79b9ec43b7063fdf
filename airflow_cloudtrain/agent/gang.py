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
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import replace

from airflow_cloudtrain.agent.jobs import StopRequest
from airflow_cloudtrain.agent.watcher import AwsMetadata, GceMetadata
from airflow_cloudtrain.contract import gang, runs
from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder

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
    ranks: list[str] | None = None
    rank = spec.node_rank
    if rank is None:
        while True:
            try:
                text = folder.get_text(gang.RANKS_KEY)
            except Exception as err:  # a storage hiccup: the next round reads again
                note(f"gang: reading {gang.RANKS_KEY} failed ({type(err).__name__}: {err}); retrying")
                text = None
            if text:
                ranks = gang.parse_ranks(text)
                break
            if stop := should_stop():
                return spec, (stop.state, None, stop.message)
            if clock() >= deadline:
                message = f"gang barrier: no {gang.RANKS_KEY} after {spec.gang_timeout_s:g} s"
                return spec, (runs.FAILED, None, message)
            time.sleep(POLL_S)
        if instance_id not in ranks:
            return spec, (runs.FAILED, None, f"gang barrier: {instance_id} is not a node of {ranks}")
        if len(ranks) != n:
            return spec, (runs.FAILED, None, f"gang barrier: {len(ranks)} node(s) ranked, num_nodes is {n}")
        rank = ranks.index(instance_id)
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


def _record(
    folder: RunFolder, key: str, found: dict[int, gang.NodeRecord], ranks: list[str] | None, n: int
) -> gang.NodeRecord | None:
    """The record at ``key`` when it is a new, valid one of this gang (its rank's instance, if known)."""
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    if not stem.isdigit() or int(stem) in found or int(stem) >= n:
        return None
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

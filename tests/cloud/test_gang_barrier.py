"""A gang's nodes, for real: three agents as subprocesses on one run folder (emulated S3 and GCS), each
with its own private address served by the emulated metadata service, as three instances have.

The operator's part is played by the test: it writes ``spec.json`` (``num_nodes=3``) and
``nodes/ranks.json`` (the instance ids in rank order). Each agent writes its record at the barrier,
and once all three are there the job runs: a TCP all-reduce with the head over ``MASTER_ADDR`` /
``MASTER_PORT`` (each rank sends its number, the head sums and sends the sum back). Every node prints
the same sum and sees the right environment. A gang with a node that never comes fails at the barrier's
timeout, naming the missing rank; a record left by an earlier gang's node does not count.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_checkpoints import Agent, reap

from airflow_cloudtrain.contract import gang, runs
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.emulator.addresses import ADDRESSES
from airflow_cloudtrain.storage import RunFolder, open_run_folder

FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.5, "metadata_poll_s": 0.5}
ENV_KEYS = [
    "CLOUDTRAIN_NODE_RANK",
    "CLOUDTRAIN_NUM_NODES",
    "CLOUDTRAIN_NODE_IPS",
    "CLOUDTRAIN_HEAD_IP",
    "CLOUDTRAIN_GPUS_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "NNODES",
]

# The job: stdlib only. The head listens on MASTER_ADDR:MASTER_PORT; each other rank connects from its
# own address (retrying until the head listens), sends its number and reads the sum.
ALLREDUCE = r"""
import json, os, socket, sys, time
rank, n = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
head, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
mine = os.environ["CLOUDTRAIN_NODE_IPS"].splitlines()[rank]
value = 10 * (rank + 1)
if rank == 0:
    srv = socket.create_server((head, port))
    srv.settimeout(120)
    total, peers = value, []
    for _ in range(n - 1):
        conn, addr = srv.accept()
        f = conn.makefile("rw")
        total += int(f.readline())
        peers.append((conn, f, addr[0]))
    for conn, f, _ in peers:
        f.write(f"{total}\n")
        f.flush()
        conn.close()
    print("peers", json.dumps(sorted(p[2] for p in peers)), flush=True)
else:
    deadline = time.time() + 120
    while True:
        try:
            conn = socket.create_connection((head, port), timeout=30, source_address=(mine, 0))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    f = conn.makefile("rw")
    f.write(f"{value}\n")
    f.flush()
    total = int(f.readline())
print("sum", total, flush=True)
print("env", json.dumps({k: os.environ.get(k) for k in KEYS}), flush=True)
""".replace("KEYS", repr(ENV_KEYS))


class Node(Agent):
    """One agent process as one instance of the gang: its own id, address and workdir (the agent
    process of ``test_agent_checkpoints``, with the output merged into the log it fails with)."""

    def __init__(self, emu: Any, folder: RunFolder, tmp: Path, address: str) -> None:
        super().__init__(emu, folder, tmp, folder.scheme)
        self.address = address
        emu.metadata.set_address(self.iid, address)

    def wait(self, timeout: float = 240.0) -> runs.RunStatus:
        return super().wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(params=["s3", "gs"])
def gang_folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, RunFolder, Path]]:
    emu = request.getfixturevalue("emu")
    uri = f"{request.param}://{DEFAULT_BUCKET}/runs/gang/{uuid.uuid4().hex[:12]}/-1"
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    yield emu, open_run_folder(uri), tmp_path
    reap(tmp_path)


def addresses(count: int) -> list[str]:
    """Private addresses as the emulator hands them to instances (held for the test's process)."""
    return [ADDRESSES.take(lambda: True) for _ in range(count)]


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def write_spec(folder: RunFolder, tmp: Path, ips: list[str], **extra: Any) -> runs.RunSpec:
    spec = runs.RunSpec(
        run_id="ct-gang",
        run_uri=folder.uri,
        cloud="ec2" if folder.scheme == "s3" else "gcloud",
        command=f"exec {sys.executable} {tmp / 'allreduce.py'}",
        gpus=2,
        num_nodes=3,
        master_port=free_port(ips[0]),
        **{**FAST, **extra},
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    return spec


def test_three_nodes_meet_at_the_barrier_and_all_reduce_over_tcp(
    gang_folder: tuple[Any, RunFolder, Path],
) -> None:
    emu, folder, tmp = gang_folder
    ips = addresses(3)
    spec = write_spec(folder, tmp, ips, gang_timeout_s=180)
    nodes = [Node(emu, folder, tmp, ip) for ip in ips]
    try:
        # the nodes come up out of order, before the operator has written the ranks: they wait for them
        for node in reversed(nodes):
            node.start()
        folder.put_text(gang.RANKS_KEY, gang.ranks_json([n.iid for n in nodes]))
        statuses = [node.wait() for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for rank, (node, status) in enumerate(zip(nodes, statuses, strict=True)):
        log = node.log()
        assert status.state == runs.SUCCEEDED, (status, log[-3000:])
        assert "sum 60" in log.splitlines(), log[-3000:]  # 10 + 20 + 30, the same on every node
        env = json.loads(next(ln for ln in log.splitlines() if ln.startswith("env "))[4:])
        assert env == {
            "CLOUDTRAIN_NODE_RANK": str(rank),
            "CLOUDTRAIN_NUM_NODES": "3",
            "CLOUDTRAIN_NODE_IPS": "\n".join(ips),
            "CLOUDTRAIN_HEAD_IP": ips[0],
            "CLOUDTRAIN_GPUS_PER_NODE": "2",
            "MASTER_ADDR": ips[0],
            "MASTER_PORT": str(spec.master_port),
            "NODE_RANK": str(rank),
            "NNODES": "3",
        }
        record = gang.NodeRecord.from_json(folder.get_text(gang.node_key(rank)) or "")
        assert (record.rank, record.instance_id, record.private_ip) == (rank, node.iid, ips[rank])
    head_log = nodes[0].log()
    peers = json.loads(next(ln for ln in head_log.splitlines() if ln.startswith("peers "))[6:])
    assert peers == sorted(ips[1:])  # the others connected from their own addresses


def test_a_missing_node_times_the_barrier_out_naming_its_rank(
    gang_folder: tuple[Any, RunFolder, Path],
) -> None:
    emu, folder, tmp = gang_folder
    ips = addresses(3)
    write_spec(folder, tmp, ips, gang_timeout_s=8)
    nodes = [Node(emu, folder, tmp, ip) for ip in ips]
    # rank 2's instance never boots; a record an earlier gang's rank 2 left behind does not stand in
    stale = gang.NodeRecord(2, "i-earlier-gang", "127.9.9.9", time.time() - 3600)
    folder.put_text(gang.node_key(2), stale.to_json())
    folder.put_text(gang.RANKS_KEY, gang.ranks_json([n.iid for n in nodes]))
    try:
        started = [nodes[0].start(), nodes[1].start()]
        statuses = [node.wait() for node in started]
    finally:
        for node in nodes:
            node.kill()
    for node, status in zip(started, statuses, strict=True):
        assert status.state == runs.FAILED, status
        assert status.message == "gang barrier: timed out after 8 s waiting for node rank(s) 2 of 3", status
        assert status.job_started_at is None  # the job never ran
        assert "sum " not in node.log()

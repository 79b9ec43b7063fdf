"""The multi-node example's job (``example_dags/distributed_code/train_dp.py``) on a real gang of agents:
three agent subprocesses on one run folder (emulated S3 and GCS), each its own instance with its own
private address, as in ``test_gang_barrier``. The operator's part is played by the test (``spec.json``
with ``num_nodes=3``, then ``nodes/ranks.json``).

- Uninterrupted: every node finishes and holds the same weights, exactly those the script's own math
  gives in one process for three shards; each rank got its rank, the gang's size and the head's
  address; the model learned the data's true weights.
- Interrupted: after a few checkpoint uploads one node gets an interruption notice from the metadata
  service (rank 1 on EC2, the head on GCE). Its job finishes the step and stops; the other ranks' jobs
  end at once with "peer lost" (exit 3), not at a timeout. A relaunched gang (three new instances, new
  addresses and ranks, the same run folder) restores the newest complete checkpoint version, resumes
  from its step on every rank and ends, bit for bit, with the weights the script's math gives for an
  uninterrupted run of as many steps (which the first test shows a real gang reaching).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from test_agent_checkpoints import REPO, newest, reap
from test_gang_barrier import FAST, Node, addresses, free_port
from waiting import wait_for

from airflow_cloudtrain.contract import gang, runs
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.storage import RunFolder, open_run_folder

SCRIPT = REPO / "example_dags" / "distributed_code" / "train_dp.py"
LR = 0.1
NODES = 3


def _script() -> ModuleType:
    """The training script as a module: its math is the reference the gang must reproduce."""
    spec = importlib.util.spec_from_file_location("train_dp_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_dp = _script()


@pytest.fixture(params=["s3", "gs"])
def gang_folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, RunFolder, Path]]:
    emu = request.getfixturevalue("emu")
    uri = f"{request.param}://{DEFAULT_BUCKET}/runs/gang-example/{uuid.uuid4().hex[:12]}/-1"
    yield emu, open_run_folder(uri), tmp_path
    reap(tmp_path)


def write_spec(
    folder: RunFolder, ips: list[str], steps: int, every: int, sleep: float, **extra: Any
) -> runs.RunSpec:
    """The spec the operator would write: the example's command on three nodes, checkpoints synced
    every half second. ``-S``: no site-packages, so the checkpoint helper comes from the agent zip."""
    command = (
        f"exec {sys.executable} -S {SCRIPT} --steps {steps} --every {every} --sleep {sleep}"
        f" --lr {LR} --timeout 60"
    )
    spec = runs.RunSpec(
        run_id="ct-gang-example",
        run_uri=folder.uri,
        cloud="ec2spot" if folder.scheme == "s3" else "gcspot",
        command=command,
        num_nodes=NODES,
        master_port=free_port(ips[0]),
        gang_timeout_s=180,
        **{**FAST, "checkpoint_interval_s": 0.5, **extra},
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    return spec


def new_gang(emu: Any, folder: RunFolder, tmp: Path) -> tuple[list[Node], list[str]]:
    """A gang: three new instances (ids, addresses), started, then ranked as the operator ranks them."""
    ips = addresses(NODES)
    nodes = [Node(emu, folder, tmp, ip) for ip in ips]
    return nodes, ips


def start(folder: RunFolder, nodes: list[Node]) -> None:
    for node in nodes:
        node.start()
    folder.put_text(gang.RANKS_KEY, gang.ranks_json([n.iid for n in nodes]))


def result(folder: RunFolder, node: Node) -> dict[str, Any]:
    text = folder.get_text(runs.join(runs.results_prefix(node.iid), "result.json"))
    assert text, f"no result.json from {node.iid}: {node.log()[-3000:]}"
    return dict(json.loads(text))


def head_steps(node: Node) -> list[int]:
    return [int(n) for n in re.findall(r"^step (\d+) loss ", node.job_log(), re.M)]


def versions(folder: RunFolder) -> list[int]:
    return runs.manifest_versions(folder.list(runs.CHECKPOINTS_PREFIX + "/"))


def finish(nodes: list[Node]) -> list[runs.RunStatus]:
    try:
        return [node.wait() for node in nodes]
    finally:
        for node in nodes:
            node.kill()


def test_three_nodes_train_to_the_single_process_weights(gang_folder: tuple[Any, RunFolder, Path]) -> None:
    emu, folder, tmp = gang_folder
    nodes, ips = new_gang(emu, folder, tmp)
    spec = write_spec(folder, ips, steps=60, every=20, sleep=0.0)
    start(folder, nodes)
    statuses = finish(nodes)
    expected = train_dp.reference(60, NODES, LR)
    for rank, (node, status) in enumerate(zip(nodes, statuses, strict=True)):
        log = node.job_log()
        assert status.state == runs.SUCCEEDED and status.exit_code == 0, (status, node.log()[-3000:])
        # the environment the agent gave this node: its rank, the gang's size, the head's address
        assert f"rank {rank} of 3: 80 rows, head {ips[0]}:{spec.master_port}\n" in log, log[-3000:]
        got = result(folder, node)
        assert got == {"rank": rank, "nodes": 3, "steps": 60, "resumed_from": 0, "weights": expected}
    assert head_steps(nodes[0]) == list(range(1, 61))  # only the head prints the loss
    assert all(not head_steps(node) for node in nodes[1:])
    for true, learned in zip([*train_dp.TRUE_W, train_dp.TRUE_B], expected, strict=True):
        assert abs(true - learned) < 0.1, expected  # the average of the shards' gradients trains the model
    # only the head checkpoints: the newest version is its last step, uploaded by its agent
    _, manifest = newest(folder)
    assert manifest.step == 60 and manifest.instance_id == nodes[0].iid


def test_a_lost_node_stops_the_gang_and_a_relaunch_resumes_from_the_checkpoint(
    gang_folder: tuple[Any, RunFolder, Path],
) -> None:
    emu, folder, tmp = gang_folder
    victim = 1 if folder.scheme == "s3" else 0  # a worker on EC2, the head on GCE
    first, ips = new_gang(emu, folder, tmp)
    write_spec(folder, ips, steps=1_000_000, every=5, sleep=0.05)  # runs until the node is lost
    try:
        start(folder, first)
        # a few checkpoints of the head's are in the run folder before the node is lost
        wait_for(lambda: len(versions(folder)) >= 2, timeout=180, message="two checkpoint uploads")
        lost = first[victim]
        if folder.scheme == "s3":
            emu.metadata.set_spot_action(lost.iid, "terminate", at=time.time() + 60)
        else:
            emu.metadata.set_preempted(lost.iid)
        statuses = [node.wait() for node in first]
    finally:
        for node in first:
            node.kill()
    stopped = statuses[victim]
    assert stopped.state == runs.INTERRUPTED and stopped.interruption, (stopped, lost.log()[-3000:])
    assert stopped.exit_code == 143 and "SIGTERM: stopped at step" in lost.job_log()
    for rank, (node, status) in enumerate(zip(first, statuses, strict=True)):
        if rank == victim:
            continue
        # the others end at once, because the peer's connection closed (not after the 60 s timeout)
        assert status.state == runs.FAILED and status.exit_code == 3, (status, node.log()[-3000:])
        assert re.search(
            r"^peer lost at step \d+: .*(connection closed|connection lost|send failed)", node.job_log(), re.M
        ), node.job_log()[-3000:]
        assert status.ended_at is not None and stopped.ended_at is not None
    done = head_steps(first[0])[-1]
    assert done > 0
    # the head saved the last step the gang completed, and its agent uploaded it: no step is lost
    version, manifest = newest(folder)
    assert manifest.step == done and manifest.instance_id == first[0].iid
    assert [p["path"] for p in manifest.files] == [f"ckpt-{done:05d}.json"]

    # the relaunch: three new instances on the same run folder, ranked anew (the old records do not count)
    steps = done + 30
    second, ips = new_gang(emu, folder, tmp)
    write_spec(folder, ips, steps=steps, every=50, sleep=0.0, restarts=1)
    start(folder, second)
    statuses = finish(second)
    expected = train_dp.reference(steps, NODES, LR)
    for rank, (node, status) in enumerate(zip(second, statuses, strict=True)):
        assert status.state == runs.SUCCEEDED, (status, node.log()[-3000:])
        got = result(folder, node)
        assert got == {"rank": rank, "nodes": 3, "steps": steps, "resumed_from": done, "weights": expected}
        assert status.restored_step == done  # every agent restored it; the head's copy is the one used
    assert f"resumed from step {done} (checkpoint ckpt-{done:05d}.json)\n" in second[0].job_log()
    assert head_steps(second[0]) == list(range(done + 1, steps + 1))  # nothing redone, nothing skipped
    for node in second[1:]:
        assert f"resumed from step {done} (the head's)\n" in node.job_log()
    assert f"restored checkpoint step {done} from {folder.uri}/checkpoints/{version} (steps)" in (
        second[0].notes()
    )
    _, final = newest(folder)
    assert final.step == steps and final.instance_id == second[0].iid

"""How long does a gang take to start, and to run again after losing a node? The agent-level part of
issue 25's benchmark, on the emulated clouds (moto's S3 server, the emulated GCS and metadata service).

For each gang size (``--sizes``, 1 2 4 8 by default) and cloud (``--clouds``), N real agents
(``python -m airflow_cloudtrain.agent``) start as N instances on one run folder, each with its own
private address, running the multi-node example's job (``example_dags/distributed_code/train_dp.py``:
gradients to the head over TCP every step, the head checkpoints every 10 steps). The operator's part
is played here: ``spec.json`` with ``num_nodes=N``, then ``nodes/ranks.json``. Measured (wall time):

  last at barrier    agents started -> the last node wrote its barrier record (agent start, restore, setup)
  all running        agents started -> the job runs on every node (``job_started_at`` of every status)
  barrier            the last record -> the job runs on every node (what the barrier itself costs;
                     one node is no gang: it has no barrier, and both columns are its job start)
  gang stopped       rank N-1 (the head when N=1) gets an interruption notice -> every agent ended
                     (that node's job stops at the end of its step, the others' at once: "peer lost")
  running again      the notice -> a relaunched gang (N new instances, ranked anew, restoring the
                     head's checkpoint) runs the job on every node; the relaunch starts as soon as the
                     old gang has ended, as the operator would
  steps redone       the head's last step before the loss - the step the new gang resumed from (the
                     head saves the gang's last completed step when it stops or loses a peer: 0)

Not measured here (no instances are launched: the agents run on this host): the operator-level rows,
task start -> every node running and describe calls per poll. ``operator_rows`` is their hook, filled
once ``num_nodes`` is on the operators (issue 25's goal: a gang's start within 20% of a single node's
plus the barrier; one describe per region per poll whatever N).

    python benchmarks/gangs.py [--sizes 1 2 4 8] [--clouds s3 gs]
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCRIPT = ROOT / "example_dags" / "distributed_code" / "train_dp.py"
FAST: dict[str, Any] = {"log_interval_s": 0.5, "heartbeat_interval_s": 1.0, "metadata_poll_s": 0.5}
DEADLINE_S = 300.0  # one wait's bound on a loaded machine; it never times the product
STEP_RE = re.compile(r"^step (\d+) loss ", re.MULTILINE)
RESUMED_RE = re.compile(r"^resumed from step (\d+)", re.MULTILINE)


@dataclass
class Row:
    cloud: str
    nodes: int
    last_at_barrier_s: float
    all_running_s: float
    barrier_s: float
    gang_stopped_s: float
    running_again_s: float
    steps_redone: int


class Node:
    """One agent process as one instance of a gang (its own id, address, workdir)."""

    def __init__(self, emu: Any, folder: Any, tmp: Path, address: str) -> None:
        prefix = "i" if folder.scheme == "s3" else "vm"
        self.iid = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.emu, self.folder, self.address = emu, folder, address
        self.workdir = tmp / self.iid
        self.proc: subprocess.Popen[bytes] | None = None
        emu.metadata.set_address(self.iid, address)

    def start(self) -> Node:
        env = {
            **os.environ,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.emu.metadata.endpoint_for(self.iid),
            "GCE_METADATA_HOST": self.emu.metadata.gce_host_for(self.iid),
        }
        env.pop("PYTHONPATH", None)
        argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", self.folder.uri]
        argv += ["--instance-id", self.iid, "--workdir", str(self.workdir)]
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return self

    def status(self) -> Any:
        from airflow_cloudtrain.contract import runs

        text = self.folder.get_text(runs.status_key(self.iid))
        return runs.RunStatus.from_json(text) if text else None

    def log(self) -> str:
        from airflow_cloudtrain.contract import runs

        keys = self.folder.list(runs.log_prefix(self.iid))
        return runs.strip_stamps(b"".join(self.folder.get_bytes(k) or b"" for k in keys).decode())

    def ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        """SIGTERM (the agent stops its job and reports), then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_until(condition: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {DEADLINE_S:g} s waiting for {what}")
        time.sleep(0.1)
    return value


def start_gang(emu: Any, folder: Any, tmp: Path, n: int, restarts: int) -> tuple[list[Node], float]:
    """Write the spec, start n agents, rank them; (the nodes, the wall time they were started)."""
    from airflow_cloudtrain.contract import gang, runs
    from airflow_cloudtrain.emulator.addresses import ADDRESSES

    nodes = [Node(emu, folder, tmp, ADDRESSES.take(lambda: True)) for _ in range(n)]
    with socket.socket() as probe:  # a free port on the head's address
        probe.bind((nodes[0].address, 0))
        port = int(probe.getsockname()[1])
    command = f"exec {sys.executable} -S {SCRIPT} --steps 100000000 --every 10 --sleep 0.05 --timeout 60"
    spec = runs.RunSpec(
        run_id="ct-gang-bench",
        run_uri=folder.uri,
        cloud="ec2spot" if folder.scheme == "s3" else "gcspot",
        command=command,
        num_nodes=n,
        master_port=port,
        gang_timeout_s=DEADLINE_S,
        restarts=restarts,
        checkpoint_interval_s=1.0,
        **FAST,
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    started = time.time()
    for node in nodes:
        node.start()
    folder.put_text(gang.RANKS_KEY, gang.ranks_json([node.iid for node in nodes]))
    return nodes, started


def all_running(nodes: list[Node]) -> float | None:
    """The time the job was running on every node (the last ``job_started_at``), None until then."""
    times = []
    for node in nodes:
        if node.ended():
            raise RuntimeError(f"{node.iid} ended before the gang ran: {node.log()[-2000:]}")
        status = node.status()
        if status is None or status.job_started_at is None:
            return None
        times.append(float(status.job_started_at))
    return max(times)


def last_arrival(folder: Any, n: int) -> float:
    from airflow_cloudtrain.contract import gang

    return max(gang.NodeRecord.from_json(folder.get_text(gang.node_key(r)) or "").at for r in range(n))


def measure(emu: Any, scheme: str, n: int, tmp: Path) -> Row:
    from airflow_cloudtrain.emulator import DEFAULT_BUCKET
    from airflow_cloudtrain.storage import open_run_folder

    folder = open_run_folder(f"{scheme}://{DEFAULT_BUCKET}/runs/gang-bench/{uuid.uuid4().hex[:12]}/-1")
    first, started = start_gang(emu, folder, tmp, n, restarts=0)
    second: list[Node] = []
    try:
        running = wait_until(lambda: all_running(first), f"{n} node(s) running")
        arrived = last_arrival(folder, n) if n > 1 else running  # one node: no gang, no barrier
        head = first[0]
        wait_until(lambda: len(STEP_RE.findall(head.log())) >= 20, "20 steps and a checkpoint")
        lost = first[-1]
        noticed = time.time()
        if scheme == "s3":
            emu.metadata.set_spot_action(lost.iid, "terminate", at=noticed + 60)
        else:
            emu.metadata.set_preempted(lost.iid)
        wait_until(lambda: all(node.ended() for node in first), "the old gang to end")
        stopped = time.time()
        done = int(STEP_RE.findall(head.log())[-1])
        second, _ = start_gang(emu, folder, tmp, n, restarts=1)
        again = wait_until(lambda: all_running(second), f"{n} relaunched node(s) running")
        resumed = wait_until(lambda: RESUMED_RE.search(second[0].log()), "the new head's resume line")
    finally:
        for node in first + second:
            node.stop()
    return Row(
        cloud=scheme,
        nodes=n,
        last_at_barrier_s=arrived - started,
        all_running_s=running - started,
        barrier_s=running - arrived,
        gang_stopped_s=stopped - noticed,
        running_again_s=again - noticed,
        steps_redone=done - int(resumed.group(1)),
    )


def operator_rows(sizes: list[int], clouds: list[str]) -> list[dict[str, Any]]:
    """TODO(issue 25, after the gang operator is merged): the operator-level rows, per cloud and size:
    task start -> the job running on every node (``CheckpointResumeOperator(num_nodes=N)`` in
    ``dag.test()`` on the emulator), that against a single node's start plus the barrier above (goal:
    within 20%), and DescribeInstances / instances.list calls per poll (``emu.request_counts()``; goal:
    one per region per poll whatever N). Return one dict per row (``cloud``, ``nodes``,
    ``task_to_all_running_s``, ``describes_per_poll``); ``main`` prints them after the agent table."""
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--clouds", nargs="+", default=["s3", "gs"], choices=["s3", "gs"])
    args = parser.parse_args()
    if "AIRFLOW_HOME" not in os.environ:  # a home of its own, removed at the end
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="cloudtrain-bench-")
        atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)

    from airflow_cloudtrain.emulator import Emulator

    tmp = Path(tempfile.mkdtemp(prefix="cloudtrain-gangs-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    print(
        "Gangs at the agent level: N agents on one run folder, the example's TCP data-parallel job; "
        "seconds, wall time\n"
    )
    print(
        "| cloud   | nodes | last at barrier | all running | barrier | gang stopped | running again "
        "| steps redone |"
    )
    print(
        "|---------|------:|----------------:|------------:|--------:|-------------:|--------------:"
        "|-------------:|"
    )
    with Emulator() as emu:
        for scheme in args.clouds:
            for n in args.sizes:
                row = measure(emu, scheme, n, tmp)
                print(
                    f"| {'EC2/S3' if scheme == 's3' else 'GCE/GCS':<7} | {n:>5} | {row.last_at_barrier_s:>15.2f} "
                    f"| {row.all_running_s:>11.2f} | {row.barrier_s:>7.2f} | {row.gang_stopped_s:>12.2f} "
                    f"| {row.running_again_s:>13.2f} | {row.steps_redone:>12} |",
                    flush=True,
                )
    rows = operator_rows(args.sizes, args.clouds)
    if not rows:
        print("\noperator-level rows (task start -> every node running; describes per poll): not yet")
    for item in rows:
        print(item)
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

The operator-level rows (``--levels operator``; ``operator_rows``): ``CloudTrainOperator(num_nodes=N)``
in ``dag.test()`` (blocking) on the emulated EC2 / GCE, the job ``sleep 5``, after one unreported
1-node run per cloud (the first run in a process pays one-off costs):

  task start -> all running   the task instance's start_date -> the last node's ``job_started_at``
  barrier                     the last node's barrier record -> that (0 for one node)
  1 node + barrier            the 1-node row's figure plus this row's barrier: issue 25's goal is a
                              gang's start within 20% of it ("ratio" is ours over it)
  describes / poll            DescribeInstances (EC2) or instances.aggregatedList + list + get (GCE)
                              the emulator served between the wait's first and last poll, divided by
                              the polls (goal: one per region per poll whatever N)

    python benchmarks/gangs.py [--sizes 1 2 4 8] [--clouds s3 gs] [--levels agent operator] [--quick]
"""

from __future__ import annotations

import argparse
import atexit
import logging
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


OPERATOR_CLOUDS = {  # run-folder scheme -> (cloud, bucket, region)
    "s3": ("ec2spot", "s3://cloudtrain-emulated/gang-bench", "us-east-1"),
    "gs": ("gcspot", "gs://cloudtrain-emulated/gang-bench", "us-central1"),
}
DESCRIBE_CALLS = {
    "s3": ("DescribeInstances",),
    "gs": ("instances.aggregatedList", "instances.list", "instances.get"),
}
OPERATOR_JOB_S = 5.0  # the job sleeps this long: long enough for several polls of a running gang
OPERATOR_POLL_S = 0.5


@dataclass
class OperatorRow:
    cloud: str
    nodes: int
    task_to_all_running_s: float  # the task instance's start_date -> the last node's job_started_at
    barrier_s: float  # the last node's barrier record -> the last job_started_at (0 for one node)
    polls: int
    describes_per_poll: float
    operations_per_poll: float  # GCE only: zoneOperations.list calls (describe's preemption check)
    state: str


class PollCounter:
    """Counts the wait's polls and the describe calls between them: wraps ``decide`` of the gang's
    watch (one call per poll; a single node's wait calls ``RunWatch.decide`` once per poll) and
    snapshots the emulator's request counts at each, so describes made while the gang runs, divided
    by the polls in between, is the figure (the launch's and the release's calls are outside)."""

    def __init__(self, emu: Any) -> None:
        from airflow_cloudtrain.core import waiting

        self.emu, self.waiting = emu, waiting
        self.gang: list[dict[str, int]] = []
        self.single: list[dict[str, int]] = []
        self._saved = (waiting.GangWatch.decide, waiting.RunWatch.decide)
        gang_decide, run_decide = self._saved
        inside = {"gang": 0}

        def on_gang(watch: Any, *args: Any, **kwargs: Any) -> Any:
            self.gang.append(emu.request_counts())
            inside["gang"] += 1
            try:
                return gang_decide(watch, *args, **kwargs)
            finally:
                inside["gang"] -= 1

        def on_run(watch: Any, *args: Any, **kwargs: Any) -> Any:
            if not inside["gang"]:
                self.single.append(emu.request_counts())
            return run_decide(watch, *args, **kwargs)

        waiting.GangWatch.decide = on_gang  # type: ignore[method-assign,assignment]
        waiting.RunWatch.decide = on_run  # type: ignore[method-assign,assignment]

    def close(self) -> None:
        self.waiting.GangWatch.decide, self.waiting.RunWatch.decide = self._saved  # type: ignore[method-assign]

    def per_poll(self, names: tuple[str, ...]) -> tuple[int, float]:
        """(polls, calls of ``names`` per poll) between the first and the last poll."""
        snaps = self.gang or self.single
        if len(snaps) < 2:
            return len(snaps), float("nan")
        calls = sum(snaps[-1].get(n, 0) - snaps[0].get(n, 0) for n in names)
        return len(snaps), calls / (len(snaps) - 1)


def operator_dag(dags: Path, dag_id: str, scheme: str, n: int) -> Any:
    import importlib.util

    cloud, bucket, region = OPERATOR_CLOUDS[scheme]
    path = dags / f"{dag_id}.py"
    path.write_text(
        "from datetime import datetime\n"
        "from airflow.sdk import DAG\n"
        "from airflow_cloudtrain.operators import CloudTrainOperator\n"
        f"with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:\n"
        f"    CloudTrainOperator(task_id='train', cloud={cloud!r}, cpus=2, ram='4g', region={region!r},\n"
        f"        command='sleep {OPERATOR_JOB_S:g}', bucket={bucket!r}, num_nodes={n},\n"
        f"        poll_interval={OPERATOR_POLL_S}, live_prices=False)\n"
    )
    spec = importlib.util.spec_from_file_location(f"gang_bench_{dag_id}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def measure_operator(emu: Any, dags: Path, scheme: str, n: int) -> OperatorRow:
    """One ``dag.test()`` of ``CloudTrainOperator(num_nodes=n)`` running ``sleep``, blocking."""
    from airflow_cloudtrain.contract import runs
    from airflow_cloudtrain.storage import open_run_folder

    cloud, bucket, _ = OPERATOR_CLOUDS[scheme]
    dag_id = f"gang_bench_{scheme}_{n}_{uuid.uuid4().hex[:6]}"
    dag = operator_dag(dags, dag_id, scheme, n)
    counter = PollCounter(emu)
    try:
        run = dag.test()
    finally:
        counter.close()
    ti = run.get_task_instance("train")
    result = ti.xcom_pull(task_ids="train") or {}
    ids = [node["instance_id"] for node in result.get("nodes") or []] or [result.get("instance_id")]
    key = runs.RunKey(dag_id, "train", run.run_id, -1, bucket)
    folder = open_run_folder(runs.join(bucket, key.path()))
    started = []
    for iid in ids:
        text = folder.get_text(runs.status_key(iid)) if iid else None
        status = runs.RunStatus.from_json(text) if text else None
        if status is None or status.job_started_at is None:
            raise RuntimeError(f"{cloud} x{n}: node {iid} never reported its job started ({ti.state})")
        started.append(float(status.job_started_at))
    all_running = max(started)
    arrived = last_arrival(folder, n) if n > 1 else all_running
    polls, describes = counter.per_poll(DESCRIBE_CALLS[scheme])
    _, operations = counter.per_poll(("zoneOperations.list",))
    left = [i["id"] for i in emu.running_instances()]
    if left:
        raise RuntimeError(f"{cloud} x{n}: instances left running: {left}")
    return OperatorRow(
        cloud=scheme,
        nodes=n,
        task_to_all_running_s=all_running - ti.start_date.timestamp(),
        barrier_s=all_running - arrived,
        polls=polls,
        describes_per_poll=describes,
        operations_per_poll=operations if scheme == "gs" else 0.0,
        state=str(ti.state),
    )


def prepare_dags_folder() -> Path:
    """A DAGs folder in the AIRFLOW_HOME and a migrated metadata DB (``dag.test()`` needs both)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    dags = home / "dags"
    dags.mkdir(exist_ok=True)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # the table, not the task logs
    os.environ.setdefault("CLOUDTRAIN_CACHE_DIR", str(home / "cache"))
    from airflow.utils import db

    db.initdb()
    return dags


def operator_rows(emu: Any, dags: Path, sizes: list[int], clouds: list[str]) -> list[OperatorRow]:
    """Issue 25's operator-level rows, per cloud and size, printed as they come: task start -> the
    job running on every node, against a single node's start plus the barrier (goal: within 20%),
    and describe calls per poll (goal: one per region per poll whatever N)."""
    print(
        f"\nGangs at the operator level: CloudTrainOperator(num_nodes=N) in dag.test() (blocking, "
        f"poll_interval={OPERATOR_POLL_S:g} s), the job `sleep {OPERATOR_JOB_S:g}`; seconds, wall time; "
        "goal: N nodes within 20% of (1 node + the barrier), one describe per poll\n"
    )
    print(
        "| cloud   | nodes | task start -> all running | barrier | 1 node + barrier | ratio "
        "| polls | describes / poll | zoneOperations.list / poll | task    |"
    )
    print(
        "|---------|------:|--------------------------:|--------:|-----------------:|------:"
        "|------:|-----------------:|---------------------------:|---------|"
    )
    rows: list[OperatorRow] = []
    for scheme in clouds:
        # one run first, not reported: the first in a process also pays one-off costs (the agent's
        # zip, the catalog, imports), 20-40 s here, which would make the 1-node baseline meaningless
        measure_operator(emu, dags, scheme, 1)
        base: float | None = None
        for n in sizes:
            row = measure_operator(emu, dags, scheme, n)
            rows.append(row)
            if n == 1:
                base = row.task_to_all_running_s
            goal = base + row.barrier_s if base is not None else None
            ratio = f"{row.task_to_all_running_s / goal:>5.2f}" if goal else "    -"
            ops = f"{row.operations_per_poll:.2f}" if scheme == "gs" else "-"
            print(
                f"| {'EC2' if scheme == 's3' else 'GCE':<7} | {n:>5} | {row.task_to_all_running_s:>25.2f} "
                f"| {row.barrier_s:>7.2f} | {goal if goal is not None else float('nan'):>16.2f} | {ratio} "
                f"| {row.polls:>5} | {row.describes_per_poll:>16.2f} | {ops:>26} | {row.state:<7} |",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--clouds", nargs="+", default=["s3", "gs"], choices=["s3", "gs"])
    parser.add_argument("--levels", nargs="+", default=["agent", "operator"], choices=["agent", "operator"])
    parser.add_argument("--quick", action="store_true", help="sizes 1 and 2 only")
    args = parser.parse_args()
    if args.quick:
        args.sizes = [1, 2]
    if "AIRFLOW_HOME" not in os.environ:  # a home of its own, removed at the end
        os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="cloudtrain-bench-")
        atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
    dags = prepare_dags_folder() if "operator" in args.levels else None

    from airflow_cloudtrain.emulator import Emulator

    tmp = Path(tempfile.mkdtemp(prefix="cloudtrain-gangs-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    with Emulator() as emu:
        # the GCS emulator logs every read of a missing object (each status poll before the agent
        # wrote one) at ERROR; it would bury the tables
        logging.getLogger("gcp_storage_emulator.storage").setLevel(logging.CRITICAL)
        if "agent" in args.levels:
            agent_rows(emu, tmp, args.sizes, args.clouds)
        if dags is not None:
            operator_rows(emu, dags, args.sizes, args.clouds)
    return 0


def agent_rows(emu: Any, tmp: Path, sizes: list[int], clouds: list[str]) -> None:
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
    for scheme in clouds:
        for n in sizes:
            row = measure(emu, scheme, n, tmp)
            print(
                f"| {'EC2/S3' if scheme == 's3' else 'GCE/GCS':<7} | {n:>5} | {row.last_at_barrier_s:>15.2f} "
                f"| {row.all_running_s:>11.2f} | {row.barrier_s:>7.2f} | {row.gang_stopped_s:>12.2f} "
                f"| {row.running_again_s:>13.2f} | {row.steps_redone:>12} |",
                flush=True,
            )


if __name__ == "__main__":
    sys.exit(main())

"""Issue 25's GPU check with the real agents: two agent processes as the two nodes of one gang.

``torchrun_gang.py`` drives ``CheckpointSync`` by hand; here every node is the agent itself
(``python -m airflow_cloudtrain.agent``), as on an instance: it reads the run's spec from a ``gs://``
run folder (our GCS emulator, on this machine), finds its rank in ``nodes/ranks.json``, meets the
other node at the barrier, runs the job with the gang's environment (``MASTER_ADDR``, ``NODE_RANK``,
...), syncs the head's checkpoint directory every ``checkpoint_interval_s``, and on a stop signals
the job, syncs the last checkpoint and reports. The job is ``torchrun --nnodes=2 --nproc_per_node=1
--node_rank=$NODE_RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT gang_train.py`` (a small
deterministic DDP model on the GPU; gloo, since NCCL refuses two ranks on one GPU). Each node has its
own private address on the loopback range, served by the emulated metadata service, as the
emulator's instances do.

This script plays the operator's engine (``lifecycle.run.gang``), which needs Airflow: it writes the
spec and the ranks, and when a node is lost it stops the gang (SIGTERM to every other node's agent, as
a terminated instance gets), clears ``nodes/`` and launches a new gang of new instances.

1. Reference: one gang, uninterrupted. Its final weights are the reference.
2. The same run, interrupted twice: once the head has uploaded a checkpoint at a random step, rank 1's
   machine vanishes (SIGKILL to every process of it, no notice). The new gang resumes; once its head
   has uploaded a checkpoint well past that, the head gets a preemption notice from the metadata
   service (the agent stops its job, syncs, and ends ``interrupted``). The third gang runs to the end.

Checked: every rank of each new gang restored the head's last uploaded checkpoint (the agent's
``restored_step`` and the job's own ``resumed from step N``); the final weights equal the reference's
bit for bit; the statuses are what the engine reads. ``python agent_gang.py [--out DIR] [--seed N]``.
Needs ``google-cloud-storage`` and ``gcp-storage-emulator`` importable (the device run carries them as
wheels, see docs/gpu_checks.md); torch with ``DEVICE_CHECK_CPU=1`` runs it on a CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import table  # noqa: E402

from airflow_cloudtrain.contract import gang, runs  # noqa: E402
from airflow_cloudtrain.storage import RunFolder, open_run_folder  # noqa: E402

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "gang_train.py"
REPO = next((p for p in (HERE, HERE.parent, HERE.parents[1]) if (p / "airflow_cloudtrain").is_dir()), HERE)
BUCKET = "devcheck"
MARK = "CLOUDTRAIN_DEVCHECK_MACHINE"  # every process of one emulated machine carries it
STEPS, EVERY, STEP_S = 300, 20, 0.03


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def machine_pids(iid: str) -> list[int]:
    """The processes of one emulated machine: those whose environment carries its mark."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if f"{MARK}={iid}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


class Node:
    """One instance of the gang: an agent process with its own id, address, workdir and log."""

    def __init__(self, meta: Any, folder: RunFolder, work: Path, address: str, gcs: str) -> None:
        self.iid = f"vm-{uuid.uuid4().hex[:10]}"
        self.folder, self.address = folder, address
        meta.set_address(self.iid, address)
        self.meta = meta
        self.log_path = work / f"agent-{self.iid}.log"
        env = {
            **os.environ,
            MARK: self.iid,
            "STORAGE_EMULATOR_HOST": gcs,
            "GCE_METADATA_HOST": meta.gce_host_for(self.iid),
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", folder.uri]
        argv += ["--instance-id", self.iid, "--workdir", str(work / self.iid)]
        with open(self.log_path, "wb") as sink:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def vanish(self) -> None:
        """The machine is gone at once: every process of it gets SIGKILL (no notice, no last sync)."""
        for _ in range(3):  # a job process forked while we looked is caught by the next pass
            for pid in machine_pids(self.iid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def terminate(self, grace: float = 60.0) -> None:
        """As a terminated instance: SIGTERM to the agent, then the machine goes after ``grace``."""
        if self.alive():
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        self.vanish()

    def preempt(self) -> None:
        """A GCE preemption notice on the metadata service (the agent polls it)."""
        self.meta.set_preempted(self.iid)

    def status(self) -> runs.RunStatus | None:
        text = self.folder.get_text(runs.status_key(self.iid))
        return runs.RunStatus.from_json(text) if text else None

    def job_log(self) -> str:
        keys = self.folder.list(runs.log_prefix(self.iid))
        return runs.strip_stamps(b"".join(self.folder.get_bytes(k) or b"" for k in keys).decode())

    def agent_log(self) -> str:
        return self.log_path.read_text(errors="replace")


def newest_step(folder: RunFolder) -> int | None:
    """The step of the newest complete checkpoint version in the run folder."""
    versions = runs.manifest_versions(folder.list(runs.CHECKPOINTS_PREFIX + "/"))
    for version in sorted(versions, reverse=True):
        text = folder.get_text(runs.manifest_key(version))
        if text:
            return runs.Manifest.from_json(text).step
    return None


def job_command() -> str:
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = str(torchrun) if torchrun.exists() else f"{sys.executable} -m torch.distributed.run"
    return (
        f"exec {launcher} --nnodes=$NNODES --nproc_per_node=1 --node_rank=$NODE_RANK"
        f" --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT {TRAIN}"
    )


class Run:
    """One run folder and the gangs launched on it, the engine's part played here."""

    def __init__(
        self, name: str, meta: Any, gcs: str, work: Path, final: Path, addresses: list[str], dcp: bool = False
    ) -> None:
        self.folder = open_run_folder(f"gs://{BUCKET}/runs/{name}")
        self.dcp = dcp
        self.meta, self.gcs, self.work, self.final = meta, gcs, work, final
        self.addresses = addresses
        self.gangs: list[list[Node]] = []

    def launch(self) -> list[Node]:
        """A new gang: a new spec (new port), ``nodes/`` cleared, two new instances, their ranks."""
        ips = self.addresses[2 * len(self.gangs) : 2 * len(self.gangs) + 2]
        spec = runs.RunSpec(
            run_id=f"ct-devcheck-{self.folder.uri.rsplit('/', 1)[-1]}",
            run_uri=self.folder.uri,
            cloud="gcspot",
            command=job_command(),
            gpus=1,
            num_nodes=2,
            master_port=free_port(ips[0]),
            gang_timeout_s=120,
            checkpoint_interval_s=1.0,
            log_interval_s=0.5,
            heartbeat_interval_s=1.0,
            metadata_poll_s=0.5,
            stop_grace_s=20,
            checkpoint_ranks="all" if self.dcp else "head",
            env={
                **({"GANG_DCP": "1"} if self.dcp else {}),
                "GANG_BACKEND": "gloo",
                "GANG_STEPS": str(STEPS),
                "GANG_EVERY": str(EVERY),
                "GANG_STEP_S": str(STEP_S),
                "GANG_FINAL": str(self.final),
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
        )
        self.folder.put_text(runs.SPEC_KEY, spec.to_json())
        self.spec = spec
        self.folder.delete_prefix(gang.NODES_PREFIX)
        nodes = [Node(self.meta, self.folder, self.work, ip, self.gcs) for ip in ips]
        self.folder.put_text(gang.RANKS_KEY, gang.ranks_json([n.iid for n in nodes]))
        self.gangs.append(nodes)
        return nodes

    def restorable(self) -> int | None:
        """The step a new gang restores: the head's newest, or with every rank's own checkpoints the
        newest step every rank has (``agent.gang.common_steps``, as the agents pick it)."""
        if not self.dcp:
            return newest_step(self.folder)
        from airflow_cloudtrain.agent.gang import common_steps

        common = common_steps(self.folder, self.spec, lambda _: None)
        return max(common) if common else None

    def stop(self, nodes: list[Node]) -> None:
        """The engine's stop of a gang that lost a node: every node still up is terminated."""
        for node in nodes:
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)
        for node in nodes:
            node.terminate()


def wait_until(what: str, check: Any, timeout: float, nodes: list[Node]) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if not all(n.alive() for n in nodes):
            raise RuntimeError(f"a node ended while waiting for {what}")
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def wait_ended(nodes: list[Node], timeout: float) -> None:
    end = time.monotonic() + timeout
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=max(1.0, end - time.monotonic()))
    for node in nodes:
        node.vanish()


def weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument(
        "--dcp", action="store_true", help='every rank saves sharded with DCP, checkpoint_ranks="all"'
    )
    a = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the cap: still reap
    rng = random.Random(a.seed)
    out = Path(a.out or tempfile.mkdtemp(prefix="agent-gang-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="agent-gang-"))
    from airflow_cloudtrain.emulator.gcp.gcs import GcsServer
    from airflow_cloudtrain.emulator.metadata import MetadataServer

    gcs = GcsServer()
    endpoint = gcs.start()
    gcs.create_bucket(BUCKET)
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    meta = MetadataServer().start()
    addresses = [f"127.0.7.{i}" for i in range(1, 9)]
    all_nodes: list[Node] = []
    problems: list[str] = []
    rows: list[list[str]] = []
    try:
        # 1. the reference
        ref = Run("reference", meta, endpoint, work, work / "final-reference.pt", addresses, a.dcp)
        started = time.monotonic()
        nodes = ref.launch()
        all_nodes += nodes
        wait_ended(nodes, 300)
        ref_s = time.monotonic() - started
        states = [(n.status() or runs.RunStatus(state="none")).state for n in nodes]
        if states != [runs.SUCCEEDED] * 2:
            problems.append(f"reference gang ended {states}")
        # 2. the interrupted run
        run = Run("interrupted", meta, endpoint, work, work / "final-interrupted.pt", addresses, a.dcp)
        losses = [(1, False, rng.randrange(3, 9) * EVERY), (0, True, None)]
        started = time.monotonic()
        restored_from: list[int | None] = [None]
        for victim, notice, at in losses:
            nodes = run.launch()
            all_nodes += nodes
            base = restored_from[-1] or 0
            target = at if at is not None else base + rng.randrange(3, 6) * EVERY
            step = wait_until(
                f"a checkpoint at step {target}",
                lambda t=target: (s := newest_step(run.folder)) is not None and s >= t and s,
                240,
                nodes,
            )
            lost = nodes[victim]
            if notice:
                lost.preempt()  # the agent stops its job, syncs, reports interrupted
                with contextlib.suppress(subprocess.TimeoutExpired):
                    lost.proc.wait(timeout=60)
                lost.vanish()
            else:
                lost.vanish()
            run.stop(nodes)  # the engine's gang stop: the rest are terminated
            kept = run.restorable()
            if kept is None:  # the new gang would start from scratch: the silent restart to avoid
                problems.append(f"gang {len(run.gangs)}: no checkpoint step to resume from after the loss")
            restored_from.append(kept)
            head = nodes[0].status()
            rows.append(
                [
                    str(len(run.gangs)),
                    f"rank {victim} {'preemption notice' if notice else 'vanished (SIGKILL, no notice)'}",
                    str(step),
                    f"{head.state if head else '-'} ({head.message[:60] if head else ''})",
                    str(kept),
                ]
            )
        nodes = run.launch()
        all_nodes += nodes
        wait_ended(nodes, 300)
        int_s = time.monotonic() - started
        states = [(n.status() or runs.RunStatus(state="none")).state for n in nodes]
        rows.append([str(len(run.gangs)), "none: runs to the end", "-", f"{states}", "-"])
        if states != [runs.SUCCEEDED] * 2:
            problems.append(f"last gang ended {states}")
        # what each gang restored, by the agent's status and the job's own line
        resumed_table: list[list[str]] = []
        for number, gang_nodes in enumerate(run.gangs, 1):
            expected = restored_from[number - 1]
            for rank, node in enumerate(gang_nodes):
                status = node.status()
                restored = status.restored_step if status else None
                said = [int(x) for x in re.findall(r"resumed from step (\d+)", node.job_log())]
                resumed_table.append([str(number), str(rank), node.iid, str(restored), str(said)])
                if expected is not None and restored != expected:
                    problems.append(f"gang {number} rank {rank} restored {restored}, expected {expected}")
                if expected is not None and said and said[0] != expected:
                    problems.append(
                        f"gang {number} rank {rank}'s job resumed from {said[0]}, expected {expected}"
                    )
                if expected is not None and not said:
                    problems.append(f"gang {number} rank {rank}'s job never said where it resumed")
        # the final weights
        import torch

        mine, theirs = weights(run.final), weights(ref.final)
        equal = mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        diff = max(float((mine[k] - theirs[k]).abs().max()) for k in mine)
        if not equal:
            problems.append(f"final weights differ from the reference's (max abs diff {diff})")
        text = (
            f"torch {torch.__version__}; cuda {torch.cuda.is_available() and not os.environ.get('DEVICE_CHECK_CPU')}"
            f"; seed {a.seed}; {STEPS} steps, a checkpoint every {EVERY}"
            + ("; sharded DCP saves by every rank, checkpoint_ranks='all'" if a.dcp else "")
            + "\n\n"
            + table(["gang", "lost", "at head's upload of step", "head's status", "newest step kept"], rows)
            + "\n"
            + table(
                ["gang", "rank", "instance", "agent restored step", "job said resumed from"], resumed_table
            )
            + f"\nreference: {ref_s:.1f} s; interrupted run, three gangs: {int_s:.1f} s; final weights "
            + ("equal (bitwise)" if equal else "DIFFERENT")
            + f", max abs diff {diff}\n"
        )
    except Exception as err:  # the table says what went wrong; logs follow
        problems.append(f"{type(err).__name__}: {err}")
        text = table(["gang", "lost", "at", "head", "kept"], rows)
    finally:
        for node in all_nodes:
            node.vanish()
        logs = []
        for node in all_nodes:
            logs.append(f"===== {node.iid} agent\n{node.agent_log()[-6000:]}\n===== {node.iid} job\n")
            with contextlib.suppress(Exception):
                logs.append(node.job_log()[-6000:])
        (out / f"agent_gang{'_dcp' if a.dcp else ''}_logs.txt").write_text("\n".join(logs))
        meta.stop()
        gcs.stop()
    text += "\n" + ("problems: " + json.dumps(problems) if problems else "ok") + "\n"
    (out / f"agent_gang{'_dcp' if a.dcp else ''}_table.md").write_text(text)
    print(text, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 25's GPU check at the level one machine allows: a gang of two ``torchrun`` "nodes", one lost.

Each node is its own ``torchrun --nnodes=2 --nproc_per_node=1 --node_rank=R --master_addr=127.0.0.1
--master_port=P`` process with the environment ``contract.gang.node_env`` gives every node's job,
running ``gang_train.py`` (a small deterministic DDP model; rank 0 checkpoints every few steps with our
convention). The backend is NCCL when a two-rank all-reduce works on this machine's one GPU, else
gloo (NCCL refuses two ranks on one GPU); the table says which.

1. An uninterrupted run of the gang: its final weights are the reference.
2. The same run, with the agent's ``CheckpointSync`` syncing rank 0's checkpoint directory into an
   in-memory run folder every 0.3 s. At a random point after rank 0's second save, rank 1's training
   process is SIGKILLed; the gang is stopped as the agent stops it (rank 0's ``torchrun`` gets SIGTERM,
   then SIGKILL after a grace); ``job_ended(at, killed=True)``, a last sync.
3. ``restore()`` into a fresh checkpoint directory for each rank; both ranks are relaunched, resume
   from the restored checkpoint and run to the end.

Checked: both ranks resume from the manifest's step, a step rank 0 had completely saved; the final
weights equal the uninterrupted run's bit for bit (same seed, data a function of (step, rank),
``torch.use_deterministic_algorithms``, a two-rank sum is order-free, and the checkpoint holds the
model and the optimizer's momentum exactly), the largest difference is printed either way.
``python torchrun_gang.py [--out DIR] [--backend auto|nccl|gloo] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Job, MemoryFolder, SyncLoop, new_sync, reap_on_exit, table  # noqa: E402

from airflow_cloudtrain.contract.gang import node_env  # noqa: E402

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "gang_train.py"
# the package the checks import: a copy beside the scripts (the device run), else the repo's
REPO = next((p for p in (HERE, HERE.parent, HERE.parents[1]) if (p / "airflow_cloudtrain").is_dir()), HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gang:
    """Two torchrun nodes of one gang on this machine."""

    def __init__(self, work: Path, name: str, backend: str, steps: int, every: int, step_s: float) -> None:
        port = free_port()
        self.nodes: list[Job] = []
        self.ckpts = [work / name / f"rank{r}" for r in (0, 1)]
        self.final = work / name / "final.pt"
        for rank in (0, 1):
            self.ckpts[rank].mkdir(parents=True, exist_ok=True)
            env = node_env(rank, ["127.0.0.1", "127.0.0.1"], gpus_per_node=1, port=port)
            env.update(
                GANG_BACKEND=backend,
                GANG_CKPT=str(self.ckpts[rank]),
                GANG_FINAL=str(self.final),
                GANG_STEPS=str(steps),
                GANG_EVERY=str(every),
                GANG_STEP_S=str(step_s),
                PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            )
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={env['NNODES']}"]
            cmd += ["--nproc_per_node=1", f"--node_rank={env['NODE_RANK']}"]
            cmd += [f"--master_addr={env['MASTER_ADDR']}", f"--master_port={env['MASTER_PORT']}", str(TRAIN)]
            self.nodes.append(Job(cmd, work / f"gang_{name}_rank{rank}.log", env))

    def finish(self, timeout: float) -> list[int]:
        return [node.finish(timeout) for node in self.nodes]

    def stop(self, grace: float = 15.0) -> None:
        """The agent's stop of the gang: SIGTERM to every node still running, SIGKILL after a grace."""
        for node in self.nodes:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(n.proc.poll() is None for n in self.nodes):
            time.sleep(0.05)
        for node in self.nodes:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.finish(30)


def probe(work: Path, want: str) -> tuple[str, str]:
    """The backend to use, and why."""
    import torch

    if want != "auto":
        return want, "asked for"
    if not torch.cuda.is_available() or os.environ.get("DEVICE_CHECK_CPU"):
        return "gloo", "no GPU: gloo"
    gang = Gang(work, "probe", "nccl", 0, 1, 0.0)
    codes = gang.finish(45)
    lines = [line for node in gang.nodes for line in node.lines]
    if codes == [0, 0] and sum("probe 2" in line for line in lines) == 2:
        return "nccl", "NCCL all-reduce of two ranks on one GPU worked"
    errors = [line for line in lines if "Error" in line or "error" in line][:2]
    return "gloo", f"NCCL refused two ranks on one GPU (rc {codes}: {' / '.join(errors)[:300]}); gloo"


def weights(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo"])
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.01)
    a = parser.parse_args()
    reap_on_exit()
    import torch

    out = Path(a.out or tempfile.mkdtemp(prefix="gang-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gang-"))
    rng = random.Random(a.seed)
    backend, why = probe(work, a.backend)
    print(f"seed {a.seed}; backend {backend}: {why}", flush=True)
    problems: list[str] = []

    # 1. the reference: uninterrupted
    began = time.monotonic()
    ref = Gang(work, "reference", backend, a.steps, a.every, a.step_s)
    if ref.finish(240) != [0, 0] and torch.cuda.is_available() and not os.environ.get("DEVICE_CHECK_CPU"):
        why += f"; {backend} on CUDA tensors failed, so the model is on the CPU"
        os.environ["DEVICE_CHECK_CPU"] = "1"  # every later node inherits it
        ref = Gang(work, "reference-cpu", backend, a.steps, a.every, a.step_s)
        ref.finish(240)
    if any(node.proc.returncode != 0 for node in ref.nodes):
        problems.append("the uninterrupted gang failed")
    ref_s = time.monotonic() - began

    # 2. interrupted: rank 1's process killed, the gang stopped, a last sync
    gang = Gang(work, "interrupted", backend, a.steps, a.every, a.step_s)
    folder, notes = MemoryFolder(), []
    sync = new_sync(folder, gang.ckpts[0], notes)
    loop = SyncLoop(sync, 0.3)
    loop.start()
    target = rng.randint(2, max(2, a.steps // a.every - 3))
    head, lost = gang.nodes
    killed_pid = None
    if head.wait_for(r"\] saved \d+", 240, count=target) and lost.wait_for(r"\] pid \d+", 30):
        time.sleep(rng.uniform(0, a.every * a.step_s))
        killed_pid = lost.ints(r"\] pid (\d+)")[0]
        os.kill(killed_pid, signal.SIGKILL)  # the node is lost
        end = time.monotonic() + 30
        while time.monotonic() < end and lost.proc.poll() is None:
            time.sleep(0.05)
    else:
        problems.append(f"the gang ended or stalled before {target} saves of rank 0")
    gang.stop()
    ended = time.time()
    loop.stop()
    sync.job_ended(ended, killed=True)
    sync.sync()
    saved = head.ints(r"\] saved (\d+)")
    manifest = sync.last_manifest
    manifest_step = manifest.step if manifest else None
    interrupted_done = [n.ints(r"\] done (\d+)") for n in gang.nodes]
    if any(interrupted_done):
        problems.append(f"the interrupted gang finished anyway ({interrupted_done}): no interruption")

    # 3. relaunch from the restored checkpoint, every rank from its own fresh directory
    began = time.monotonic()
    resumed_gang_dirs = []
    for rank in (0, 1):
        fresh = work / "resumed" / f"rank{rank}"
        shutil.rmtree(fresh, ignore_errors=True)
        restored = new_sync(folder, fresh, []).restore()
        if restored is None or restored.step != manifest_step:
            problems.append(f"rank {rank}: restored {restored} is not the manifest's step {manifest_step}")
        resumed_gang_dirs.append(sorted(p.name for p in fresh.iterdir()))
    resumed = Gang(work, "resumed", backend, a.steps, a.every, a.step_s)
    codes = resumed.finish(240)
    resume_s = time.monotonic() - began
    starts = [node.ints(r"\] resumed from step (\d+)") for node in resumed.nodes]
    if codes != [0, 0]:
        problems.append(f"the resumed gang failed (rc {codes})")
    if any(s != [manifest_step] for s in starts):
        problems.append(f"ranks resumed from {starts}, the manifest says {manifest_step}")
    if manifest_step not in saved:
        problems.append(f"the manifest's step {manifest_step} is not one rank 0 saved ({saved})")
    diff, equal = None, False
    if ref.final.is_file() and resumed.final.is_file():
        a_w, b_w = weights(ref.final), weights(resumed.final)
        equal = a_w.keys() == b_w.keys() and all(torch.equal(a_w[k], b_w[k]) for k in a_w)
        diff = max(float((a_w[k] - b_w[k]).abs().max()) for k in a_w)
        if not equal:
            problems.append(f"final weights differ from the uninterrupted run's (max |diff| {diff:.3g})")
    else:
        problems.append("a final weights file is missing")
    on_gpu = torch.cuda.is_available() and not os.environ.get("DEVICE_CHECK_CPU")
    device = "cuda (" + torch.cuda.get_device_name(0) + ")" if on_gpu else "cpu"
    result = "FAIL: " + "; ".join(problems) if problems else "ok"
    header = [
        "gang",
        "backend",
        "device",
        "steps / every",
        "rank 0 saved before the kill",
        "versions",
        "manifest step",
        "resumed from (rank 0, rank 1)",
        "final weights vs uninterrupted",
        "result",
    ]
    row = [
        "2 nodes x 1 proc (torchrun, node_env)",
        backend,
        device,
        f"{a.steps} / {a.every}",
        f"{len(saved)} (newest {max(saved, default=None)})",
        str(folder.manifests_written()),
        str(manifest_step),
        str([s[0] if s else None for s in starts]),
        ("equal (bitwise)" if equal else "different") + f", max abs diff {diff}",
        result,
    ]
    text = f"torch {torch.__version__}; backend: {why}; seed {a.seed}\n\n" + table(header, [row])
    text += (
        f"\n- rank 1's training process (pid {killed_pid}) got SIGKILL; the gang was stopped (SIGTERM "
        f"then SIGKILL to the other node); restored files per rank: {resumed_gang_dirs}; uninterrupted "
        f"run {ref_s:.1f} s, restore + resumed run {resume_s:.1f} s; agent notes: {notes[-2:]}\n"
    )
    print(text, flush=True)
    (out / "gang_table.md").write_text(text)
    logs = "".join(
        f"==== {p.name}\n{p.read_text(errors='replace')[-12000:]}\n" for p in sorted(work.glob("gang_*.log"))
    )
    (out / "gang_logs.txt").write_text(logs)
    print(json.dumps({"problems": problems}), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

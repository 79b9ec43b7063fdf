"""One rank of ``torchrun_gang.py``'s gang: a small DDP model, deterministic, checkpointed by rank 0.

Run by ``torchrun`` (it reads ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``).
``GANG_BACKEND`` (``nccl`` or ``gloo``), ``GANG_CKPT`` (this rank's checkpoint directory; under the
agent, ``agent_gang.py``, the agent's ``CLOUDTRAIN_CHECKPOINT_DIR``),
``GANG_FINAL`` (where rank 0 writes the final weights), ``GANG_STEPS``, ``GANG_EVERY``, ``GANG_STEP_S``;
``GANG_DCP`` set: every rank saves with ``torch.distributed.checkpoint`` (sharded: each node's own
shard, the coordinator's ``.metadata``) and resumes with ``dcp.load``.
Rank 0 saves ``step-NNNNNN.pt`` every ``GANG_EVERY`` steps with our convention's helper
(``airflow_cloudtrain.checkpoint.save``: a temporary name, then a rename); every rank resumes from
``checkpoint.latest`` of its own directory (the restored head's checkpoint). The data of a step is a
function of (step, rank) alone and the algorithms are deterministic, so an interrupted and resumed run
ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from airflow_cloudtrain import checkpoint


def say(text: str) -> None:
    print(f"[rank {os.environ.get('RANK')}] {text}", flush=True)


def dcp_state(ddp: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(ddp, optim)
    return {"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}


def dcp_save(ddp: torch.nn.Module, optim: torch.optim.Optimizer, ckpt: str, step: int) -> None:
    """DCP's save of the model and optimizer into ``<ckpt>/step-NNNNNN/``: each rank writes its own
    ``__<rank>_0.distcp`` there (this node's disk), the coordinator also ``.metadata``."""
    import torch.distributed.checkpoint as dcp

    dcp.save(dcp_state(ddp, optim, step), checkpoint_id=os.path.join(ckpt, f"step-{step:06d}"))


def dcp_resume(ddp: torch.nn.Module, optim: torch.optim.Optimizer, ckpt: str) -> int:
    """The newest ``step-NNNNNN/`` with DCP's ``.metadata`` (the agent put every rank's files there),
    loaded by every rank; the step, or 0 when there is none (every rank must agree: it is a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    found = (
        sorted(
            p
            for p in os.listdir(ckpt)
            if p.startswith("step-") and os.path.exists(os.path.join(ckpt, p, ".metadata"))
        )
        if os.path.isdir(ckpt)
        else []
    )
    if not found:
        return 0
    state = dcp_state(ddp, optim, 0)
    dcp.load(state, checkpoint_id=os.path.join(ckpt, found[-1]))
    set_state_dict(ddp, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])


def main() -> None:
    backend = os.environ.get("GANG_BACKEND", "gloo")
    steps, every = int(os.environ["GANG_STEPS"]), int(os.environ["GANG_EVERY"])
    step_s = float(os.environ.get("GANG_STEP_S", "0.01"))
    ckpt = os.environ.get("GANG_CKPT") or os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]  # run by the agent: its dir
    use_gpu = torch.cuda.is_available() and not os.environ.get("DEVICE_CHECK_CPU")
    device = torch.device("cuda:0" if use_gpu else "cpu")  # one GPU on this machine: both ranks share it
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    say(f"pid {os.getpid()} backend {backend} device {device} world {dist.get_world_size()}")
    if steps == 0:  # the backend probe: one all-reduce across the gang
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)
        say(f"probe {probe.item():.0f}")
        dist.destroy_process_group()
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128), torch.nn.Linear(128, 1)
    ).to(device)
    ddp = DistributedDataParallel(model, device_ids=[0] if use_gpu else None)
    optim = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    start = 0
    sharded = bool(os.environ.get("GANG_DCP"))  # every rank saves with torch.distributed.checkpoint
    if sharded:
        start = dcp_resume(ddp, optim, ckpt)
    elif (latest := checkpoint.latest(ckpt)) is not None:
        state = torch.load(latest, map_location=device)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
    say(f"resumed from step {start}")
    for step in range(start + 1, steps + 1):
        gen = torch.Generator().manual_seed(10_000 * step + rank)
        x = torch.randn(32, 32, generator=gen).to(device)
        y = x.sin().sum(dim=1, keepdim=True)
        optim.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # gradients all-reduced across the gang
        optim.step()
        time.sleep(step_s)
        if sharded and step % every == 0:  # a collective: every rank into its own directory
            dcp_save(ddp, optim, ckpt, step)
            say(f"saved {step} at {time.time():.3f}")
        elif rank == 0 and step % every == 0:
            state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
            checkpoint.save(
                os.path.join(ckpt, f"step-{step:06d}.pt"), lambda tmp, s=state: torch.save(s, tmp)
            )
            say(f"saved {step} at {time.time():.3f}")
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, os.environ["GANG_FINAL"])
    dist.barrier()
    say(f"done {steps}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A small, seeded, deterministic PyTorch training job that follows the checkpoint contract.

Run by ``tests/gpu/test_gpu.py`` under the agent (``docs/checkpoints.md``): it resumes from
``checkpoint.latest($CLOUDTRAIN_CHECKPOINT_DIR)``, saves ``ckpt-<step>.pt`` with ``checkpoint.save``
every ``SAVE_EVERY`` steps (the newest three kept) and, at the end, ``final.pt`` into
``$CLOUDTRAIN_OUTPUT_DIR``. A checkpoint holds everything the next step depends on: model,
optimizer, learning-rate schedule, the CPU and CUDA random states (dropout) and the step, so a
resumed run computes bit for bit what an uninterrupted one does.

argv: total steps, seconds to sleep after each step (to give the test time to kill it). Prints
``resumed from step N`` with the ``CLOUDTRAIN_RESUMED*`` variables, then ``step N loss X`` per step
(``repr`` of the float, so losses compare exactly). Writes its pid to ``$CLOUDTRAIN_OUTPUT_DIR/pid``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from airflow_cloudtrain import checkpoint

SAVE_EVERY = 25
KEEP = 3
T_MAX = 1000  # the schedule's length: fixed, so it does not depend on how a run was started
BATCH, BATCHES = 128, 32


def main() -> None:
    total, delay = int(sys.argv[1]), float(sys.argv[2])
    ckpt_dir = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
    out_dir = Path(os.environ["CLOUDTRAIN_OUTPUT_DIR"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "pid").write_text(str(os.getpid()))

    torch.use_deterministic_algorithms(True)  # needs CUBLAS_WORKSPACE_CONFIG (set below if unset)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda"
    torch.manual_seed(0)
    # Only the random draws happen on the CPU (sequential, the same whatever the thread count); the
    # arithmetic is on the GPU, where the same kernels give the same bits in every process.
    data = torch.Generator().manual_seed(1234)
    x = torch.randn(BATCH * BATCHES, 64, generator=data).to(device)
    y = torch.sin(x @ torch.randn(64, 8, generator=data).to(device))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 8),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=T_MAX)
    step = 0

    def state() -> dict[str, object]:
        return {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(),
        }

    found = checkpoint.latest(ckpt_dir)
    if found is not None:
        saved = torch.load(found, map_location="cpu")  # the RNG states must stay CPU tensors
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["cpu_rng"])
        torch.cuda.set_rng_state(saved["cuda_rng"])
        step = int(saved["step"])
    env = {k: v for k, v in os.environ.items() if k.startswith("CLOUDTRAIN_RES")}
    params = torch.cat([p.detach().flatten().double() for p in model.parameters()])
    print(f"fingerprint x {x.double().sum().item()!r} y {y.double().sum().item()!r}", flush=True)
    print(f"fingerprint weights {params.sum().item()!r} threads {torch.get_num_threads()}", flush=True)
    print(f"resumed from step {step} ({found.name if found else 'fresh'}) env {json.dumps(env)}", flush=True)

    model.train()
    while step < total:
        rows = slice((step % BATCHES) * BATCH, (step % BATCHES + 1) * BATCH)
        loss = F.mse_loss(model(x[rows]), y[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        print(f"step {step} loss {loss.item()!r}", flush=True)
        if step % SAVE_EVERY == 0:
            checkpoint.save(ckpt_dir / f"ckpt-{step:06d}.pt", lambda tmp: torch.save(state(), tmp))
            for _, old in checkpoint.candidates(ckpt_dir)[:-KEEP]:
                old.unlink()
        time.sleep(delay)
    final = state()
    checkpoint.save(out_dir / "final.pt", lambda tmp: torch.save(final, tmp))
    print(f"done at step {step}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS call
    main()

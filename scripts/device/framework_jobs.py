"""The training jobs of ``framework_checkpoints.py``: a tiny model trained with each real framework,
checkpointing the framework's own way into ``--ckpt`` and resuming with the framework's own API.

``python framework_jobs.py FRAMEWORK --ckpt DIR --steps N --every K --step-s S [--resume]``. Prints
``resumed from step S`` (0 on a first run), ``saved N at <unix time>`` once the framework's save of
step N has returned (the file is complete), ``done N``. Heavy imports happen inside each job, so a
framework that is missing fails only its own row. The device is the GPU when there is one
(``DEVICE_CHECK_CPU=1`` forces the CPU, as on a development machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    print(text, flush=True)


def saved(step: int) -> None:
    say(f"saved {step} at {time.time():.3f}")


def torch_device() -> Any:
    import torch

    use_gpu = torch.cuda.is_available() and not os.environ.get("DEVICE_CHECK_CPU")
    return torch.device("cuda" if use_gpu else "cpu")


def mlp(width: int = 256) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.Linear(width, 1)
    )


def batch(step: int, device: Any) -> tuple[Any, Any]:
    """The data of one step, a function of the step alone (a resumed job sees the same)."""
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 32, generator=gen)
    return x.to(device), x.sum(dim=1, keepdim=True).to(device)


# -- PyTorch Lightning --------------------------------------------------------------------------------
def lightning(a: argparse.Namespace) -> None:
    import torch

    try:
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.plugins.io import TorchCheckpointIO
    except ImportError:
        import pytorch_lightning as pl  # type: ignore[no-redef]
        from pytorch_lightning.callbacks import ModelCheckpoint  # type: ignore[no-redef]
        from pytorch_lightning.plugins.io import TorchCheckpointIO  # type: ignore[no-redef]

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, data: Any, index: int) -> Any:
            x, y = data
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("gstep", float(self.global_step), on_step=True)  # what save_top_k ranks
            time.sleep(a.step_s)
            return loss

        def on_train_start(self) -> None:
            say(f"resumed from step {self.global_step}")

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3, momentum=0.9)

    class Printing(TorchCheckpointIO):  # type: ignore[misc]
        """The save returned: the file is complete. ModelCheckpoint writes ``last.ckpt`` last."""

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, path, storage_options)
            say(f"wrote {Path(path).name}")
            if Path(path).name.startswith("last"):
                saved(int(checkpoint["global_step"]))

    data = [batch(i, "cpu") for i in range(a.steps + 8)]
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    every = ModelCheckpoint(
        dirpath=a.ckpt,
        every_n_train_steps=a.every,
        save_top_k=2,
        save_last=True,
        monitor="gstep",  # save_top_k=2 needs a monitored quantity; the newest two are kept
        mode="max",
    )
    trainer = pl.Trainer(
        accelerator="gpu" if torch_device().type == "cuda" else "cpu",
        devices=1,
        max_steps=a.steps,
        callbacks=[every],
        plugins=[Printing()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Module(), loader, ckpt_path="last" if a.resume else None)
    say(f"done {trainer.global_step}")


# -- Hugging Face Trainer ---------------------------------------------------------------------------
def huggingface(a: argparse.Namespace) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    class Report(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            say(f"resumed from step {state.global_step}")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            time.sleep(a.step_s)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            saved(state.global_step)

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 8 * (a.steps + 8)

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.arange(i, i + 16) % 64
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=64, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=a.ckpt,
        max_steps=a.steps,
        save_strategy="steps",
        save_steps=a.every,
        save_total_limit=2,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=torch_device().type != "cuda",
        dataloader_num_workers=0,
        seed=0,
    )
    if a.resume:
        say(f"get_last_checkpoint: {get_last_checkpoint(a.ckpt)}")
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Report()])
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    say(f"done {trainer.state.global_step}")


# -- Orbax (JAX) ------------------------------------------------------------------------------------
def orbax(a: argparse.Namespace) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if os.environ.get("DEVICE_CHECK_CPU"):
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    state = {"w1": jax.random.normal(k1, (32, 256)) * 0.05, "w2": jax.random.normal(k2, (256, 1)) * 0.05}

    def loss(params: Any, x: Any, y: Any) -> Any:
        return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

    @jax.jit
    def update(params: Any, x: Any, y: Any) -> Any:
        grads = jax.grad(loss)(params, x, y)
        return jax.tree_util.tree_map(lambda p, g: p - 1e-3 * g, params, grads)

    options = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=a.every)
    manager = ocp.CheckpointManager(os.path.abspath(a.ckpt), options=options)
    start = 0
    if a.resume:
        latest = manager.latest_step()
        if latest is not None:
            state = manager.restore(latest, args=ocp.args.StandardRestore(state))
            start = int(latest)
    say(f"resumed from step {start} on {jax.devices()[0].platform}")
    for step in range(start + 1, a.steps + 1):
        gen = jax.random.PRNGKey(1000 + step)
        x = jax.random.normal(gen, (16, 32))
        state = update(state, x, x.sum(axis=1, keepdims=True))
        time.sleep(a.step_s)
        if manager.save(step, args=ocp.args.StandardSave(state)):
            manager.wait_until_finished()  # the async save is on disk under its final name
            saved(step)
    manager.wait_until_finished()
    manager.close()
    say(f"done {a.steps}")


# -- torch.distributed.checkpoint -------------------------------------------------------------------
def dcp_latest(directory: Path) -> Path | None:
    """DCP's own notion of complete: a step directory whose ``.metadata`` exists (written last)."""
    found = (
        [
            (int(m.group(1)), p)
            for p in directory.iterdir()
            if p.is_dir() and (m := re.fullmatch(r"step-(\d+)", p.name)) and (p / ".metadata").is_file()
        ]
        if directory.is_dir()
        else []
    )
    return max(found)[1] if found else None


def dcp(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed.checkpoint as dist_cp

    device = torch_device()
    model = mlp().to(device)
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = 0
    ckpt = Path(a.ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    if a.resume and (latest := dcp_latest(ckpt)) is not None:
        state = {"model": model.state_dict(), "step": torch.tensor(0)}
        dist_cp.load(state, checkpoint_id=str(latest))
        model.load_state_dict(state["model"])
        start = int(state["step"])
    say(f"resumed from step {start}")
    for step in range(start + 1, a.steps + 1):
        x, y = batch(step, device)
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()
        time.sleep(a.step_s)
        if step % a.every == 0:
            dist_cp.save(
                {"model": model.state_dict(), "step": torch.tensor(step)},
                checkpoint_id=str(ckpt / f"step-{step:06d}"),
            )
            saved(step)
    say(f"done {a.steps}")


# -- plain torch.save, one file overwritten in place ----------------------------------------------------
def torchsave(a: argparse.Namespace) -> None:
    import torch

    device = torch_device()
    model = mlp().to(device)
    optim = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    path = Path(a.ckpt) / "checkpoint.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    start = 0
    if a.resume and path.is_file():
        state = torch.load(path, map_location=device)  # a torn file raises here
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
    say(f"resumed from step {start}")
    for step in range(start + 1, a.steps + 1):
        x, y = batch(step, device)
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()
        time.sleep(a.step_s)
        if step % a.every == 0:
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "step": step}, path)
            (path.parent / "state.json").write_text(json.dumps({"step": step}))
            saved(step)
    say(f"done {a.steps}")


JOBS = {
    "lightning": lightning,
    "huggingface": huggingface,
    "orbax": orbax,
    "dcp": dcp,
    "torchsave": torchsave,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=sorted(JOBS))
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--resume", action="store_true")
    a = parser.parse_args()
    say(f"pid {os.getpid()}")
    JOBS[a.framework](a)


if __name__ == "__main__":
    sys.exit(main())

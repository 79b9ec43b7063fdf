"""Training jobs that checkpoint the way the frameworks do, reproduced with the standard library.

Each writer uses the framework's file names, write order and temporary names; each ``find_*`` is the
framework's documented "find the latest checkpoint" rule, and loading verifies every byte (a torn or
incomplete checkpoint raises ``Corrupt``), so a test that resumes through these finds exactly what
the framework would, and notices when it would have loaded garbage.

- ``tensorflow``: ``tf.train.CheckpointManager.save`` (TF2 sharded save: ``ckpt-N_temp/`` parts,
  merged into ``ckpt-N.data-00000-of-00001`` + ``ckpt-N.index``, then the ``checkpoint`` state file
  through ``checkpoint.tmp<hex>``; ``max_to_keep=3``); found by ``tf.train.latest_checkpoint``.
- ``lightning``: ``ModelCheckpoint(every_n_train_steps, save_top_k=2, save_last=True)``:
  ``epoch=E-step=N.ckpt`` then ``last.ckpt``, both written in place; found by ``ckpt_path="last"``.
- ``orbax``: ``CheckpointManager.save``: ``N.orbax-checkpoint-tmp-<ts>/`` with ``default/`` and
  ``_CHECKPOINT_METADATA``, renamed to ``N/``; ``max_to_keep=2``; found by ``latest_step()``.
- ``huggingface``: ``Trainer._save_checkpoint``: ``checkpoint-N/`` with the model, optimizer,
  scheduler and rng files, ``trainer_state.json`` last; ``save_total_limit=2``; found by
  ``get_last_checkpoint`` (the highest ``checkpoint-N`` directory) + ``trainer_state.json``.
- ``overwrite``: ``torch.save(state, "checkpoint.pt")`` every few steps, in place, and
  ``state.json`` beside it; resumed from ``checkpoint.pt``.

Usage: ``python -S layouts.py LAYOUT TOTAL EVERY STEP_S``. Prints ``resumed from step N`` (0 when
nothing was found), ``step N``, ``saving N`` / ``saved N at <unix time>`` (both also appended to
``saves.log`` beside ``CLOUDTRAIN_OUTPUT_DIR``, on the instance's disk); ``CORRUPT ...`` and exit 3
when the framework's rule finds a checkpoint that does not load. It does not handle SIGTERM (the
frameworks do not), so an interruption can land in the middle of a save. ``LAYOUTS_HOLD_AT_END=<path>``:
hold before the last step, and after ``HOLD_AFTER_SAVES`` saves of this process, until that file
exists (a test that interrupts it cannot lose the race to the job finishing on a slow machine); ``LAYOUTS_PAUSE_IN_SAVE=<N>``: the N-th save of
this process stops halfway through its big file (open, half written) and prints ``paused in save``;
``LAYOUTS_GATE=<path>`` with ``LAYOUTS_GATE_BEFORE_SAVE=<N>``: the N-th save waits for that file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path

SAVES_RECORD = Path(os.environ.get("CLOUDTRAIN_OUTPUT_DIR", ".")).parent / "saves.log"
HOLD_AFTER_SAVES = 8  # with a hold file: a process that saved this often waits for it
CHUNK = 64 * 1024
SIZE = 16 * CHUNK  # 1 MiB per big file


class Corrupt(Exception):
    """The checkpoint the framework's rule found does not load."""


_saves = 0


def blob(step: int, size: int = SIZE) -> bytes:
    head = b"CKPT" + step.to_bytes(8, "big")
    body = head + (hashlib.sha256(head).digest() * (size // 32 + 1))[:size]
    return body + hashlib.sha256(body).digest()


def read_blob(path: Path) -> int:
    data = path.read_bytes()
    body, digest = data[:-32], data[-32:]
    if len(data) < 44 or body[:4] != b"CKPT" or hashlib.sha256(body).digest() != digest:
        raise Corrupt(f"{path.name} is torn or not a checkpoint ({len(data)} bytes)")
    return int.from_bytes(body[4:12], "big")


def write_slowly(path: Path, data: bytes, pause: bool = False) -> None:
    """Write in place, chunk by chunk, the way torch.save / safetensors stream a big file."""
    with open(path, "wb") as handle:
        for start in range(0, len(data), CHUNK):
            handle.write(data[start : start + CHUNK])
            handle.flush()
            if pause and start >= len(data) // 2:
                print("paused in save", flush=True)
                while True:
                    time.sleep(1)
            time.sleep(0.01)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp{uuid.uuid4().hex}")  # TF's atomic_write_string_to_file
    tmp.write_text(text)
    os.replace(tmp, path)


# -- TensorFlow -------------------------------------------------------------------------------------
def save_tensorflow(d: Path, step: int, pause: bool) -> None:
    prefix = f"ckpt-{step}"
    temp = d / f"{prefix}_temp"
    temp.mkdir()
    write_slowly(temp / "part-00000-of-00001.data-00000-of-00001", blob(step), pause)
    (temp / "part-00000-of-00001.index").write_bytes(blob(step, 64))
    os.replace(temp / "part-00000-of-00001.data-00000-of-00001", d / f"{prefix}.data-00000-of-00001")
    (d / f"{prefix}.index").write_bytes(blob(step, 64))  # MergeV2Checkpoints writes the merged index
    shutil.rmtree(temp)
    kept = sorted(int(m.group(1)) for p in d.iterdir() if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))
    paths = [f"ckpt-{n}" for n in kept[-3:]]
    lines = [f'model_checkpoint_path: "{prefix}"'] + [f'all_model_checkpoint_paths: "{p}"' for p in paths]
    _atomic_text(d / "checkpoint", "\n".join(lines) + "\n")
    for n in kept[:-3]:
        for p in d.glob(f"ckpt-{n}.*"):
            p.unlink()


def find_tensorflow(d: Path) -> int | None:
    state = d / "checkpoint"
    if not state.is_file():
        return None
    m = re.search(r'^model_checkpoint_path: "([^"]+)"', state.read_text(), re.M)
    if m is None or not (d / f"{m.group(1)}.index").is_file():  # latest_checkpoint's own check
        return None
    step = read_blob(d / f"{m.group(1)}.data-00000-of-00001")
    if read_blob(d / f"{m.group(1)}.index") != step:
        raise Corrupt(f"{m.group(1)}: index and data disagree")
    return step


# -- PyTorch Lightning ------------------------------------------------------------------------------
def save_lightning(d: Path, step: int, pause: bool) -> None:
    write_slowly(d / f"epoch={step // 10}-step={step}.ckpt", blob(step), pause)
    write_slowly(d / "last.ckpt", blob(step))
    named = sorted(
        (int(m.group(1)), p) for p in d.iterdir() if (m := re.search(r"step=(\d+)\.ckpt$", p.name))
    )
    for _, p in named[:-2]:
        p.unlink()


def find_lightning(d: Path) -> int | None:
    last = d / "last.ckpt"
    return read_blob(last) if last.is_file() else None


# -- Orbax ------------------------------------------------------------------------------------------
def save_orbax(d: Path, step: int, pause: bool) -> None:
    # orbax-checkpoint 0.12 names it ``N.orbax-checkpoint-tmp``; older releases add ``-<microseconds>``
    suffix = "" if (step // 2) % 2 else f"-{time.time_ns() // 1000}"
    tmp = d / f"{step}.orbax-checkpoint-tmp{suffix}"
    (tmp / "default").mkdir(parents=True)
    write_slowly(tmp / "default" / "params.bin", blob(step), pause)
    (tmp / "_CHECKPOINT_METADATA").write_text(json.dumps({"init_timestamp_nsecs": time.time_ns()}))
    os.rename(tmp, d / str(step))
    steps = sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())
    for n in steps[:-2]:
        shutil.rmtree(d / str(n))


def find_orbax(d: Path) -> int | None:
    steps = [int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()]  # latest_step()
    if not steps:
        return None
    step = max(steps)
    if read_blob(d / str(step) / "default" / "params.bin") != step:
        raise Corrupt(f"step {step}: wrong params")
    return step


# -- Hugging Face Trainer ---------------------------------------------------------------------------
def save_huggingface(d: Path, step: int, pause: bool) -> None:
    out = d / f"checkpoint-{step}"
    out.mkdir()
    write_slowly(out / "model.safetensors", blob(step), pause)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (out / name).write_bytes(blob(step, 256))
    (out / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 10}))
    dirs = sorted(int(m.group(1)) for p in d.iterdir() if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
    for n in dirs[:-2]:
        shutil.rmtree(d / f"checkpoint-{n}")


def find_huggingface(d: Path) -> int | None:
    dirs = [
        int(m.group(1))
        for p in d.iterdir()
        if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    ]
    if not dirs:
        return None  # get_last_checkpoint: None
    last = d / f"checkpoint-{max(dirs)}"
    try:
        step = json.loads((last / "trainer_state.json").read_text())["global_step"]
    except (OSError, ValueError, KeyError) as err:
        raise Corrupt(f"{last.name}: no usable trainer_state.json ({err})") from err
    if read_blob(last / "model.safetensors") != step:
        raise Corrupt(f"{last.name}: model and state disagree")
    return int(step)


# -- one file overwritten in place ------------------------------------------------------------------
def save_overwrite(d: Path, step: int, pause: bool) -> None:
    write_slowly(d / "checkpoint.pt", blob(step), pause)
    (d / "state.json").write_text(json.dumps({"step": step}))


def find_overwrite(d: Path) -> int | None:
    path = d / "checkpoint.pt"
    return read_blob(path) if path.is_file() else None


SAVE = {
    "tensorflow": save_tensorflow,
    "lightning": save_lightning,
    "orbax": save_orbax,
    "huggingface": save_huggingface,
    "overwrite": save_overwrite,
}
FIND = {
    "tensorflow": find_tensorflow,
    "lightning": find_lightning,
    "orbax": find_orbax,
    "huggingface": find_huggingface,
    "overwrite": find_overwrite,
}


def main() -> None:
    global _saves
    layout, total, every, step_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    d = Path(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
    d.mkdir(parents=True, exist_ok=True)
    try:
        start = FIND[layout](d) or 0
    except Corrupt as err:
        print(f"CORRUPT {err}", flush=True)
        sys.exit(3)
    print(f"resumed from step {start}", flush=True)
    pause_at = int(os.environ.get("LAYOUTS_PAUSE_IN_SAVE") or 0)
    hold = os.environ.get("LAYOUTS_HOLD_AT_END")
    gate, gate_at = os.environ.get("LAYOUTS_GATE"), int(os.environ.get("LAYOUTS_GATE_BEFORE_SAVE") or 0)
    step = start
    while step < total:
        if hold and (step == total - 1 or _saves >= HOLD_AFTER_SAVES):
            while not os.path.exists(hold):
                time.sleep(0.05)
        step += 1
        time.sleep(step_s)
        print(f"step {step}", flush=True)
        if step % every == 0:
            _saves += 1
            if gate and _saves == gate_at:
                while not os.path.exists(gate):
                    time.sleep(0.05)
            print(f"saving {step}", flush=True)
            with open(SAVES_RECORD, "a") as record:  # a save killed right after its commit has this line only
                record.write(f"saving {step}\n")
            SAVE[layout](d, step, _saves == pause_at)
            line = f"saved {step} at {time.time():.3f}\n"
            print(line, end="", flush=True)
            with open(SAVES_RECORD, "a") as record:  # on the instance's disk: outlives a lost instance's log
                record.write(line)
    out = Path(os.environ["CLOUDTRAIN_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"resumed_from": start, "step": step}))


if __name__ == "__main__":
    main()

"""One trial of the sweep: logistic regression by mini-batch gradient descent, resumable (stdlib only).

``CLOUDTRAIN_WORK_ITEM`` is the trial's config as JSON, ``{"lr": 0.1, "batch_size": 32}``. The data
is synthetic and the same for every trial (seeded): 600 points with 3 features whose labels are drawn
from a known logistic model, 480 to train on and 120 to validate. One step is one shuffled epoch of
mini-batch gradient descent, then ``SWEEP_STEP_S`` seconds of "GPU time" so the run can be watched;
the metric is the validation log-loss after the last step.

- Every ``SWEEP_CHECKPOINT_EVERY`` steps the state (step, weights, losses) goes to
  $CLOUDTRAIN_CHECKPOINT_DIR as ``ckpt-<step>.json`` with ``checkpoint.save`` (written to a temp
  name, then renamed, so the agent never uploads half a file); the agent uploads the newest one
  every ``checkpoint_interval``.
- On start it loads ``checkpoint.latest(...)``, which the agent restored from the item's folder when
  the item moved here from a reclaimed worker, and prints ``resumed from step N`` (or ``fresh start``).
- On SIGTERM (the agent passes on a spot notice) it finishes the current step, saves a checkpoint
  and exits 143; the agent uploads it and the item goes back to the queue for another worker.
- The shuffle of step N is seeded with N, so a trial that moved ends with exactly the weights of
  one that did not.
- At the end ``metric.json`` (``config``, ``loss``, ``accuracy``, ``steps``, ``resumed_from``) goes
  to $CLOUDTRAIN_OUTPUT_DIR, which the agent uploads to the item's ``results_uri``.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time

from airflow_cloudtrain import checkpoint

STEPS = int(os.environ.get("SWEEP_STEPS", "40"))
STEP_S = float(os.environ.get("SWEEP_STEP_S", "0.15"))
EVERY = int(os.environ.get("SWEEP_CHECKPOINT_EVERY", "5"))
TRUE_W, TRUE_B = (3.0, -4.0, 1.5), -0.5

stop = False


def on_term(signum: int, frame: object) -> None:
    global stop
    stop = True


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def dataset() -> tuple[list[tuple[list[float], int]], list[tuple[list[float], int]]]:
    """The same 600 labelled points for every trial: 480 to train on, 120 to validate."""
    rng = random.Random(0)
    rows = []
    for _ in range(600):
        x = [rng.gauss(0, 1) for _ in TRUE_W]
        p = sigmoid(sum(w * v for w, v in zip(TRUE_W, x, strict=True)) + TRUE_B)
        rows.append((x, 1 if rng.random() < p else 0))
    return rows[:480], rows[480:]


def log_loss(rows: list[tuple[list[float], int]], w: list[float], b: float) -> float:
    total = 0.0
    for x, y in rows:
        p = min(max(sigmoid(sum(wi * v for wi, v in zip(w, x, strict=True)) + b), 1e-12), 1 - 1e-12)
        total -= y * math.log(p) + (1 - y) * math.log(1 - p)
    return total / len(rows)


def accuracy(rows: list[tuple[list[float], int]], w: list[float], b: float) -> float:
    hits = sum((sum(wi * v for wi, v in zip(w, x, strict=True)) + b > 0) == (y == 1) for x, y in rows)
    return hits / len(rows)


def epoch(rows: list, w: list[float], b: float, lr: float, batch_size: int, step: int) -> tuple[list, float]:
    """One shuffled pass of mini-batch gradient descent (the shuffle of step N is seeded with N)."""
    order = list(range(len(rows)))
    random.Random(step).shuffle(order)
    for start in range(0, len(order), batch_size):
        batch = [rows[i] for i in order[start : start + batch_size]]
        grad_w, grad_b = [0.0] * len(w), 0.0
        for x, y in batch:
            err = sigmoid(sum(wi * v for wi, v in zip(w, x, strict=True)) + b) - y
            grad_w = [g + err * v for g, v in zip(grad_w, x, strict=True)]
            grad_b += err
        w = [wi - lr * g / len(batch) for wi, g in zip(w, grad_w, strict=True)]
        b -= lr * grad_b / len(batch)
    return w, b


def save(ckpt_dir: str, state: dict) -> None:
    path = os.path.join(ckpt_dir, f"ckpt-{state['step']:05d}.json")
    checkpoint.save(path, lambda tmp: tmp.write_text(json.dumps(state)))
    print(f"checkpoint saved at step {state['step']}", flush=True)


def main() -> int:
    signal.signal(signal.SIGTERM, on_term)
    config = json.loads(os.environ["CLOUDTRAIN_WORK_ITEM"])
    item_id = os.environ.get("CLOUDTRAIN_ITEM_ID", "-")
    lr, batch_size = float(config["lr"]), int(config["batch_size"])
    ckpt_dir = os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]

    found = checkpoint.latest(ckpt_dir)
    if found is not None:
        state = json.loads(found.read_text())
        print(f"item {item_id}: resumed from step {state['step']} (checkpoint {found.name})", flush=True)
    else:
        state = {"step": 0, "w": [0.0] * len(TRUE_W), "b": 0.0, "losses": []}
        print(f"item {item_id}: fresh start", flush=True)
    resumed_from = state["step"]

    train, valid = dataset()
    print(f"item {item_id}: lr={lr} batch_size={batch_size}, {len(train)} rows, {STEPS} steps", flush=True)
    while state["step"] < STEPS:
        step = state["step"] + 1
        w, b = epoch(train, state["w"], state["b"], lr, batch_size, step)
        loss = log_loss(valid, w, b)
        state = {"step": step, "w": w, "b": b, "losses": [*state["losses"], loss]}
        print(f"step {step}/{STEPS} val_loss {loss:.5f}", flush=True)
        if STEP_S:
            time.sleep(STEP_S)
        if stop:
            save(ckpt_dir, state)
            print(f"SIGTERM: stopped at step {step}", flush=True)
            return 143
        if step % EVERY == 0:
            save(ckpt_dir, state)

    metric = {
        "config": config,
        "loss": state["losses"][-1],
        "accuracy": accuracy(valid, state["w"], state["b"]),
        "steps": state["step"],
        "resumed_from": resumed_from,
        "item_id": item_id,
        "w": state["w"],
        "b": state["b"],
    }
    with open(os.path.join(os.environ["CLOUDTRAIN_OUTPUT_DIR"], "metric.json"), "w") as fh:
        json.dump(metric, fh)
    print(f"done: {state['step']} steps, val_loss={metric['loss']:.5f} accuracy={metric['accuracy']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

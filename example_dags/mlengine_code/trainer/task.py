"""Training entry point: every replica reads its role from TF_CONFIG (as Vertex AI and ML Engine set it).

The chief trains: it starts from the newest checkpoint in ``AIP_CHECKPOINT_DIR`` (so a resumed job, which
writes into the first job's folder, goes on from there), writes a checkpoint every few steps and the model
to ``AIP_MODEL_DIR``. Workers do their share of steps and exit; parameter servers serve until the job
ends (Vertex stops them once the chief is done), as TensorFlow's ``server.join()`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from trainer.gcs import list_names, read_json, write_json


def role() -> tuple[str, int, dict]:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task") or {}
    return str(task.get("type") or "chief"), int(task.get("index") or 0), config.get("cluster") or {}


def model_dir() -> str:
    return os.environ["AIP_MODEL_DIR"].rstrip("/") + "/"


def latest_checkpoint(checkpoint_dir: str) -> dict | None:
    steps = [
        int(n[5:-5]) for n in list_names(checkpoint_dir) if n.startswith("ckpt-") and n.endswith(".json")
    ]
    return read_json(f"{checkpoint_dir}ckpt-{max(steps):06d}.json") if steps else None


def train(args: argparse.Namespace) -> None:
    checkpoint_dir = os.environ["AIP_CHECKPOINT_DIR"].rstrip("/") + "/"
    state = latest_checkpoint(checkpoint_dir) or {"step": 0, "weight": 0.0}
    if state["step"]:
        print(f"resumed from step {state['step']} ({checkpoint_dir})", flush=True)
    for step in range(state["step"] + 1, state["step"] + args.steps + 1):
        time.sleep(args.step_s)
        state = {"step": step, "weight": state["weight"] + args.learning_rate * math.exp(-step / 10)}
        print(f"step {step} loss {1.0 / (1.0 + state['weight']):.4f}", flush=True)
        if step % args.checkpoint_every == 0:
            write_json(f"{checkpoint_dir}ckpt-{step:06d}.json", state)
            print(f"checkpoint step {step}", flush=True)
    write_json(f"{checkpoint_dir}ckpt-{state['step']:06d}.json", state)
    write_json(f"{model_dir()}model.json", {**state, "job_dir": args.job_dir})
    print(f"model written to {model_dir()} at step {state['step']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True, help="the job folder (ML Engine passed it to trainers)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=0.5)
    args = parser.parse_args()
    kind, index, cluster = role()
    sizes = {k: len(v) for k, v in cluster.items()}
    print(f"role {kind} {index} in cluster {sizes}", flush=True)
    if kind == "chief":
        train(args)
    elif kind == "worker":
        for step in range(3):
            time.sleep(args.step_s)
            print(f"worker {index} computed gradients for batch {step}", flush=True)
    elif kind == "ps":
        print(f"parameter server {index} serving", flush=True)
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main()

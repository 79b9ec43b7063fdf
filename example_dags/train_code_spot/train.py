"""A small, real training job that survives spot interruptions: resumes from its newest checkpoint.

Linear regression (y = w x + b) by stochastic gradient descent on a CSV from the bucket; one step is
one shuffled pass over the data. Runs on the instance (stdlib + boto3 / google-cloud-storage); the
agent puts ``airflow_cloudtrain`` on the PYTHONPATH for the checkpoint helper.

- Every ``--every`` steps the state (weights, step, losses) is pickled into
  $CLOUDTRAIN_CHECKPOINT_DIR as ``ckpt-<step>.pkl`` with ``checkpoint.save``: written to a temp
  name, then renamed, so the agent never uploads half a file.
- On start it loads ``checkpoint.latest(...)``, which the agent restored from the run folder when
  this is a relaunch, and prints ``resumed from step N`` (or ``fresh start``).
- On SIGTERM (the agent passes on a spot notice) it finishes the current step, saves a checkpoint
  and exits; the agent uploads that checkpoint before the instance goes.
- The shuffle of step N is seeded with N, so a run that was interrupted ends with exactly the
  weights of one that was not.
- At the end the model and the step count go to $CLOUDTRAIN_OUTPUT_DIR/model.json.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import pickle
import random
import signal
import sys
import time

from airflow_cloudtrain import checkpoint

stop = False


def on_term(signum: int, frame: object) -> None:
    global stop
    stop = True


def read_uri(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    bucket, key = rest.split("/", 1)
    if scheme == "s3":
        import boto3

        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    from google.cloud import storage

    return storage.Client().bucket(bucket).blob(key).download_as_text()


def save(ckpt_dir: str, state: dict) -> None:
    path = os.path.join(ckpt_dir, f"ckpt-{state['step']:05d}.pkl")
    checkpoint.save(path, lambda tmp: tmp.write_bytes(pickle.dumps(state)))
    print(f"checkpoint saved at step {state['step']}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to make runs visible")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)

    ckpt_dir = os.environ["CLOUDTRAIN_CHECKPOINT_DIR"]
    found = checkpoint.latest(ckpt_dir)
    if found is not None:
        state = pickle.loads(found.read_bytes())
        print(
            f"resumed from step {state['step']} (restart {os.environ.get('CLOUDTRAIN_RESTARTS', '0')}, "
            f"checkpoint {found.name})",
            flush=True,
        )
    else:
        state = {"step": 0, "w": 0.0, "b": 0.0, "losses": []}
        print("fresh start", flush=True)

    rows = [(float(r["x"]), float(r["y"])) for r in csv.DictReader(io.StringIO(read_uri(args.data)))]
    lr = float(os.environ.get("LEARNING_RATE", "0.05"))
    print(f"training on {len(rows)} rows from {args.data}, lr={lr}", flush=True)
    while state["step"] < args.steps:
        step = state["step"] + 1
        w, b = state["w"], state["b"]
        order = list(range(len(rows)))
        random.Random(step).shuffle(order)
        for i in order:
            x, y = rows[i]
            err = w * x + b - y
            w, b = w - lr * 2 * err * x, b - lr * 2 * err
        loss = sum((w * x + b - y) ** 2 for x, y in rows) / len(rows)
        state = {"step": step, "w": w, "b": b, "losses": [*state["losses"], loss]}
        print(f"step {step}/{args.steps} loss {loss:.5f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
        if stop:
            save(ckpt_dir, state)
            print(f"SIGTERM: stopped at step {step}", flush=True)
            return 143
        if step % args.every == 0:
            save(ckpt_dir, state)

    model = {
        "w": state["w"],
        "b": state["b"],
        "loss": state["losses"][-1],
        "steps": state["step"],
        "rows": len(rows),
        "resumed": os.environ.get("CLOUDTRAIN_RESUMED") == "1",
        "restarts": int(os.environ.get("CLOUDTRAIN_RESTARTS", "0")),
    }
    with open(os.path.join(os.environ["CLOUDTRAIN_OUTPUT_DIR"], "model.json"), "w") as fh:
        json.dump(model, fh)
    print(f"done: {state['step']} steps, w={model['w']:.3f} b={model['b']:.3f} loss={model['loss']:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

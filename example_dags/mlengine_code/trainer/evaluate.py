"""Evaluation job: reads a training job's folder (``--train-folder``, as the detector's ``evaluate`` did)
and writes its metrics to this job's ``AIP_MODEL_DIR``."""

from __future__ import annotations

import argparse
import os
import time

from trainer.gcs import read_json, write_json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-folder", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--job-dir", default=None)
    parser.add_argument("--batches", type=int, default=1, help="evaluation batches")
    parser.add_argument("--batch-s", type=float, default=0.0, help="seconds one batch takes")
    args = parser.parse_args()
    model = read_json(f"{args.train_folder.rstrip('/')}/model/model.json")
    if model is None:
        raise SystemExit(f"no model in {args.train_folder}/model/")
    for batch in range(1, args.batches + 1):
        time.sleep(args.batch_s)
        print(f"evaluated batch {batch}/{args.batches}", flush=True)
    metrics = {"split": args.split, "step": model["step"], "loss": round(1.0 / (1.0 + model["weight"]), 4)}
    print(f"evaluated the model of step {model['step']} on {args.split}: loss {metrics['loss']}", flush=True)
    write_json(os.environ["AIP_MODEL_DIR"].rstrip("/") + "/metrics.json", metrics)


if __name__ == "__main__":
    main()

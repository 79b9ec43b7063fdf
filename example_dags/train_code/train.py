"""A small, real training job: linear regression by gradient descent on a CSV from the bucket.

Runs on the instance (stdlib + boto3 / google-cloud-storage). Writes the model and its metrics to
$CLOUDTRAIN_OUTPUT_DIR, which the agent uploads to the run folder's results/. Stops cleanly on
SIGTERM (a spot notice), as a training script on rented hardware should.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import signal
import sys
import time

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per epoch, to make runs visible")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    rows = [(float(r["x"]), float(r["y"])) for r in csv.DictReader(io.StringIO(read_uri(args.data)))]
    lr = float(os.environ.get("LEARNING_RATE", "0.05"))
    w = b = 0.0
    n = len(rows)
    print(f"training on {n} rows from {args.data}, lr={lr}", flush=True)
    loss = float("nan")
    for epoch in range(1, args.epochs + 1):
        if stop:
            print(f"SIGTERM at epoch {epoch}: stopping", flush=True)
            return 143
        gw = sum((w * x + b - y) * x for x, y in rows) * 2 / n
        gb = sum((w * x + b - y) for x, y in rows) * 2 / n
        w, b = w - lr * gw, b - lr * gb
        loss = sum((w * x + b - y) ** 2 for x, y in rows) / n
        if epoch % 50 == 0 or epoch == 1:
            print(f"epoch {epoch} loss {loss:.5f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    out = os.environ["CLOUDTRAIN_OUTPUT_DIR"]
    with open(os.path.join(out, "model.json"), "w") as fh:
        json.dump({"w": w, "b": b, "loss": loss, "rows": n, "epochs": args.epochs}, fh)
    print(f"done: w={w:.3f} b={b:.3f} loss={loss:.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

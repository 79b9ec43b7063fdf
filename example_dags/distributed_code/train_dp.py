"""Data-parallel training over a gang's nodes, in the standard library only: what ``torchrun`` + DDP do,
small enough to read.

Every node of a gang (``num_nodes``) runs this same command. The agent gives each its place
(``NODE_RANK`` of ``NNODES``) and the head's address (``MASTER_ADDR``:``MASTER_PORT``); see
docs/gangs.md. The model is linear (``y = w . x + b``, four weights) on a synthetic dataset that
every node generates identically from a fixed seed and shards by rank (row ``i`` is rank ``i % n``'s).

One step: every rank computes the mean-squared-error gradient on its shard and sends it to the head
over TCP; the head averages the gradients in rank order, applies the update and sends the new weights
back, so every rank holds the head's weights, bit for bit. The same float operations in the same order
on every run: an interrupted and resumed run ends with exactly the weights of one that was not.

- Checkpoints: only the head writes them, every ``--every`` steps, into $CLOUDTRAIN_CHECKPOINT_DIR as
  ``ckpt-<step>.json`` with ``checkpoint.save`` (a temp name, then a rename: never half a file); only
  the head's agent uploads them (``checkpoint_ranks="head"``). On a relaunch the agent of EVERY rank
  restores the head's newest complete checkpoint into that rank's directory, so every rank loads
  ``checkpoint.latest(...)`` on start; the head also sends its step and weights in its first message,
  and a rank whose own copy differs (it cannot with ``CheckpointResumeOperator``, which relaunches
  only once the stopped head has uploaded) says so and follows the head.
- SIGTERM (a spot notice, a stop): the step in progress finishes, the head saves a checkpoint, and the
  process exits 143. A peer that vanishes (its connection closes, or nothing comes within
  ``--timeout`` seconds) ends every other rank promptly with exit code 3 ("peer lost"); the head
  first saves the last step the gang completed.
- At the end each rank writes $CLOUDTRAIN_OUTPUT_DIR/result.json: weights, steps, ``resumed_from``.

    python3 train_dp.py --steps 200 --every 10 [--sleep 0.05] [--lr 0.1] [--timeout 60]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from airflow_cloudtrain.contract import checkpoint  # the same module as airflow_cloudtrain.checkpoint

ROWS = 240  # divisible by 1..6 and 8: every rank's shard has the same size for those gang sizes
FEATURES = 3
TRUE_W = (2.0, -1.0, 0.5)
TRUE_B = 0.25
SEED = 25
PEER_LOST = 3  # exit code of a rank whose peer vanished
STOPPED = 143  # exit code after SIGTERM, as a shell reports a process SIGTERM ended
KEEP = 3  # checkpoints the head keeps locally (the agent uploads the newest)

Weights = list[float]  # FEATURES weights, then the bias


class PeerLost(Exception):
    """A peer's connection closed or went silent: the gang cannot go on."""


def dataset() -> list[tuple[list[float], float]]:
    """The same rows on every node: ``random.Random(SEED)`` draws are stable across Python versions."""
    rng = random.Random(SEED)
    rows = []
    for _ in range(ROWS):
        x = [rng.uniform(-1.0, 1.0) for _ in range(FEATURES)]
        y = sum(w * v for w, v in zip(TRUE_W, x, strict=True)) + TRUE_B + rng.gauss(0.0, 0.05)
        rows.append((x, y))
    return rows


def shard(rows: list[tuple[list[float], float]], rank: int, n: int) -> list[tuple[list[float], float]]:
    """Rank ``rank``'s rows of ``n``: every n-th row, so the shards interleave the dataset."""
    return rows[rank::n]


def gradient(weights: Weights, rows: list[tuple[list[float], float]]) -> Weights:
    """The mean-squared-error gradient over ``rows`` (fixed order of operations)."""
    grad = [0.0] * (FEATURES + 1)
    for x, y in rows:
        err = sum(w * v for w, v in zip(weights, x, strict=False)) + weights[FEATURES] - y
        for j in range(FEATURES):
            grad[j] += 2.0 * err * x[j]
        grad[FEATURES] += 2.0 * err
    return [g / len(rows) for g in grad]


def average(grads: list[Weights]) -> Weights:
    """The all-reduce: the mean of every rank's gradient, summed in rank order."""
    total = [0.0] * len(grads[0])
    for grad in grads:
        total = [t + g for t, g in zip(total, grad, strict=True)]
    return [t / len(grads) for t in total]


def apply(weights: Weights, grad: Weights, lr: float) -> Weights:
    return [w - lr * g for w, g in zip(weights, grad, strict=True)]


def loss(weights: Weights, rows: list[tuple[list[float], float]]) -> float:
    total = 0.0
    for x, y in rows:
        total += (sum(w * v for w, v in zip(weights, x, strict=False)) + weights[FEATURES] - y) ** 2
    return total / len(rows)


def reference(steps: int, n: int, lr: float, start: Weights | None = None, first: int = 0) -> Weights:
    """What ``n`` ranks reach after ``steps`` steps, computed in one process (the tests' reference)."""
    rows = dataset()
    shards = [shard(rows, r, n) for r in range(n)]
    weights = list(start) if start is not None else [0.0] * (FEATURES + 1)
    for _ in range(first, steps):
        weights = apply(weights, average([gradient(weights, s) for s in shards]), lr)
    return weights


# -- the wire: one JSON object per line; floats as repr() writes them, which json reads back exactly --
class Channel:
    """One TCP connection to a peer, line-delimited JSON, every read bounded by the socket timeout."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock, self.peer = sock, peer
        self.reader = sock.makefile("r", encoding="utf-8")

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
        except OSError as err:
            raise PeerLost(f"{self.peer}: send failed ({type(err).__name__}: {err})") from err

    def receive(self) -> dict[str, Any]:
        try:
            line = self.reader.readline()
        except TimeoutError as err:  # a peer that vanished without closing (a host gone at once)
            raise PeerLost(f"{self.peer}: nothing received within the timeout") from err
        except OSError as err:  # a reset: its process is gone
            raise PeerLost(f"{self.peer}: connection lost ({type(err).__name__}: {err})") from err
        if not line:
            raise PeerLost(f"{self.peer}: connection closed")
        return json.loads(line)

    def close(self) -> None:
        for closing in (self.reader.close, self.sock.close):
            with contextlib.suppress(OSError):
                closing()


def accept_peers(host: str, port: int, n: int, timeout: float) -> list[Channel]:
    """The head: listen on the master address and take one connection per other rank, in rank order."""
    server = socket.create_server((host, port))  # SO_REUSEADDR: a relaunched head rebinds at once
    server.settimeout(timeout)
    peers: dict[int, Channel] = {}
    try:
        while len(peers) < n - 1:
            try:
                conn, _ = server.accept()
            except OSError as err:
                missing = sorted(set(range(1, n)) - set(peers))
                raise PeerLost(f"rank(s) {missing} never connected within {timeout:g} s") from err
            conn.settimeout(timeout)
            channel = Channel(conn, "a rank connecting")
            rank = int(channel.receive()["rank"])
            channel.peer = f"rank {rank}"
            peers[rank] = channel
    finally:
        server.close()
    return [peers[r] for r in range(1, n)]


def connect_head(host: str, port: int, source: str, timeout: float) -> Channel:
    """A rank: connect to the head, retrying while it is not listening yet, from this node's address."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0))
            return Channel(sock, "the head (rank 0)")
        except OSError as err:
            if time.monotonic() > deadline:
                raise PeerLost(f"the head {host}:{port} did not listen within {timeout:g} s") from err
            time.sleep(0.2)


def save(ckpt_dir: Path, step: int, weights: Weights) -> None:
    state = json.dumps({"step": step, "weights": weights})
    checkpoint.save(ckpt_dir / f"ckpt-{step:05d}.json", lambda tmp: tmp.write_text(state))
    for _, old in checkpoint.candidates(ckpt_dir)[:-KEEP]:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    print(f"checkpoint saved at step {step}", flush=True)


def restore(ckpt_dir: Path) -> tuple[int, Weights]:
    found = checkpoint.latest(ckpt_dir)
    if found is None:
        print("fresh start", flush=True)
        return 0, [0.0] * (FEATURES + 1)
    state = json.loads(found.read_text())
    print(f"resumed from step {state['step']} (checkpoint {found.name})", flush=True)
    checkpoint.report_resumed(int(state["step"]))
    return int(state["step"]), [float(w) for w in state["weights"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="the head checkpoints every N steps")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to make runs visible")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a peer may stay silent")
    args = parser.parse_args()
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    rank, n = int(os.environ.get("NODE_RANK", "0")), int(os.environ.get("NNODES", "1"))
    head, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    ips = os.environ.get("CLOUDTRAIN_NODE_IPS", head).splitlines()
    ckpt_dir = Path(os.environ.get("CLOUDTRAIN_CHECKPOINT_DIR", "checkpoints"))
    rows = dataset()
    mine = shard(rows, rank, n)
    print(f"rank {rank} of {n}: {len(mine)} rows, head {head}:{port}", flush=True)

    peers: list[Channel] = []
    step, weights = 0, [0.0] * (FEATURES + 1)
    resumed_from = -1  # the step this attempt started from, once known
    try:
        step, weights = restore(ckpt_dir)  # every rank: the agent restored the head's checkpoint here
        if rank == 0:
            peers = accept_peers(head, port, n, args.timeout) if n > 1 else []
            for peer in peers:  # the state every rank starts from: the head's checkpoint
                peer.send({"step": step, "weights": weights})
        else:
            peers = [connect_head(head, port, ips[rank] if rank < len(ips) else "", args.timeout)]
            peers[0].send({"rank": rank})
            start = peers[0].receive()
            own = (step, weights)
            step, weights = int(start["step"]), [float(w) for w in start["weights"]]
            if own != (step, weights):
                print(
                    f"rank {rank}: restored step {own[0]}, the head's is {step}: using the head's", flush=True
                )
            print(f"resumed from step {step} (the head's)" if step else "fresh start", flush=True)
        resumed_from = step
        while step < args.steps:
            grad = gradient(weights, mine)
            if rank == 0:
                grads = [grad] + [peer.receive()["grad"] for peer in peers]
                updated = apply(weights, average(grads), args.lr)
                for peer in peers:
                    peer.send({"step": step + 1, "weights": updated})
                weights = updated  # only now: a failed send leaves (step, weights) the gang's last
            else:
                peers[0].send({"step": step + 1, "grad": grad})
                reply = peers[0].receive()
                weights = [float(w) for w in reply["weights"]]
            step += 1
            if rank == 0:
                print(f"step {step} loss {loss(weights, rows):.6f}", flush=True)
                if stopping or step % args.every == 0 or step == args.steps:
                    save(ckpt_dir, step, weights)
            if stopping:
                print(f"SIGTERM: stopped at step {step}", flush=True)
                return STOPPED
            if args.sleep:
                time.sleep(args.sleep)
    except PeerLost as err:
        print(f"peer lost at step {step}: {err}", file=sys.stderr, flush=True)
        if rank == 0 and step > resumed_from >= 0:
            save(ckpt_dir, step, weights)  # the last step every rank completed: less work lost
        return PEER_LOST
    finally:
        for peer in peers:
            peer.close()

    result = {"rank": rank, "nodes": n, "steps": step, "resumed_from": resumed_from, "weights": weights}
    out = Path(os.environ.get("CLOUDTRAIN_OUTPUT_DIR", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result))
    print(f"done: {step} steps, weights {weights}, resumed from step {resumed_from}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

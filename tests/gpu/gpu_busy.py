"""A CUDA job that keeps the GPU busy while using almost no CPU (the idle watchdog's GPU case).

Run by ``tests/gpu/test_gpu.py``. Big bf16 matrix products are queued one batch ahead and the host
waits on a blocking CUDA event, so the process sleeps in the driver instead of spinning: a job
waiting on its kernels, which the CPU reading alone would call idle.

Control on stdin, one word a line: ``idle`` stops launching kernels but keeps the CUDA context (a
hung job: its data loader died), ``exit`` ends it (so does stdin closing). Prints ``ready`` once the
first batch ran (the torch import and CUDA start-up, which do use CPU, are over by then) and
``idle`` once the queued kernels have finished.
"""

from __future__ import annotations

import sys
import threading
import time

import torch

N = 16384  # one bf16 product of 16384^3: about 11 ms on an H100
BATCH = 16  # about 0.2 s of GPU work per batch, a few dozen microseconds of CPU to launch it


def main() -> None:
    mode = ["busy"]

    def control() -> None:
        for line in sys.stdin:
            mode[0] = line.strip() or mode[0]
            if mode[0] == "exit":
                return
        mode[0] = "exit"

    threading.Thread(target=control, daemon=True).start()
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def launch() -> torch.cuda.Event:
        for _ in range(BATCH):
            torch.matmul(a, b, out=out)
        done = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning
        done.record()
        return done

    pending = launch()
    pending.synchronize()
    print("ready", flush=True)
    while mode[0] == "busy":
        queued = launch()  # behind the pending batch: the GPU never waits for the host
        pending.synchronize()
        pending = queued
    pending.synchronize()
    print("idle", flush=True)
    while mode[0] != "exit":
        time.sleep(0.1)


if __name__ == "__main__":
    main()

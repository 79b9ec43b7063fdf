"""Injected spot interruptions for the emulated clouds (not a DAG): what the demo and tests use.

``Interrupter(emu, [(15, 10), (30, 0)])`` is a thread that watches ``emu.running_instances()`` and
each instance's job output (``emu.agent_log``); it interrupts the first instance whose job has
printed ``step N/...`` with N >= 15, with a 10 s notice, then the next instance whose job reached
step 30, without a notice, and so on: each instance at most once, in launch order. An instance is
only interrupted once its job also ran ``min_steps`` steps itself (from ``resumed from step N`` or 0),
so that it saved a checkpoint the agent had time to upload: a job told of its interruption may run
on for several seconds (the agent polls the metadata every 5 s) and resume past the next threshold.
``done`` lists what it did: ``{"instance_id", "resumed_step", "step", "notice_s"}``.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

STEP_LINE = re.compile(r"\bstep (\d+)/\d+\b")
RESUMED_LINE = re.compile(r"resumed from step (\d+)")


def last_step(log: str) -> int | None:
    """The newest ``step N/TOTAL`` the job printed, None before its first step."""
    steps = [int(m) for m in STEP_LINE.findall(log)]
    return max(steps) if steps else None


def resumed_step(log: str) -> int | None:
    """The step the job said it resumed from, None for a fresh start (or not started yet)."""
    found = RESUMED_LINE.search(log)
    return int(found.group(1)) if found else None


class Interrupter(threading.Thread):
    def __init__(
        self, emu: Any, plan: list[tuple[int, float]], min_steps: int = 12, timeout_s: float = 600.0
    ) -> None:
        super().__init__(name="spot-interrupter", daemon=True)
        self.emu = emu
        self.plan = list(plan)  # (interrupt once the job passed this step, notice seconds)
        self.min_steps = min_steps
        self.timeout_s = timeout_s
        self.done: list[dict[str, Any]] = []
        self._handled: set[str] = set()
        self._stopping = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while len(self.done) < len(self.plan) and not self._stopping.is_set() and time.monotonic() < deadline:
            at_step, notice_s = self.plan[len(self.done)]
            for inst in self.emu.running_instances():
                if inst["id"] in self._handled:
                    continue
                log = self.emu.agent_log(inst["id"])
                step = last_step(log)
                resumed = resumed_step(log) or 0
                if step is not None and step >= at_step and step - resumed >= self.min_steps:
                    self._handled.add(inst["id"])
                    self.done.append(
                        {
                            "instance_id": inst["id"],
                            "resumed_step": resumed,
                            "step": step,
                            "notice_s": notice_s,
                        }
                    )
                    print(
                        f"[interrupter] {inst['id']} at step {step} (resumed from {resumed}): interrupting it "
                        + (f"with a {notice_s:g} s notice" if notice_s > 0 else "without notice"),
                        flush=True,
                    )
                    self.emu.interrupt(inst["id"], notice_s=notice_s)
                    break
            self._stopping.wait(0.1)

    def stop(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Stop watching (if it still is) and return what was done."""
        self._stopping.set()
        self.join(timeout_s)
        return self.done

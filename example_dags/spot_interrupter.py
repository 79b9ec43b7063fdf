"""Injected spot interruptions for the emulated clouds (not a DAG): what the demo and tests use.

``Interrupter(emu, [(15, 10), (30, 0)])`` is a thread that watches ``emu.running_instances()`` and
each instance's job output (``emu.agent_log``); it interrupts the first instance whose job has
printed ``step N/...`` with N >= 15, with a 10 s notice, then the next instance whose job reached
step 30, without a notice, and so on: each instance at most once, in launch order. An instance is
only interrupted once its job also ran ``min_steps`` steps itself (from ``resumed from step N`` or 0),
so that it saved a checkpoint the agent had time to upload: a job told of its interruption may run
on for several seconds (the agent polls the metadata every 5 s) and resume past the next threshold.
``done`` lists what it did: ``{"instance_id", "resumed_step", "step", "notice_s"}``.

``FleetInterrupter(emu, count=1, notice_s=5)`` does the same for the workers of a fleet
(``SpotFleetOperator``; ``emu.running_instances()`` names their Auto Scaling group): it reclaims a
group member in the middle of an item: one whose current item (the worker's ``item <id>: attempt``
line) has had a checkpoint uploaded (``checkpoint step N uploaded to .../items/<id>/checkpoints/N``),
whose job is at most ``max_progress`` of its steps in, and whose item agent looks at the metadata
within the next 0.4 to 1.7 s (every ``agent_poll_s`` from the moment it took the item), so the notice
stops the job while it runs: the item goes back to the queue with its final checkpoint and resumes
on another worker. ``done`` lists ``{"instance_id", "item_id", "checkpoint_step", "step", "notice_s"}``.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

STEP_LINE_TOTAL = re.compile(r"\bstep (\d+)/(\d+)\b")
STEP_LINE = re.compile(r"\bstep (\d+)/\d+\b")
RESUMED_LINE = re.compile(r"resumed from step (\d+)")
ITEM_LINE = re.compile(r"\bitem (\S+): attempt (\S+)")
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")  # the agent's logging asctime
FINISHED_LINE = "[cloudtrain] finished:"
UPLOADED_LINE = re.compile(r"checkpoint step (\d+) uploaded to \S*/items/([^/\s]+)/checkpoints/")


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


def current_item(log: str) -> tuple[str, str, float | None] | None:
    """(item id, the worker's log since it took that item, when it took it: epoch seconds from the
    line's local-time stamp or None) of the item a worker runs now; None when it runs none (not
    started yet, or the item's agent said ``finished:``)."""
    found = list(ITEM_LINE.finditer(log))
    if not found:
        return None
    since = log[found[-1].end() :]
    if FINISHED_LINE in since:
        return None
    line_start = log.rfind("\n", 0, found[-1].start()) + 1
    stamp = STAMP.match(log, line_start)
    taken = None
    if stamp:
        taken = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")) + int(stamp.group(2)) / 1000
    return found[-1].group(1), since, taken


class FleetInterrupter(threading.Thread):
    def __init__(
        self,
        emu: Any,
        count: int = 1,
        notice_s: float = 5.0,
        timeout_s: float = 600.0,
        poll_s: float = 0.3,
        max_progress: float = 0.75,
        agent_poll_s: float = 5.0,
    ) -> None:
        super().__init__(name="fleet-interrupter", daemon=True)
        self.emu = emu
        self.count = count
        self.notice_s = notice_s
        self.timeout_s = timeout_s
        self.poll_s = poll_s  # each look lists the instances (DescribeInstances): not too often
        self.max_progress = max_progress  # of the job's steps, so that it still runs when told
        self.agent_poll_s = agent_poll_s  # the item agent's metadata poll (RunSpec.metadata_poll_s)
        self.done: list[dict[str, Any]] = []
        self._stopping = threading.Event()

    def poll_soon(self, taken: float | None) -> bool:
        """Whether the item's agent looks at the metadata 0.4 to 1.7 s from now (it starts polling as
        it takes the item, then every ``agent_poll_s``): a notice given then stops the job at once,
        not after it finished, which would leave the item done and nothing to move."""
        if taken is None:
            return True
        age = time.time() - taken
        return self.agent_poll_s - 1.7 <= age % self.agent_poll_s <= self.agent_poll_s - 0.4

    def candidate(self, inst: dict[str, Any]) -> dict[str, Any] | None:
        """What reclaiming this worker now would interrupt, None if it is not worth it (yet)."""
        if not inst.get("group") or any(d["instance_id"] == inst["id"] for d in self.done):
            return None
        current = current_item(self.emu.agent_log(inst["id"]))
        if current is None:
            return None
        item_id, since, taken = current
        uploaded = [int(m.group(1)) for m in UPLOADED_LINE.finditer(since) if m.group(2) == item_id]
        steps = STEP_LINE_TOTAL.findall(since)
        if not uploaded or not steps:
            return None
        step, total = int(steps[-1][0]), int(steps[-1][1])
        if step > self.max_progress * total or (self.notice_s > 0 and not self.poll_soon(taken)):
            return None
        return {
            "instance_id": inst["id"],
            "item_id": item_id,
            "checkpoint_step": max(uploaded),
            "step": step,
            "notice_s": self.notice_s,
        }

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while len(self.done) < self.count and not self._stopping.is_set() and time.monotonic() < deadline:
            for inst in self.emu.running_instances():
                found = self.candidate(inst)
                if found is None:
                    continue
                self.done.append(found)
                print(
                    f"[interrupter] worker {found['instance_id']} runs item {found['item_id']} at step "
                    f"{found['step']} (checkpoint step {found['checkpoint_step']} uploaded): reclaiming it "
                    + (f"with a {self.notice_s:g} s notice" if self.notice_s > 0 else "without notice"),
                    flush=True,
                )
                self.emu.interrupt(found["instance_id"], notice_s=self.notice_s)
                break
            self._stopping.wait(self.poll_s)

    def stop(self, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """Stop watching (if it still is) and return what was done."""
        self._stopping.set()
        self.join(timeout_s)
        return self.done

"""A trigger handed from one triggerer to another mid-wait, as Airflow does when a triggerer dies or
stops and another picks its triggers up: the new one re-creates the trigger from its serialized
kwargs in a process (and event loop) of its own, while the old one may still run for a while, so
both watch the same run at once; the first event either yields is the one the task resumes with
(Airflow takes the first and deletes the trigger), and the other triggerer's copy is then stopped.

``HandOver`` replaces ``dag.test()``'s inline trigger run (``airflow.sdk.definitions.dag.
_run_inline_trigger``): the old triggerer is that inline run (in a thread here, so it can be cancelled
as a stopping triggerer cancels its triggers); the new one is this file run as a script: a fresh
Python that builds the trigger from ``serialize()``'s output and prints its first event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

EVENT = "HANDOVER-EVENT "  # the new triggerer's event line on its stdout
POLLED = "[rank 1]"  # the new triggerer has polled the gang (its followers re-show rank 1's lines)


class _Cancellable:
    """The old triggerer's copy of the trigger: runs it until its first event, or until ``stop`` is
    set, then cancels it the way a stopping triggerer does (not as a user's action: no ``on_kill``)."""

    def __init__(self, trigger: Any, stop: threading.Event) -> None:
        self.trigger, self.stop = trigger, stop

    async def run(self) -> AsyncIterator[Any]:
        task = asyncio.ensure_future(anext(self.trigger.run(), None))
        while not task.done():
            if self.stop.is_set():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return
            await asyncio.wait({task}, timeout=0.2)
        yield task.result()


class NewTriggerer:
    """This file as a process of its own: the trigger re-created from its serialized form."""

    def __init__(self, serialized: tuple[str, dict[str, Any]]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(list(serialized)))
        self.proc.stdin.close()
        self.lines: list[str] = []
        self.event: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(EVENT):
                self.event = json.loads(line[len(EVENT) :])

    def polled(self) -> bool:
        return any(POLLED in x for x in self.lines)

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        """The new triggerer's copy lost the race: it goes (as a dying triggerer, no cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)
        self._reader.join(10)


class HandOver:
    """``dag.test()``'s trigger run, each deferral handed over once the new triggerer has polled.

    ``plan[n]``: for the ``n``-th deferral (1-based), whether the old triggerer keeps running until
    an event (both watch the run through whatever happens meanwhile: True), or is cancelled once the
    new one has polled (False); a deferral not in the plan runs inline as ``dag.test()`` runs it. ``gates[n]`` is set once the ``n``-th hand-over is under way as planned (both
    running for an overlapping one, the old one cancelled otherwise): a test may hold a fault until
    then. ``done`` records, per deferral, who yielded the event and the new triggerer's lines."""

    def __init__(self, inline: Callable[[Any, Any], Any], plan: dict[int, bool]) -> None:
        self.inline, self.plan = inline, plan
        self.deferrals = 0
        self.gates: dict[int, threading.Event] = {}
        self.done: list[dict[str, Any]] = []

    def gate(self, n: int) -> threading.Event:
        return self.gates.setdefault(n, threading.Event())

    def __call__(self, trigger: Any, ti: Any) -> Any:
        from airflow.triggers.base import TriggerEvent

        self.deferrals += 1
        n = self.deferrals
        if n not in self.plan:
            return self.inline(trigger, ti)
        overlap = self.plan[n]
        stop, result = threading.Event(), {}

        def old() -> None:
            result["event"] = self.inline(_Cancellable(trigger, stop), ti)

        old_thread = threading.Thread(target=old, daemon=True)
        old_thread.start()
        new = NewTriggerer(trigger.serialize())
        deadline = time.monotonic() + 900  # a bound for a failing test on a loaded machine
        cancelled = False
        try:
            while time.monotonic() < deadline:
                if not old_thread.is_alive() and result.get("event") is not None:
                    winner, event = "old", result["event"]
                    break
                if new.event is not None:
                    winner, event = "new", TriggerEvent(new.event)
                    break
                if new.ended():
                    raise AssertionError(
                        "the new triggerer ended without an event:\n" + "\n".join(new.lines[-40:])
                    )
                if new.polled() and not overlap and not cancelled:
                    stop.set()  # the old triggerer stops: its copy is cancelled
                    old_thread.join(120)
                    cancelled = True
                if new.polled():
                    self.gate(n).set()
                time.sleep(0.1)
            else:
                raise AssertionError(f"no event from either triggerer of deferral {n}")
        finally:
            stop.set()
            old_thread.join(120)
            new.stop()
        self.done.append(
            {"winner": winner, "overlap": overlap, "cancelled": cancelled, "lines": list(new.lines)}
        )
        return event


async def _first_event(classpath: str, kwargs: dict[str, Any]) -> Any:
    import importlib

    module, _, name = classpath.rpartition(".")
    trigger = getattr(importlib.import_module(module), name)(**kwargs)
    return await anext(trigger.run(), None)


def main() -> None:
    """The new triggerer: the trigger from its serialized form, in a fresh event loop; its event
    payload on one line of stdout (its log lines go there too)."""
    import logging

    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s", force=True)
    classpath, kwargs = json.loads(sys.stdin.read())
    event = asyncio.run(_first_event(classpath, kwargs))
    payload = event.payload if event is not None else None
    print(EVENT + json.dumps(payload), flush=True)


if __name__ == "__main__":
    main()

"""``cloudtrain up`` as a small supervisor: a process of the deployment that dies is started again.

A triggerer killed by the OOM killer (or by hand) must not take the deployment down: its deferred
tasks wait in the database, and a new triggerer picks them up. So every process that exits while
nobody stopped it is restarted, with one line saying so: at once the first time, then, while it keeps
dying soon after its start, after a growing pause (1 s, 2 s, 4 s ... up to a minute), so a broken
setting does not spin the machine; the pause starts over once the process has lived ``stable_s``.
Only Ctrl-C or SIGTERM stops the deployment (``run_up``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class _Watch:
    started: float  # monotonic time of the last start
    quick_deaths: int = 0  # deaths in a row, each within stable_s of its start
    restart_at: float | None = None  # when a dead process is due to start again


class Supervisor:
    """Restarts the dead processes of a ``LocalAirflow`` (or anything with ``procs``, ``start(name)``,
    ``reap(name)`` and ``output(name)``); call :meth:`check` about every second."""

    def __init__(
        self,
        airflow: Any,
        out: TextIO | None = None,
        first_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        stable_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.airflow = airflow
        self.out = out
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s
        self.clock = clock
        now = clock()
        self.watches = {name: _Watch(now) for name in airflow.procs}
        self.restarts = 0

    def _say(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp}] {line}", file=self.out or sys.stderr, flush=True)

    def backoff(self, quick_deaths: int) -> float:
        """The pause before restart number ``quick_deaths`` of a process that keeps dying."""
        if quick_deaths <= 1:
            return 0.0
        return float(min(self.max_backoff_s, self.first_backoff_s * 2 ** (quick_deaths - 2)))

    def check(self) -> None:
        """Notice the processes that exited, and start those whose pause is over."""
        now = self.clock()
        for name, proc in list(self.airflow.procs.items()):
            watch = self.watches.setdefault(name, _Watch(now))
            if proc.poll() is None:
                continue
            if watch.restart_at is None:  # just noticed
                lived = now - watch.started
                watch.quick_deaths = watch.quick_deaths + 1 if lived < self.stable_s else 1
                delay = self.backoff(watch.quick_deaths)
                watch.restart_at = now + delay
                again = f" (died {watch.quick_deaths} times in a row soon after starting)" if delay else ""
                self._say(
                    f"airflow {name} exited with {_how(proc.returncode)} after {lived:.0f} s; restarting it "
                    f"in {delay:g} s{again} (its output: {self.airflow.output(name)})"
                )
                self.airflow.reap(name)  # what it started dies with it, as in a fresh start
            if now >= watch.restart_at:
                try:
                    new = self.airflow.start(name)
                except Exception as err:  # e.g. its port still held: try again after a pause
                    watch.quick_deaths += 1
                    watch.restart_at = now + max(self.first_backoff_s, self.backoff(watch.quick_deaths))
                    self._say(f"airflow {name} could not start ({err}); trying again later")
                    continue
                self.restarts += 1
                watch.started, watch.restart_at = now, None
                self._say(f"airflow {name} restarted (pid {new.pid})")


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        import signal

        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"

"""Log chunks and periodic chores for the agent.

The operator shows the job's output by reading ``instances/<id>/logs/<seq>.log`` in seq order, so the
stream must never have gaps, duplicates or empty chunks. ``LogStreamer`` buffers bytes written by the
output readers and uploads what is new on each ``flush``; a failed upload keeps the bytes and the seq,
so the next flush retries them in place.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from airflow_cloudtrain import runs
from airflow_cloudtrain.agent.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")

# Lines the agent itself adds to the job log start with this, so readers can tell them apart.
NOTE_PREFIX = "[cloudtrain] "
MAX_CHUNK = 4 * 1024 * 1024


class LogStreamer:
    """Collects merged output, echoes it to the agent's stdout, uploads it as numbered chunks."""

    def __init__(self, folder: RunFolder, instance_id: str, echo: BinaryIO | None = None) -> None:
        self.folder = folder
        self.instance_id = instance_id
        self.echo = echo if echo is not None else sys.stdout.buffer
        self.seq = 0
        self._pending = bytearray()
        self._ends_with_newline = True
        self._lock = threading.Lock()  # guards _pending
        self._flush_lock = threading.Lock()  # one upload at a time keeps seq order

    def write(self, data: bytes) -> None:
        if not data:
            return
        with self._lock:
            self._pending += data
            self._ends_with_newline = data.endswith(b"\n")
        try:
            self.echo.write(data)
            self.echo.flush()
        except (OSError, ValueError):
            pass  # a closed stdout must not stop the log upload

    def note(self, message: str) -> None:
        """Add one agent line to the log (never credentials: callers pass no env values)."""
        prefix = b"" if self._ends_with_newline else b"\n"
        self.write(prefix + (NOTE_PREFIX + message + "\n").encode("utf-8", "replace"))

    def _take(self, final: bool) -> bytes:
        with self._lock:
            data = bytes(self._pending[:MAX_CHUNK])
            if not final and len(data) < MAX_CHUNK and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]  # keep a partial last line for the next chunk
            del self._pending[: len(data)]
            return data

    def _give_back(self, data: bytes) -> None:
        with self._lock:
            self._pending[:0] = data

    def flush(self, final: bool = False) -> int:
        """Upload what is new; returns the number of chunks written. Raises if an upload fails."""
        written = 0
        with self._flush_lock:
            while True:
                data = self._take(final)
                if not data:
                    return written
                try:
                    self.folder.put_bytes(runs.log_key(self.instance_id, self.seq), data)
                except BaseException:
                    self._give_back(data)
                    raise
                self.seq += 1
                written += 1
                if not final and len(data) < MAX_CHUNK:
                    return written


class Periodic:
    """Calls ``fn`` every ``interval`` seconds in a daemon thread; errors are logged, never fatal."""

    def __init__(self, name: str, interval: float, fn: Callable[[], None], run_first: bool = True) -> None:
        self.name = name
        self.interval = max(0.05, float(interval))
        self.fn = fn
        self.run_first = run_first
        self._stop = threading.Event()
        self._last_error = ""
        self._thread = threading.Thread(target=self._loop, name=f"cloudtrain-{name}", daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def _call(self) -> None:
        try:
            self.fn()
        except Exception as err:  # a chore failing must not kill the run
            text = f"{type(err).__name__}: {err}"
            if text != self._last_error:  # an unreachable service would otherwise flood the log
                log.warning("%s failed: %s", self.name, text)
            self._last_error = text
        else:
            self._last_error = ""

    def _loop(self) -> None:
        if self.run_first:
            self._call()
        while not self._stop.wait(self.interval):
            self._call()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop and wait for a call in progress, so nothing writes after the caller's next step."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

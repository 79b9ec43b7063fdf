"""Log chunks and periodic chores for the agent.

The operator shows the job's output by reading ``instances/<id>/logs/<seq>.log`` in seq order, so the
stream must never have gaps, duplicates or empty chunks. ``LogStreamer`` buffers bytes written by the
output readers and uploads what is new on each ``flush``; a failed upload keeps the bytes and the seq,
so the next flush retries them in place.

Every stored line starts with ``runs.format_stamp`` of the time its first byte reached ``write`` (a
line that comes in several pieces gets one stamp, at its first byte), so readers show when the job
wrote it. The echo to the agent's own stdout is the job's output unchanged, except that the run's
secret values (``redact``) show as ``***`` there and in every chunk. Form feeds become spaces
in the stored text: the beacon's tail (``runs.Beacon``) separates chunks with them. A line cut by the
4 MiB chunk limit (or uploaded before its newline came) continues unstamped in the next chunk.

The streamer also keeps the text of its most recent chunks, up to ``runs.TAIL_MAX`` bytes, for the
beacon (``snapshot``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")

# Lines the agent itself adds to the job log start with this (after the stamp), so readers can tell
# them apart.
NOTE_PREFIX = "[cloudtrain] "
MAX_CHUNK = 4 * 1024 * 1024


def stamp_lines(data: bytes, stamp: bytes, at_line_start: bool) -> bytes:
    """``data`` with ``stamp`` at the start of every line that begins in it (the first one only when
    ``at_line_start``: else it continues a line begun earlier) and form feeds made spaces."""
    if not data:
        return b""
    data = data.replace(b"\f", b" ")
    body = data[:-1].replace(b"\n", b"\n" + stamp) + data[-1:]  # a final newline starts no line here
    return stamp + body if at_line_start else body


class LogTail:
    """The text of the most recent chunks, each followed by a form feed, within ``max_bytes`` (utf-8):
    the ``tail`` of a ``runs.Beacon``. Not thread-safe: ``LogStreamer`` holds its lock around it."""

    def __init__(self, max_bytes: int = runs.TAIL_MAX) -> None:
        self.max_bytes = max_bytes
        self.next_seq = 0  # chunks seen so far: the beacon's log_seq
        self._chunks: deque[tuple[int, str, int]] = deque()  # (seq, text + "\f", its utf-8 size)
        self._size = 0

    def add(self, seq: int, data: bytes) -> None:
        self.next_seq = seq + 1
        if len(data) + 1 > self.max_bytes:  # decoded it is no smaller: it alone overflows the tail
            self._chunks.clear()
            self._size = 0
            return
        text = data.decode("utf-8", "replace") + "\f"
        size = len(text.encode("utf-8"))
        self._chunks.append((seq, text, size))
        self._size += size
        while self._chunks and self._size > self.max_bytes:  # oldest first; maybe all of them
            self._size -= self._chunks.popleft()[2]

    def snapshot(self) -> tuple[int, int, str]:
        """(log_seq, tail_from, tail): tail_from is log_seq when the tail is empty."""
        tail_from = self._chunks[0][0] if self._chunks else self.next_seq
        return self.next_seq, tail_from, "".join(text for _, text, _ in self._chunks)


class LogStreamer:
    """Collects merged output, echoes it to the agent's stdout, uploads it as numbered chunks of
    stamped lines."""

    def __init__(
        self,
        folder: RunFolder,
        instance_id: str,
        echo: BinaryIO | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder = folder
        self.instance_id = instance_id
        self.echo = echo if echo is not None else sys.stdout.buffer
        self.clock = clock
        self.seq = 0
        self._pending = bytearray()
        self._at_line_start = True  # the next byte written starts a line (gets a stamp)
        self._tail = LogTail()
        self._redactions: list[bytes] = []  # secret values cut out of every chunk (``redact``)
        self._lock = threading.Lock()  # guards _pending, _at_line_start, _tail and seq's changes
        self._flush_lock = threading.Lock()  # one upload at a time keeps seq order

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._store(data, note=False)
        for pattern in self._redactions:  # the instance's own log too (a value cut by a read may pass)
            data = data.replace(pattern, b"***")
        self._echo(data)

    def note(self, message: str) -> None:
        """Add one agent line to the log (never credentials: callers pass no env values); it ends a
        line the job left unterminated first."""
        line = (NOTE_PREFIX + message + "\n").encode("utf-8", "replace")
        self._echo(self._store(line, note=True) + line)

    def _echo(self, data: bytes) -> None:
        try:
            self.echo.write(data)
            self.echo.flush()
        except (OSError, ValueError):
            pass  # a closed stdout must not stop the log upload

    def _store(self, data: bytes, note: bool) -> bytes:
        """Append ``data`` to what waits for upload, stamped; returns the newline a note needs first
        (already stored; the caller echoes it) or b""."""
        now = runs.format_stamp(self.clock())
        with self._lock:
            if note:
                prefix = b"" if self._at_line_start else b"\n"
                self._pending += prefix + stamp_lines(data, now, True)
                self._at_line_start = True
                return prefix
            self._pending += stamp_lines(data, now, self._at_line_start)
            self._at_line_start = data.endswith(b"\n")
            return b""

    def redact(self, patterns: list[bytes]) -> None:
        """From now on every uploaded chunk (and so the beacon's tail) shows ``***`` for these."""
        with self._lock:
            self._redactions = sorted({*self._redactions, *patterns}, key=len, reverse=True)

    def snapshot(self) -> tuple[int, int, str]:
        """(chunks uploaded, seq of the first chunk in the tail, tail): what a beacon carries."""
        with self._lock:
            return self._tail.snapshot()

    def _take(self, final: bool) -> bytes:
        with self._lock:
            data = bytes(self._pending[:MAX_CHUNK])
            if not final and len(data) < MAX_CHUNK and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]  # keep a partial last line for the next chunk
            del self._pending[: len(data)]
            for pattern in self._redactions:  # whole lines are taken, so a value is not cut in two
                data = data.replace(pattern, b"***")
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
                with self._lock:
                    self._tail.add(self.seq, data)
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

"""What the GPU-machine checks share: a run folder double, the agent's sync loop, a directory watcher.

The checks run the agent's real ``CheckpointSync`` (``airflow_cloudtrain.agent.checkpoints``, stdlib
only) against jobs written with the real frameworks, on a machine with no cloud: the run folder is
``MemoryFolder`` (the interface ``tests/unit/test_checkpoint.py``'s double implements), the upload
chore is ``SyncLoop`` (``sync()`` every ``interval`` seconds, as the agent does every
``checkpoint_interval_s``), and ``Watcher`` lists the checkpoint directory every few milliseconds so
the report can name every file the framework wrote, temporary names included, in the order they
appeared. Stdlib only: it runs under the device's plain ``python3`` with ``PYTHONPATH`` at the repo.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from airflow_cloudtrain.agent.checkpoints import CheckpointSync
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder


class MemoryFolder(RunFolder):
    """The RunFolder calls CheckpointSync makes, in a dict (thread-safe); records every upload."""

    def __init__(self) -> None:
        super().__init__("s3://device-check/runs/x/-1")
        self.objects: dict[str, bytes] = {}
        self.uploaded: list[str] = []
        self._lock = threading.Lock()

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = data
            self.uploaded.append(key)

    def get_bytes(self, key: str) -> bytes | None:
        with self._lock:
            return self.objects.get(key)

    def list(self, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(k for k in self.objects if k.startswith(prefix))

    def upload_file(self, local_path: str | os.PathLike[str], key: str) -> None:
        self.put_bytes(key, Path(local_path).read_bytes())

    def download(self, key_or_uri: str, local_path: str | os.PathLike[str]) -> None:
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            data = self.objects[key_or_uri]
        Path(local_path).write_bytes(data)

    def delete_key(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)

    def delete_prefix(self, prefix: str = "") -> int:
        with self._lock:
            gone = [k for k in self.objects if k.startswith(prefix.strip("/") + "/")]
            for key in gone:
                del self.objects[key]
        return len(gone)

    def manifests_written(self) -> int:
        """Checkpoint versions uploaded (each manifest is written once, last)."""
        return sum(1 for k in self.uploaded if k.endswith("/" + runs.MANIFEST_NAME))


def new_sync(folder: MemoryFolder, local: Path, notes: list[str]) -> CheckpointSync:
    """The agent's sync as the agent builds it, with its default settle time, calls unwrapped."""
    return CheckpointSync(folder, local, "i-device", note=notes.append, call=lambda fn, what: fn())


class SyncLoop(threading.Thread):
    """``sync.sync()`` every ``interval`` seconds until ``stop()``: the agent's upload chore."""

    def __init__(self, sync: CheckpointSync, interval: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.sync, self.interval = sync, interval
        self.errors: list[str] = []
        self.rounds = 0
        self.spans: list[tuple[float, float]] = []  # (began, ended) of every round, wall clock
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.time()
            try:
                self.sync.sync()
            except Exception as err:  # reported in the table: the agent must not fail here
                self.errors.append(f"{type(err).__name__}: {err}")
            self.spans.append((began, time.time()))
            self.rounds += 1
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


class Watcher(threading.Thread):
    """Every path that appears below ``root`` (files and directories), in order of first sight."""

    def __init__(self, root: Path, every: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.order: list[str] = []
        self._seen: set[str] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.look()
            self._halt.wait(self.every)
        self.look()

    def look(self) -> None:
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                rel = Path(dirpath, name).relative_to(self.root).as_posix()
                rel += "/" if name in dirnames else ""
                if rel not in self._seen:
                    self._seen.add(rel)
                    self.order.append(rel)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)

    def names(self) -> list[str]:
        """The names seen, with step numbers generalised (``epoch=0-step=25.ckpt`` ->
        ``epoch=E-step=N.ckpt``), each once, in order of first sight: what the framework writes."""
        out: list[str] = []
        for rel in self.order:
            generic = re.sub(r"(?<=step=)\d+", "N", rel)
            generic = re.sub(r"(?<=epoch=)\d+", "E", generic)
            generic = re.sub(r"(?<![0-9a-f])[0-9a-f]{24,}(?![0-9a-f])", "<hash>", generic)
            generic = re.sub(r"\d{10,}", "<ts>", generic)
            generic = re.sub(r"(?<![A-Za-z_])\d+(?![\d])", "N", generic)
            if generic not in out:
                out.append(generic)
        return out


STARTED: list[Job] = []


def _kill_started() -> None:
    for job in STARTED:
        if job.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(job.proc.pid, signal.SIGKILL)


def reap_on_exit() -> None:
    """Kill every job's process group when this process exits, also on the time cap's SIGTERM (the
    jobs run in their own sessions, so they would outlive it)."""
    atexit.register(_kill_started)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class Job:
    """A subprocess whose stdout lines are collected (and copied to a log file) as they come."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.log = log
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        STARTED.append(self)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "a") as sink:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                sink.write(line)
                sink.flush()

    def wait_for(self, pattern: str, deadline_s: float, count: int = 1) -> bool:
        """Whether ``count`` lines matching ``pattern`` appeared within ``deadline_s`` (False when the
        job ended first or the deadline passed)."""
        rx = re.compile(pattern)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if sum(1 for line in list(self.lines) if rx.search(line)) >= count:
                return True
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                return sum(1 for line in self.lines if rx.search(line)) >= count
            time.sleep(0.01)
        return False

    def ints(self, pattern: str) -> list[int]:
        """The first group of every line matching ``pattern``, as ints, in order."""
        rx = re.compile(pattern)
        return [int(m.group(1)) for line in list(self.lines) if (m := rx.search(line))]

    def finish(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            rc = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        return rc


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"

"""Try 1 of a kill test's DAG run, in a process of its own, forked from a warm parent.

``start(dag_id, logical_date, env)`` returns a handle with the part of ``subprocess.Popen`` the tests
use (``pid``, ``returncode``, ``poll``, ``wait``, ``communicate``, ``kill``, ``send_signal``). The
process is a fork of this worker's warm parent (``tests/try_zygote.py``: forked from the worker itself
after collection, ``prefork``, or started as a script), which has already imported Airflow and
built the in-process Execution API (about 18 CPU-seconds a fresh ``python -c`` would pay again for
every try); it runs with this process's environment plus ``env``, its stdout discarded, its stderr
kept for ``communicate``. ``CLOUDTRAIN_TEST_FORK_TRIES=0`` starts a fresh ``python -c`` instead, as
before, to tell a fork's effect from the product's.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
WARM_TIMEOUT_S = 600.0  # the parent's one start-up, on a loaded machine


@functools.cache
def _scratch() -> str:
    """This worker's folder for the warm parent's log and the tries' stderr files, removed when the
    worker exits (they were left in the machine's temp folder, a dozen files a suite)."""
    folder = tempfile.mkdtemp(prefix="cloudtrain-first-tries-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


class _ForkedParent:
    """The warm parent forked from this worker (``try_zygote.fork_here``), with the part of
    ``subprocess.Popen``'s face that ``_Zygote`` uses."""

    def __init__(self, log: Path) -> None:
        import try_zygote

        self.pid, requests, messages = try_zygote.fork_here(log)
        self.stdin = os.fdopen(requests, "wb")
        self.stdout = os.fdopen(messages, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class _Zygote:
    """The warm parent (one per pytest worker) and what it reported: forked from the worker when it is
    already warm (``prefork``), else started as a script."""

    def __init__(self, fork: bool = False) -> None:
        self.log = Path(tempfile.mkstemp(prefix="try-zygote-", suffix=".log", dir=_scratch())[1])
        self.proc: Any
        if fork:
            self.proc = _ForkedParent(self.log)
        else:
            with self.log.open("wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, str(TESTS / "try_zygote.py")],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=dict(os.environ),
                )
        self.ended: dict[int, int] = {}
        self.started: list[int] = []
        self._buffer = b""
        self.lock = threading.Lock()
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while not self._collect(deadline - time.monotonic(), want="ready"):
            if time.monotonic() >= deadline or self.proc.poll() is not None:
                self.proc.kill()
                raise RuntimeError(f"the first tries' parent did not start:\n{self.log.read_text()[-3000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _collect(self, timeout: float, want: str | None = None) -> bool:
        """Read what the parent reported within ``timeout`` seconds; whether a ``want`` message came."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return False
            chunk = os.read(fd, 65536)
            if not chunk:
                return False
            self._buffer += chunk
            came = False
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "pid" in message:
                    self.ended[int(message["pid"])] = int(message["returncode"])
                elif "started" in message:
                    self.started.append(int(message["started"]))
                came = came or want in message
            if came:
                return True

    def fork(self, request: dict[str, Any]) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not self.started:
            if not self._collect(deadline - time.monotonic(), want="started") and (
                time.monotonic() >= deadline or not self.alive()
            ):
                raise RuntimeError(f"the first tries' parent did not fork:\n{self.log.read_text()[-3000:]}")
        return self.started.pop(0)

    def collect(self, timeout: float) -> None:
        with self.lock:
            self._collect(timeout)


_zygote: _Zygote | None = None


def prefork() -> None:
    """Make this worker warm and fork its first tries' parent from it now (``try_zygote.fork_here``):
    called once, after collection and before any test (and so before any thread of the worker's own).
    Skipped, leaving the first try's start to make a parent as a script, if the worker has more threads
    than pytest-xdist's channel reader."""
    global _zygote
    if os.environ.get("CLOUDTRAIN_TEST_FORK_TRIES", "1") == "0" or _zygote is not None:
        return
    allowed = 2 if os.environ.get("PYTEST_XDIST_WORKER") else 1
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) > allowed:
        return
    import try_zygote

    try_zygote.warm()
    if threading.active_count() == 1 and len(os.listdir("/proc/self/task")) <= allowed:
        _zygote = _Zygote(fork=True)


class TryTimedOut(subprocess.TimeoutExpired):
    """``subprocess.TimeoutExpired`` whose message carries the try's stacks and stderr's tail."""

    def __init__(self, cmd: list[str], timeout: float, stacks: str) -> None:
        super().__init__(cmd, timeout, stderr=stacks)

    def __str__(self) -> str:
        return f"{super().__str__()}; its stacks and stderr's tail:\n{self.stderr}"


class ForkedTry:
    """A first try forked by the warm parent: ``subprocess.Popen``'s face for the tests."""

    def __init__(self, zygote: _Zygote, pid: int, stderr: Path, keep: bool = False) -> None:
        self.zygote, self.pid, self.stderr_path, self.keep = zygote, pid, stderr, keep
        self.returncode: int | None = None
        self.args = ["forked try", str(pid)]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.collect(0)
            self.returncode = self.zygote.ended.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if not self.zygote.alive():
                raise RuntimeError(f"the first tries' parent died:\n{self.zygote.log.read_text()[-3000:]}")
            if deadline is not None and time.monotonic() >= deadline:
                raise TryTimedOut(self.args, timeout or 0.0, self._stacks())
            wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
            self.zygote.collect(wait)
        assert self.returncode is not None
        return self.returncode

    def _stacks(self) -> str:
        """The tail of the try's stderr after it was asked for its threads' stacks (``faulthandler`` on
        SIGUSR2, registered by ``try_zygote.run_try``): where a try that did not end stands."""
        size = self.stderr_path.stat().st_size if self.stderr_path.exists() else 0
        self.send_signal(signal.SIGUSR2)
        end = time.monotonic() + 5
        while time.monotonic() < end and self.stderr_path.exists():
            if self.stderr_path.stat().st_size > size and "most recent call first" in self._tail():
                time.sleep(0.2)  # the other threads' stacks follow
                break
            time.sleep(0.1)
        return self._tail()

    def _tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def communicate(self, timeout: float | None = None) -> tuple[None, str]:
        self.wait(timeout)
        try:
            return None, self.stderr_path.read_text(errors="replace")
        finally:
            if not self.keep:
                self.stderr_path.unlink(missing_ok=True)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def try_code(dag_id: str, logical_date: datetime) -> str:
    """What a kill test's first try runs: its DAG run's ``dag.test()``."""
    return textwrap.dedent(
        f"""
        import sys
        from datetime import datetime
        sys.path.insert(0, {str(TESTS)!r})
        from dag_helpers import load_example
        when = datetime.fromisoformat({logical_date.isoformat()!r})
        load_example({dag_id!r}).test(logical_date=when, run_after=when)
        """
    )


def start_python(
    code: str, env: dict[str, str], output: Path | None = None
) -> ForkedTry | subprocess.Popen[str]:
    """Run ``code`` as ``python -c`` would, with ``env`` (the whole environment), in a fork of the warm
    parent. ``output``: a file for its stdout and stderr together; None: stdout discarded and stderr
    kept for ``communicate``."""
    global _zygote
    if os.environ.get("CLOUDTRAIN_TEST_FORK_TRIES", "1") == "0":
        sink: Any = output.open("w") if output else subprocess.DEVNULL
        try:
            return subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT if output else subprocess.PIPE,
                text=True,
            )
        finally:
            if output:
                sink.close()
    if _zygote is None or not _zygote.alive():
        _zygote = _Zygote()
    stderr = output or Path(tempfile.mkstemp(prefix="first-try-", suffix=".err", dir=_scratch())[1])
    request = {"code": code, "env": env, "stdout": str(output) if output else None, "stderr": str(stderr)}
    with _zygote.lock:
        pid = _zygote.fork(request)
    return ForkedTry(_zygote, pid, stderr, keep=output is not None)


def start(dag_id: str, logical_date: datetime, env: dict[str, str]) -> ForkedTry | subprocess.Popen[str]:
    """Start try 1 of a DAG run (``env`` added to ours: what makes it die)."""
    return start_python(try_code(dag_id, logical_date), {**os.environ, **env})

"""The xdist workers' warm parent: the libraries every worker imports, imported once, then one fork
per worker (``worker_fork`` asks for it).

Why: each of ``make test``'s six workers imported the same libraries before its first test (the
Google clients' generated messages, moto's EC2, libcst, SQLAlchemy, FastAPI and Cadwyn: about 7
CPU-seconds each), then Airflow and the in-process Execution API (about 8 more), all six at once at
the start, on two cores. Forked from a parent that did it once, a worker starts warm.

What may be imported here: libraries that read nothing of the worker's own settings at import, and
Airflow with what a worker prepares for its ``dag.test()`` runs (``try_zygote.warm``: our operators,
the in-process Execution API and its routers), imported with the controller's Airflow home, which
each fork replaces with its own before anything reads it (``airflow_rehome``, called by ``conftest``;
``CLOUDTRAIN_TEST_PRELOAD_AIRFLOW=0``: the workers import Airflow themselves). No thread or connection
is made (checked before every fork). Objects are moved to the collector's permanent generation before
forking, so the pages they sit on stay shared.

The fork becomes what ``python -u -c CODE`` would have started: the asker's stdin, stdout and
stderr, environment, working directory, ``sys.argv``, ``sys.path[0] == ""``, a fresh ``__main__``;
it ends as the interpreter ends (threads joined, atexit handlers run), and its status goes back to
the asker. An asker that goes away (killed) takes its fork with it.

    python tests/worker_zygote.py FD [--cold]   # FD: a bound, listening Unix socket; serves until
                                                # stdin closes and its forks ended (--cold: no preload,
                                                # for its own test)

``conftest`` starts it in the xdist controller and points the workers' "python" at ``worker_fork``;
``CLOUDTRAIN_TEST_FORK_WORKERS=0`` starts every worker plain.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

# Heavy, and read nothing of a worker's own settings at import (measured: ~7 CPU-seconds in all)
PRELOAD = (
    "google.cloud.compute_v1",
    "google.cloud.aiplatform_v1",
    "google.cloud.pubsub_v1",
    "google.cloud.storage",
    "google.cloud.secretmanager_v1",
    "google.auth.transport.requests",
    "sqlalchemy.orm",
    "libcst",
    "fastapi",
    "cadwyn",
    "httpx",
    "structlog",
    "moto.ec2",
    "moto.s3",
    "moto.server",
    "boto3",
    "botocore.session",
    "flask",
    "_pytest.python",
)


AIRFLOW_SETTING = "CLOUDTRAIN_TEST_PRELOAD_AIRFLOW"  # "0": the workers import Airflow themselves


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    if os.environ.get(AIRFLOW_SETTING, "1") != "0":
        # Airflow, our operators and the in-process Execution API, as each worker's first tries' parent
        # prepares them (``try_zygote.warm``), with the controller's Airflow home: each fork moves to its
        # own before anything reads it (``airflow_rehome``, from ``conftest``)
        import try_zygote  # beside this script, sys.path[0]

        path = list(sys.path)
        try_zygote.warm()
        sys.path[:] = path  # a fork's path is what ``python -c`` has (``become``)
    gc.collect()
    gc.freeze()


def _single_threaded() -> None:
    threads, tasks = threading.active_count(), len(os.listdir("/proc/self/task"))
    if threads != 1 or tasks != 1:
        raise RuntimeError(f"not single-threaded before a fork: {threads} threads, {tasks} tasks")


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while data and not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        data += more
    if not data or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    return json.loads(data), fds


def serve(listening_fd: int, warm: bool = True) -> tuple[dict[str, Any], list[int]]:
    """Fork a worker per asker until stdin closes and every fork ended; returns only in a fork. The
    socket was bound and listens already (askers wait in its backlog while the libraries load)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the workers; the controller ends us
    listener = socket.socket(fileno=listening_fd)
    if warm:
        preload()
    forks: dict[int, socket.socket] = {}  # pid -> its asker's connection
    open_stdin = True
    while open_stdin or forks:
        watched = [listener, *forks.values()] + ([sys.stdin] if open_stdin else [])
        readable, _, _ = select.select(watched, [], [], 0.2)
        for pid, conn in list(forks.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del forks[pid]
                with contextlib.suppress(OSError):
                    conn.sendall(
                        (json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode()
                    )
                conn.close()
        for ready in readable:
            if ready is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    open_stdin = False
            elif ready is listener:
                conn, _ = listener.accept()
                got = _read_request(conn)
                if got is None:
                    conn.close()
                    continue
                _single_threaded()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in forks.values():
                        other.close()
                    conn.close()
                    return got
                for fd in got[1]:
                    os.close(fd)
                forks[pid] = conn
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
            else:  # an asker's connection: it only ever closes (the asker was killed)
                pid = next((p for p, c in forks.items() if c is ready), None)
                if pid is not None and not ready.recv(1):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
    listener.close()
    sys.exit(0)


def become(request: dict[str, Any], fds: list[int]) -> str:
    """In the fork: the asker's streams, environment, directory and arguments; returns the code."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    if argv[:1] == ["-u"]:
        argv = argv[1:]
    if argv[:1] != ["-c"] or len(argv) < 2:
        raise SystemExit(f"worker_zygote: can only run '-u -c CODE', not {argv!r}")
    sys.argv = ["-c", *argv[2:]]
    sys.path[0] = ""  # as ``-c`` has it: the working directory
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)  # -u
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return argv[1]


def main() -> None:
    code = become(*serve(int(sys.argv[1]), warm="--cold" not in sys.argv[2:]))
    # at the top, outside the parent's loop: the interpreter then ends the fork as it ends a process
    exec(compile(code, "<string>", "exec"), sys.modules["__main__"].__dict__)


if __name__ == "__main__":
    main()

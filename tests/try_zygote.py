"""The warm parent of the kill tests' first tries (``tests/first_try.py``): run as a script, one per
pytest worker.

Every kill test runs try 1 of its DAG run in a process of its own, which the test or the try itself
then SIGKILLs. A fresh ``python -c`` pays about 18 CPU-seconds before the DAG starts: importing
Airflow, and building the in-process Execution API, whose Cadwyn app generates the routers of every
API version on its first request. On 2 cores that start-up was a sixth of ``make test``. This process
pays it once: it imports Airflow, our operators and the cloud clients, builds that app and its
routers, then forks one child per request, which runs the request's code as ``python -c`` would.
The fault campaign (``benchmarks/faults.py``) starts its tries the same way.

Why a fork is safe here: this process is single-threaded when it forks (checked before every fork),
has opened no database connection (the child's engine pool is disposed all the same) and has not
created the in-process API's transport, whose event-loop thread each child starts for itself.

The protocol, JSON lines: a request on stdin ``{"code", "env", "stdout", "stderr"}`` is
answered on the stdout it was started with (whatever else prints goes to its stderr) by ``{"started": pid}``; every child's end by ``{"pid": pid, "returncode": rc}``
(``rc`` as ``subprocess`` gives it: negative for a signal). When stdin closes, the children still
running are SIGKILLed and this process exits.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from airflow_cloudtrain.emulator import agent_zygote as forks
from airflow_cloudtrain.emulator.agent_zygote import run_as_main

TESTS = Path(__file__).resolve().parent


def warm() -> None:
    """Pay, once, what every try would pay before its DAG runs."""
    sys.path.insert(0, str(TESTS))
    import airflow.sdk  # noqa: F401
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    app = in_process_api_server().app  # the app; not its transport: that starts a thread
    pending: list[Any] = [app]
    seen: set[int] = set()
    while pending:  # Cadwyn builds every version's routers on its first request: do it now
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if hasattr(current, "_cadwyn_initialize") and not current._cadwyn_initialized:
            current._cadwyn_initialize()
        pending.extend(r.app for r in getattr(current, "routes", []) if getattr(r, "app", None) is not None)
    import botocore.session
    import dag_helpers  # noqa: F401
    import google.cloud.compute_v1  # noqa: F401
    import google.cloud.storage  # noqa: F401

    import airflow_cloudtrain.operators  # noqa: F401
    import airflow_cloudtrain.sensors  # noqa: F401

    botocore.session.get_session().get_service_model("ec2")  # the largest service model, parsed once


def run_try(request: dict[str, Any]) -> None:
    """In the forked child: ``request["code"]`` as ``python -c`` would run it, with the requester's
    environment, stdout and stderr (file paths; no stdout: discarded); never returns."""

    def become_try() -> None:
        os.close(_CHANNEL[0])  # only the parent reports; the child must not hold the pipe open
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        out = err if request.get("stdout") == request["stderr"] else null
        if request.get("stdout") and out is null:
            out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # a try that does not end in its test's time shows where its threads stand (ForkedTry.wait)
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
        from airflow import settings

        if getattr(settings, "engine", None) is not None:
            settings.engine.dispose(close=False)  # never a connection of the parent's pool
        exec(compile(request["code"], "<first try>", "exec"), {"__name__": "__main__"})

    run_as_main(become_try)  # as ``python -c`` would end; a thread Airflow left running does not hold it


_CHANNEL: list[int] = []  # the fd the messages go to: the stdout this process was given


def send(message: dict[str, Any]) -> None:
    forks.send(_CHANNEL[0], message)


def reap(children: set[int]) -> None:
    forks.reap(_CHANNEL[0], children)


def main() -> None:
    _CHANNEL.append(os.dup(1))  # what anything prints (Airflow's start-up logs) goes to the log instead
    os.dup2(2, 1)
    warm()
    serve()


def serve(parent: int | None = None) -> None:
    """Say ready on the channel, then fork a child per request read on stdin until stdin closes (or,
    ``parent`` given, until that process is gone: a process it forked may hold the requests' pipe)."""
    send({"ready": os.getpid()})
    children: set[int] = set()
    requests = 0  # stdin, read as bytes: never through ``sys.stdin``, whose lock a thread may have held
    buffered = b""
    while True:
        readable, _, _ = select.select([requests], [], [], 0.05)
        reap(children)
        if not readable:
            if parent is not None and os.getppid() != parent:
                break
            continue
        chunk = os.read(requests, 65536)
        if not chunk:
            break
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            request = json.loads(line)
            threads = threading.active_count()
            tasks = len(os.listdir("/proc/self/task"))
            if threads != 1 or tasks != 1:
                raise RuntimeError(f"not single-threaded before a fork: {threads} threads, {tasks} tasks")
            pid = os.fork()
            if pid == 0:
                run_try(request)
            children.add(pid)
            send({"started": pid})
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def fork_here(log: Path) -> tuple[int, int, int]:
    """Become the warm parent in a fork of the calling pytest worker, which ran ``warm()`` itself:
    (pid, the fd to write requests to, the fd its messages come on).

    Why: a parent started as a script pays ``warm()`` again (about 7 CPU-seconds, once per worker), which
    the worker pays anyway for its own ``dag.test()`` runs (the in-process Execution API is cached).
    When it is safe: called before the worker started any thread of its own (``conftest``'s
    ``pytest_collection_finish``: the emulator and the tests' threads come later); pytest-xdist's
    channel reader is the one other thread, and the child uses nothing of it (not its fds, not
    ``sys.stdin``). The child drops what is the worker's: its atexit handlers (the worker's Airflow home
    would be deleted at a try's end), fault handler, signal handlers and pytest's captured streams."""
    import gc

    # The worker's objects so far go to the collector's permanent generation: neither the worker's
    # later collections nor this parent's (nor its tries') scan them, so the pages they sit on stay
    # shared instead of being copied on the first collection after the fork. Without it each parent
    # came to hold its own copy of the worker's heap (about 340 MB of its own beside a 630 MB worker;
    # twelve of them for two suites side by side, a machine of 23 GB short of memory).
    gc.collect()
    gc.freeze()
    worker = os.getpid()
    requests_read, requests_write = os.pipe()
    messages_read, messages_write = os.pipe()
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    pid = os.fork()
    if pid:
        for fd in (requests_read, messages_write, log_fd):
            os.close(fd)
        return pid, requests_write, messages_read
    code = 1
    try:
        _leave_the_worker(requests_read, log_fd)
        for fd in (requests_read, requests_write, messages_read, log_fd):
            os.close(fd)
        _CHANNEL.append(messages_write)
        serve(parent=worker)
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)  # never back into the worker's pytest


def _leave_the_worker(requests: int, log: int) -> None:
    """In the forked parent: stdin the requests, stdout and stderr the log, as a fresh process has them."""
    import atexit
    import faulthandler
    import io
    import logging

    atexit._clear()  # the worker's handlers: ``conftest`` removes its Airflow home at exit
    faulthandler.disable()
    for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGUSR1, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(requests, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    captured = {id(sys.stdout), id(sys.stderr)}
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for handler in list(logger.handlers):
            if type(handler).__module__.startswith("_pytest"):  # pytest's log capture
                logger.removeHandler(handler)
            elif isinstance(handler, logging.StreamHandler) and id(handler.stream) in captured:
                handler.setStream(sys.stderr)  # Airflow's handlers, set up on pytest's captured stream


if __name__ == "__main__":
    main()

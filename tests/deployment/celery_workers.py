"""The production deployment's Celery workers as its operator sees them: which worker runs a task, a
worker lost with its whole process tree, and where the retry ran (``tests/deployment/test_production.py``).

A lost machine does not come back, but ``cloudtrain up`` restarts a killed worker at once (its
supervisor restarts any process that dies), under the same Celery name: left alone, a retry would land
on whichever worker asks Redis first. So the test routes work the way an operator of such a deployment
does, with Celery queues: the two blocking DAGs' tasks go to a queue of their own (``PINNED``), which
only the worker to be killed consumes (Celery's remote control: what ``airflow celery add-queue`` and
``remove-queue`` send), and that worker takes nothing else. Once it is killed, the other worker is told
to consume ``PINNED``; the restarted one consumes only what its command line names (the default queue),
so every retry of a pinned task can only go to the other worker. Each worker's own output
(``logs/<name>.out``: Celery's "Executing workload" line names the try's id) says where each try ran.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import psutil
from deployment_helpers import Up
from waiting import wait_for

from airflow_cloudtrain.cli_up_production import WORKERS, production_settings

DEFAULT = "default"  # [operators] default_queue: the queue every worker consumes from its start
CONTROL_TIMEOUT_S = 10.0  # how long a remote-control call waits for the workers' replies (then asked again)


def process_by_output(up: Up, name: str) -> psutil.Process:
    """``cloudtrain up``'s process ``name`` (two triggerers, or two workers, share one command line:
    told apart by the ``<name>.out`` file their output goes to)."""
    want = str((up.home / "logs" / f"{name}.out").resolve())
    for proc in up.children():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid == os.getsid(proc.pid) and os.readlink(f"/proc/{proc.pid}/fd/1") == want:
                return proc
    raise AssertionError(f"no {name} under cloudtrain up")


def output(up: Up, name: str) -> str:
    """What ``cloudtrain up``'s process ``name`` wrote (its restarts append to the same file)."""
    return (up.home / "logs" / f"{name}.out").read_text(errors="replace")


def ran_in(up: Up, ti_id: str) -> list[str]:
    """The workers whose output says they executed try ``ti_id`` (a killed worker's restarts write to
    the same file, so a try that ran under any incarnation of it counts there)."""
    return [
        name
        for name in WORKERS
        if any("Executing workload" in line and ti_id in line for line in output(up, name).splitlines())
    ]


def kill_tree(proc: psutil.Process) -> None:
    """SIGKILL ``proc`` and every process under it (a Celery worker, its pool, the tasks), as a lost
    machine would."""
    for each in [*proc.children(recursive=True), proc]:
        with contextlib.suppress(psutil.Error):
            each.kill()


@contextlib.contextmanager
def celery_control(up: Up) -> Iterator[Any]:
    """Celery's remote control over the deployment's broker (its Redis, password from ``production.env``)."""
    from celery import Celery

    settings = production_settings(up.home.resolve())
    app = Celery(broker=f"redis://:{settings['REDIS_PASSWORD']}@127.0.0.1:{settings['REDIS_PORT']}/0")
    try:
        yield app.control
    finally:
        app.close()


def celery_name(control: Any, name: str) -> str | None:
    """The Celery name (``worker-1@<host>``) of ``cloudtrain up``'s worker ``name``, once it answers."""
    replies = control.ping(timeout=CONTROL_TIMEOUT_S) or []
    names = [host for reply in replies for host in reply if host.startswith(f"{name}@")]
    return names[0] if names else None


def _queues(control: Any, hostname: str) -> list[str] | None:
    """The queues ``hostname`` consumes, or None when it did not answer."""
    found = control.inspect([hostname], timeout=CONTROL_TIMEOUT_S).active_queues() or {}
    return [q["name"] for q in found[hostname]] if hostname in found else None


def consume(control: Any, hostname: str, queue: str, wanted: bool) -> bool:
    """Ask ``hostname`` to start (``wanted``) or stop consuming ``queue``; whether it now does as asked
    (for ``wait_for`` to ask again until it does)."""
    if wanted:
        control.add_consumer(queue, destination=[hostname], reply=True, timeout=CONTROL_TIMEOUT_S)
    else:
        control.cancel_consumer(queue, destination=[hostname], reply=True, timeout=CONTROL_TIMEOUT_S)
    queues = _queues(control, hostname)
    return queues is not None and (queue in queues) == wanted


def route(up: Up, worker: str, queues: dict[str, bool]) -> None:
    """Make ``cloudtrain up``'s ``worker`` consume (True) or not (False) each of ``queues``."""
    with celery_control(up) as control:
        hostname = wait_for(
            lambda: celery_name(control, worker), timeout=300, interval=2, message=f"{worker} to answer"
        )
        for queue, wanted in queues.items():
            wait_for(
                lambda q=queue, w=wanted: consume(control, hostname, q, w),
                timeout=300,
                interval=2,
                message=f"{worker} consuming {queue}={wanted}",
            )

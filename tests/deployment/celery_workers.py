"""The production deployment's Celery workers as its operator sees them: which worker runs a task, a
worker lost with its whole process tree, and where the retry ran (``tests/deployment/test_production.py``).

A lost machine does not come back, but ``cloudtrain up`` restarts a killed worker at once (its
supervisor restarts any process that dies), under the same Celery name, consuming the same queue: left
alone, the retry would land on whichever of the two workers asks Redis first. So the kill is staged
the way an operator drains a machine: the DAG is paused before the kill (the scheduler queues no task
of a paused DAG, so no retry can be sent yet), the restarted worker is told to stop consuming the
queue once it answers (Celery's remote control: what ``airflow celery remove-queue`` sends), and only
then is the DAG resumed. The retry can then only go to the other worker; each worker's own output
(``logs/<name>.out``: Celery's "Executing workload" line names the try's id) says where each try ran.
Afterwards the restarted worker takes work again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil
from deployment_helpers import Api, Up
from waiting import wait_for

from airflow_cloudtrain.cli_up_production import WORKERS, production_settings

QUEUE = "default"  # [operators] default_queue: the one queue both workers consume
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


def task_process(up: Up, ti_id: str) -> psutil.Process | None:
    """The process running task instance ``ti_id`` in a Celery worker (titled ``airflow worker -- <id>``)."""
    for proc in up.children():
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(f"airflow worker -- {ti_id}"):
                return proc
    return None


def worker_of(up: Up, proc: psutil.Process) -> str:
    """Which of ``cloudtrain up``'s workers ``proc`` runs under (its session's ``<name>.out``)."""
    leader = os.getsid(proc.pid)
    for name in WORKERS:
        if process_by_output(up, name).pid == leader:
            return name
    raise AssertionError(f"{proc.pid} runs under no worker")


def ran_in(up: Up, ti_id: str) -> list[str]:
    """The workers whose output says they executed try ``ti_id`` (a killed worker's restarts write to
    the same file, so a try that ran under any incarnation of it counts there)."""
    found = []
    for name in WORKERS:
        out = (up.home / "logs" / f"{name}.out").read_text(errors="replace")
        if any("Executing workload" in line and ti_id in line for line in out.splitlines()):
            found.append(name)
    return found


def set_paused(api: Api, dag_id: str, paused: bool) -> None:
    """Pause or resume ``dag_id`` (new DAGs start paused); asked again until the api-server answers."""

    def patch() -> bool:
        try:
            api.call("PATCH", f"/dags/{dag_id}", {"is_paused": paused})
            return True
        except OSError:  # a timeout, a refused or reset connection
            return False

    wait_for(patch, timeout=300, interval=2, message=f"{dag_id} is_paused={paused}")


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


def _celery_name(control: Any, name: str) -> str | None:
    """The Celery name (``worker-1@<host>``) of ``cloudtrain up``'s worker ``name``, once it answers."""
    replies = control.ping(timeout=CONTROL_TIMEOUT_S) or []
    names = [host for reply in replies for host in reply if host.startswith(f"{name}@")]
    return names[0] if names else None


def _queues(control: Any, hostname: str) -> list[str] | None:
    """The queues ``hostname`` consumes, or None when it did not answer."""
    found = control.inspect([hostname], timeout=CONTROL_TIMEOUT_S).active_queues() or {}
    return [q["name"] for q in found[hostname]] if hostname in found else None


def _consuming(control: Any, hostname: str, wanted: bool) -> bool:
    """Ask ``hostname`` to start (``wanted``) or stop consuming QUEUE; whether it now does as asked."""
    if wanted:
        control.add_consumer(QUEUE, destination=[hostname], reply=True, timeout=CONTROL_TIMEOUT_S)
    else:
        control.cancel_consumer(QUEUE, destination=[hostname], reply=True, timeout=CONTROL_TIMEOUT_S)
    queues = _queues(control, hostname)
    return queues is not None and (QUEUE in queues) == wanted


@dataclass
class Kill:
    killed: str  # the worker SIGKILLed while it ran the task
    other: str  # the only worker the retry can go to
    first_try: str  # the killed try's task instance id


@contextlib.contextmanager
def worker_killed_retry_elsewhere(up: Up, api: Api, dag_id: str, run_id: str, task_id: str) -> Iterator[Kill]:
    """SIGKILL the worker running ``task_id``'s try with its whole process tree (the Celery worker, its
    pool, the task), as a lost machine would; yield once the retry can only go to the other worker (see
    the module's docstring); on the way out, the restarted worker consumes the queue again."""
    first_try = str(api.task(dag_id, run_id, task_id)["id"])
    task = wait_for(lambda: task_process(up, first_try), timeout=60, interval=1, message="its task's process")
    killed = worker_of(up, task)
    other = next(name for name in WORKERS if name != killed)
    worker = process_by_output(up, killed)
    set_paused(api, dag_id, True)  # before the kill: no retry is queued until the restarted worker is out
    try:
        for proc in [*worker.children(recursive=True), worker]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with celery_control(up) as control:
            hostname = wait_for(
                lambda: _celery_name(control, killed),
                timeout=600,
                interval=2,
                message=f"cloudtrain up's restarted {killed} to answer Celery's ping",
            )
            assert process_by_output(up, killed).pid != worker.pid  # it is the restarted one that answers
            wait_for(
                lambda: _consuming(control, hostname, False), timeout=300, interval=2, message="its drain"
            )
            set_paused(api, dag_id, False)
            try:
                yield Kill(killed, other, first_try)
            finally:
                wait_for(lambda: _consuming(control, hostname, True), timeout=300, interval=2)
    finally:
        set_paused(api, dag_id, False)

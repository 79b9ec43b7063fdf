"""How a job process is built and supervised.

The argv/env builders are pure so they can be tested without docker (no docker daemon in tests).
``run_process`` runs one command in its own process group with merged output, so a stop request
(spot notice, max runtime, agent shutdown) reaches the whole job tree: SIGTERM first, so a training
script can checkpoint, SIGKILL after the grace period.

``notice_grace`` decides that grace period for an interruption notice, so that SIGTERM, the job's
last checkpoint and the agent's upload of it all fit inside the notice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_cloudtrain.contract.runs import RunSpec

log = logging.getLogger("cloudtrain.agent")

CONTAINER_WORKDIR = "/workspace"

# An interruption notice without a time (GCE preemption and maintenance, the agent's own SIGTERM):
# GCE gives 30 s, so that is what we assume is left.
NOTICE_DEFAULT_LEFT_S = 30.0
MIN_SYNC_RESERVE_S = 5.0  # kept for the final checkpoint sync when no upload was timed yet
MAX_NOTICE_GRACE_S = 115.0  # AWS's two minutes less the reserve: no notice leaves more
MIN_GRACE_S = 1.0


@dataclass(frozen=True)
class StopRequest:
    """Why the agent wants the running step gone, and how long the step may take to wind down."""

    state: str  # the final state it leads to (interrupted / timed_out / idle)
    message: str
    grace_s: float


def notice_grace(
    notice_left_s: float, stop_grace_s: float | None = None, sync_reserve_s: float = MIN_SYNC_RESERVE_S
) -> float:
    """Seconds between SIGTERM and SIGKILL for a job stopped by an interruption notice.

    ``notice_left_s``: what the notice leaves until the cloud acts; ``sync_reserve_s``: what the
    agent keeps for the final checkpoint upload after the job exited. The reserve never takes more
    than half of a short notice (a 7 s notice with a 5 s reserve still gives the job 3.5 s to save).
    ``stop_grace_s`` (the spec's): the grace asked for, but never beyond what the notice leaves less
    the reserve. Always between ``MIN_GRACE_S`` and ``MAX_NOTICE_GRACE_S``.
    """
    left = max(0.0, float(notice_left_s))
    room = left - min(max(0.0, float(sync_reserve_s)), left / 2)
    grace = room if stop_grace_s is None else min(float(stop_grace_s), room)
    return min(max(grace, MIN_GRACE_S), MAX_NOTICE_GRACE_S)


def checkpoint_dir(spec: RunSpec, root: str) -> str:
    """The job's checkpoint directory: ``spec.checkpoint_dir`` (relative: under ``root``), else
    ``<root>/checkpoints``; ``root`` is where the workdir is seen (the host or the container)."""
    if not spec.checkpoint_dir:
        return f"{root}/checkpoints"
    if os.path.isabs(spec.checkpoint_dir):
        return spec.checkpoint_dir
    return f"{root}/{spec.checkpoint_dir}"


def resume_report(root: str) -> str:
    """Where the job's ``checkpoint.report_resumed(step)`` writes (outside its checkpoint directory)."""
    return f"{root}/.cloudtrain/resumed_step"


def job_env(
    spec: RunSpec,
    root: str,
    resumed_step: int | None = None,
    agent_zip: str | None = None,
    resumed: bool | None = None,
) -> dict[str, str]:
    """Variables the job gets on top of the agent's environment; ``root`` is where the workdir is seen.

    ``resumed``: a checkpoint was restored from the run folder (``CLOUDTRAIN_RESUMED=1``; default:
    whether ``resumed_step`` is set); ``resumed_step``: the step it holds (``CLOUDTRAIN_RESUMED_STEP``;
    a snapshot of files without a step has none). ``agent_zip``: appended to ``PYTHONPATH`` (after
    the spec's, else the agent's, value), so the job can import ``airflow_cloudtrain.checkpoint``.
    """
    if resumed is None:
        resumed = resumed_step is not None
    env = {str(k): str(v) for k, v in spec.env.items()}
    env.update(
        CLOUDTRAIN_OUTPUT_DIR=f"{root}/output",
        CLOUDTRAIN_CHECKPOINT_DIR=checkpoint_dir(spec, root),
        CLOUDTRAIN_RUN_ID=spec.run_id,
        CLOUDTRAIN_RUN_URI=spec.run_uri,
        CLOUDTRAIN_RESUMED="1" if resumed else "0",
        CLOUDTRAIN_RESTARTS=str(int(spec.restarts or 0)),
        CLOUDTRAIN_RESUME_REPORT=resume_report(root),
    )
    if resumed_step is not None:
        env["CLOUDTRAIN_RESUMED_STEP"] = str(resumed_step)
    if agent_zip:
        existing = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = f"{existing}{os.pathsep}{agent_zip}" if existing else agent_zip
    return env


def container_name(spec: RunSpec) -> str:
    return "cloudtrain-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", spec.run_id)[:100]


def build_docker_argv(
    spec: RunSpec,
    workdir: str,
    env_names: Sequence[str],
    volumes: Sequence[str] = (),
    agent_zip: str | None = None,
) -> list[str]:
    """``docker run`` for ``spec.image``; env passes by name only, so no value is on a command line.

    ``--init`` puts a real init as PID 1 so SIGTERM reaches the job even when the job does not trap
    it (PID 1 ignores default-action signals); ``--name`` lets the agent force-remove the container.
    ``agent_zip`` (a path as the container sees it) is appended to the image's ``PYTHONPATH`` inside
    the container, so the image's own value is kept. An absolute ``spec.checkpoint_dir`` is mounted
    at the same path.
    """
    if not spec.image:
        raise ValueError("spec.image is not set")
    argv = ["docker", "run", "--rm", "--init", "--name", container_name(spec)]
    if spec.gpus and spec.gpus > 0:
        argv += ["--gpus", "all"]
    argv += ["-v", f"{workdir}:{CONTAINER_WORKDIR}", "-w", CONTAINER_WORKDIR]
    mounts = list(volumes)
    if spec.checkpoint_dir and os.path.isabs(spec.checkpoint_dir) and spec.checkpoint_dir not in mounts:
        mounts.append(spec.checkpoint_dir)
    for volume in mounts:
        argv += ["-v", f"{volume}:{volume}"]
    for name in env_names:
        argv += ["-e", name]
    command = spec.command
    if agent_zip:
        command = f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{agent_zip}"\n{command}'
    return [*argv, spec.image, "bash", "-lc", command]


def build_job_command(
    spec: RunSpec,
    workdir: str,
    volumes: Sequence[str] = (),
    resumed_step: int | None = None,
    agent_zip: str | None = None,
    resumed: bool | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The job's argv and the variables to add to the agent's environment for that process.

    ``agent_zip``: where the agent zip is on this machine; in a container it is seen at the same
    place relative to the workdir (it must lie inside the workdir then), else it is left out there.
    """
    if spec.image:
        extra = job_env(spec, CONTAINER_WORKDIR, resumed_step, resumed=resumed)
        inside = None
        if agent_zip:
            rel = os.path.relpath(agent_zip, workdir)
            if not rel.startswith(".." + os.sep) and rel != ".." and not os.path.isabs(rel):
                inside = f"{CONTAINER_WORKDIR}/{rel}"
        return build_docker_argv(spec, workdir, sorted(extra), volumes, inside), extra
    return ["bash", "-lc", spec.command], job_env(spec, workdir, resumed_step, agent_zip, resumed)


# Exit codes of a shell whose child died of a signal it cannot or does not usually handle (SIGKILL,
# SIGABRT, SIGBUS, SIGSEGV): not 143, which a job's own SIGTERM handler exits with after saving.
HARD_KILLS = frozenset(
    128 + int(sig) for sig in (signal.SIGKILL, signal.SIGABRT, signal.SIGBUS, signal.SIGSEGV)
)


def exit_code_of(returncode: int) -> int:
    """Shell convention: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pgid, sig)


def run_process(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    sink: Callable[[bytes], None],
    should_stop: Callable[[], StopRequest | None],
    tick: float = 0.05,
    on_start: Callable[[int], None] | None = None,
    on_exit: Callable[[bool], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
) -> tuple[int, StopRequest | None]:
    """Run to completion or until ``should_stop`` answers; returns (exit code, the stop that ended it).

    ``on_start(pid)`` is called once the process exists (its pid is also its process group and
    session id), e.g. to start watching its CPU use; if it raises, the process is killed.
    ``on_exit(killed)`` is called as soon as the process is gone: whether a signal ended it (the
    agent's SIGKILL, or one it did not handle), which may have left a file half-written.
    ``on_stopping()`` is called just before the job gets its SIGTERM (the checkpoint sync's last look
    at a live job), and again just before the SIGKILL after the grace period, with the job's process
    group frozen (SIGSTOP) so that what it has open for writing then is exactly what the kill tears;
    an error there never holds the stop back.
    """
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: signals reach the job's children too
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()

    def pump() -> None:
        try:
            while chunk := os.read(fd, 65536):
                sink(chunk)
        except OSError:
            pass  # the pipe was closed under a reader that outlived its job

    reader = threading.Thread(target=pump, name="cloudtrain-output", daemon=True)
    reader.start()
    if on_start is not None:
        try:
            on_start(proc.pid)
        except BaseException:  # never leave the job running without a supervisor
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    stop: StopRequest | None = None
    kill_at = float("inf")
    escalated = False

    def last_look() -> None:
        if on_stopping is not None:
            try:
                on_stopping()
            except Exception as err:  # the stop matters more than the look
                log.warning("before stopping the job: %s: %s", type(err).__name__, err)

    while True:
        try:
            returncode = proc.wait(timeout=tick)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop is None:
            stop = should_stop()
            if stop is not None:
                last_look()
                _signal_group(proc.pid, signal.SIGTERM)
                kill_at = time.monotonic() + max(0.0, stop.grace_s)
        elif time.monotonic() >= kill_at:
            _signal_group(proc.pid, signal.SIGSTOP)  # frozen: nothing it writes changes under the look
            try:
                last_look()
            finally:  # never leave the job frozen, whatever interrupts the agent here
                _signal_group(proc.pid, signal.SIGKILL)
            kill_at = float("inf")
            escalated = True
    if on_exit is not None:
        on_exit(bool(returncode < 0 or escalated or exit_code_of(returncode) in HARD_KILLS))
    # Leftover children may hold the pipe open: give them a moment, then end the group.
    reader.join(2.0)
    if reader.is_alive():
        _signal_group(proc.pid, signal.SIGKILL)
        reader.join(5.0)
    proc.stdout.close()
    return exit_code_of(returncode), stop

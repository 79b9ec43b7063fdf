"""How a job process is built and supervised.

The argv/env builders are pure so they can be tested without docker (no docker daemon in tests).
``run_process`` runs one command in its own process group with merged output, so a stop request
(spot notice, max runtime, agent shutdown) reaches the whole job tree: SIGTERM first, so a training
script can checkpoint, SIGKILL after the grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from airflow_cloudtrain.runs import RunSpec

CONTAINER_WORKDIR = "/workspace"


@dataclass(frozen=True)
class StopRequest:
    """Why the agent wants the running step gone, and how long the step may take to wind down."""

    state: str  # the final state it leads to (interrupted / timed_out)
    message: str
    grace_s: float


def checkpoint_dir(spec: RunSpec, root: str) -> str:
    """The job's checkpoint directory: ``spec.checkpoint_dir`` (relative: under ``root``), else
    ``<root>/checkpoints``; ``root`` is where the workdir is seen (the host or the container)."""
    if not spec.checkpoint_dir:
        return f"{root}/checkpoints"
    if os.path.isabs(spec.checkpoint_dir):
        return spec.checkpoint_dir
    return f"{root}/{spec.checkpoint_dir}"


def job_env(
    spec: RunSpec, root: str, resumed_step: int | None = None, agent_zip: str | None = None
) -> dict[str, str]:
    """Variables the job gets on top of the agent's environment; ``root`` is where the workdir is seen.

    ``resumed_step``: the checkpoint step restored from the run folder (``CLOUDTRAIN_RESUMED=1`` and
    ``CLOUDTRAIN_RESUMED_STEP``), None for a fresh start (``CLOUDTRAIN_RESUMED=0``). ``agent_zip``:
    appended to ``PYTHONPATH`` (after the spec's, else the agent's, value), so the job can import
    ``airflow_cloudtrain.checkpoint``.
    """
    env = {str(k): str(v) for k, v in spec.env.items()}
    env.update(
        CLOUDTRAIN_OUTPUT_DIR=f"{root}/output",
        CLOUDTRAIN_CHECKPOINT_DIR=checkpoint_dir(spec, root),
        CLOUDTRAIN_RUN_ID=spec.run_id,
        CLOUDTRAIN_RUN_URI=spec.run_uri,
        CLOUDTRAIN_RESUMED="1" if resumed_step is not None else "0",
        CLOUDTRAIN_RESTARTS=str(int(spec.restarts or 0)),
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
) -> tuple[list[str], dict[str, str]]:
    """The job's argv and the variables to add to the agent's environment for that process.

    ``agent_zip``: where the agent zip is on this machine; in a container it is seen at the same
    place relative to the workdir (it must lie inside the workdir then), else it is left out there.
    """
    if spec.image:
        extra = job_env(spec, CONTAINER_WORKDIR, resumed_step)
        inside = None
        if agent_zip:
            rel = os.path.relpath(agent_zip, workdir)
            if not rel.startswith(".." + os.sep) and rel != ".." and not os.path.isabs(rel):
                inside = f"{CONTAINER_WORKDIR}/{rel}"
        return build_docker_argv(spec, workdir, sorted(extra), volumes, inside), extra
    return ["bash", "-lc", spec.command], job_env(spec, workdir, resumed_step, agent_zip)


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
) -> tuple[int, StopRequest | None]:
    """Run to completion or until ``should_stop`` answers; returns (exit code, the stop that ended it)."""
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
    stop: StopRequest | None = None
    kill_at = float("inf")
    while True:
        try:
            returncode = proc.wait(timeout=tick)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop is None:
            stop = should_stop()
            if stop is not None:
                _signal_group(proc.pid, signal.SIGTERM)
                kill_at = time.monotonic() + max(0.0, stop.grace_s)
        elif time.monotonic() >= kill_at:
            _signal_group(proc.pid, signal.SIGKILL)
            kill_at = float("inf")
    # Leftover children may hold the pipe open: give them a moment, then end the group.
    reader.join(2.0)
    if reader.is_alive():
        _signal_group(proc.pid, signal.SIGKILL)
        reader.join(5.0)
    proc.stdout.close()
    return exit_code_of(returncode), stop

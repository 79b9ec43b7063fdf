"""The hung-job watchdog (``RunSpec.idle_timeout_s``): is the job still doing anything?

A training job that hangs (a dead data loader, a deadlock, a prompt waiting for input) keeps its
instance, and its bill, running until ``max_runtime``. The agent samples the job while it runs and
stops it once it used no CPU, and no GPU, for ``idle_timeout_s`` in a row; the run then ends as
``idle`` (after the usual final checkpoint sync).

CPU: the job runs in its own session (``jobs.run_process`` starts it with ``start_new_session``),
so its process tree is every process whose session or process group is the job's pid, plus the
descendants (by parent pid) of the job and, for a container job, of the container's init (whose
processes are children of the container runtime, not of the ``docker run`` client). Their CPU time
(utime + stime, and cutime + cstime: children that exited and were waited for) comes from
``/proc/<pid>/stat``. Growth is summed per process between two samples, keyed by (pid, start time),
so processes that exit or appear never make the total look like it went backwards. The job is busy
in a window when its tree used at least ``CPU_BUSY_FRACTION`` of one core there (and at least two
clock ticks, so a single stray tick of a sleeping process does not count).

GPU: with ``gpu`` (the spec asks for GPUs), ``nvidia-smi`` reports each GPU's utilization; any GPU
at ``GPU_BUSY_PERCENT`` or more is busy, whatever the CPU does (a job waiting on its kernels uses
almost no CPU). When ``nvidia-smi`` is missing or fails, that sample goes by CPU alone, noted once in
the job log.

Stdlib only: this runs on the instance, from the agent zip.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

CPU_BUSY_FRACTION = 0.01  # of one core, over a sampling window
CPU_MIN_BUSY_TICKS = 2  # below this a window is idle whatever its length
GPU_BUSY_PERCENT = 1.0
MAX_SAMPLE_INTERVAL_S = 10.0
MIN_SAMPLE_INTERVAL_S = 0.5
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]

# (pid, start time in clock ticks since boot) -> CPU seconds used by it and its waited-for children
CpuSample = dict[tuple[int, int], float]


def sample_interval(timeout_s: float) -> float:
    """How often to sample: a quarter of the timeout, between 0.5 s and 10 s."""
    return min(MAX_SAMPLE_INTERVAL_S, max(MIN_SAMPLE_INTERVAL_S, float(timeout_s) / 4))


def proc_available(proc: str = "/proc") -> bool:
    """Whether this machine has a Linux ``/proc`` to read CPU times from (the watchdog needs one)."""
    return Path(proc, "self", "stat").is_file()


def parse_stat(text: str) -> tuple[int, int, int, int, int, int] | None:
    """``/proc/<pid>/stat`` -> (pid, ppid, pgrp, session, start time, CPU ticks incl. reaped
    children); None when unreadable. The command name may hold spaces and parentheses: the fields
    after it are split from the last ``)``."""
    try:
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        pid = int(head.split("(", 1)[0])
        ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
        return pid, ppid, pgrp, session, int(fields[19]), utime + stime + cutime + cstime
    except (ValueError, IndexError):
        return None


def read_proc_stats(proc: str = "/proc") -> list[tuple[int, int, int, int, int, int]]:
    """``parse_stat`` of every process; processes that exit while we read are skipped."""
    stats = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        if (parsed := parse_stat(text)) is not None:
            stats.append(parsed)
    return stats


def tree_cpu(
    roots: list[int],
    stats: list[tuple[int, int, int, int, int, int]],
    ticks_per_s: float,
) -> CpuSample:
    """CPU seconds per process of the job's tree: the session / process group of ``roots[0]`` (the
    job) and the descendants of every root (the job, a container's init)."""
    job = roots[0]
    children: dict[int, list[int]] = {}
    for pid, ppid, *_ in stats:
        children.setdefault(ppid, []).append(pid)
    todo = [root for root in roots if root > 0]
    todo += [pid for pid, _, pgrp, session, *_ in stats if job in (pgrp, session)]
    members: set[int] = set()
    while todo:
        pid = todo.pop()
        if pid not in members:
            members.add(pid)
            todo.extend(children.get(pid, []))
    return {(pid, start): ticks / ticks_per_s for pid, _, _, _, start, ticks in stats if pid in members}


def container_pid(name: str) -> int | None:
    """The host pid of a running container's init (``docker inspect``), None when there is none."""
    try:
        done = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Pid}}", name],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return int(text) if done.returncode == 0 and text.isdigit() and int(text) > 0 else None


class JobTree:
    """Reads the CPU time of one job's process tree from ``/proc`` (see the module docstring)."""

    def __init__(self, pid: int, container: str | None = None, proc: str = "/proc") -> None:
        self.pid = pid
        self.container = container
        self.proc = proc
        self.ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
        self._container_pid: int | None = None

    def container_root(self) -> int | None:
        """The container's init pid once it runs (looked up until found); None without one."""
        if self.container and self._container_pid is None:
            self._container_pid = container_pid(self.container)
        return self._container_pid

    def __call__(self) -> CpuSample:
        self.container_root()
        roots = [self.pid] + ([self._container_pid] if self._container_pid else [])
        return tree_cpu(roots, read_proc_stats(self.proc), self.ticks_per_s)


def read_gpu_utilization(timeout_s: float = 20.0) -> list[float]:
    """Each GPU's utilization in percent, from ``nvidia-smi``; raises when it is missing or fails."""
    done = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=timeout_s, check=True)
    values = [float(line.strip()) for line in done.stdout.splitlines() if line.strip()]
    if not values:
        raise ValueError("nvidia-smi listed no GPU")
    return values


def cpu_growth(before: CpuSample, after: CpuSample) -> float:
    """CPU seconds the tree used between two samples; a process that appeared counts in full, one
    that exited counts nothing (its last window was in the samples before)."""
    return sum(max(0.0, used - before.get(key, 0.0)) for key, used in after.items())


class IdleWatch:
    """Decides whether a job has been idle for ``timeout_s``; ``poll`` once per sampling interval.

    ``read_cpu`` (default: ``JobTree(pid, container)``) and ``read_gpu`` (default:
    ``read_gpu_utilization``; only asked with ``gpu``) are injectable for tests, as is ``clock``.
    ``note`` gets the one line that says the GPU cannot be read.
    """

    def __init__(
        self,
        pid: int,
        timeout_s: float,
        gpu: bool = False,
        clock: Callable[[], float] = time.monotonic,
        read_cpu: Callable[[], CpuSample] | None = None,
        read_gpu: Callable[[], list[float]] | None = None,
        note: Callable[[str], None] | None = None,
        container: str | None = None,
        ticks_per_s: float | None = None,
    ) -> None:
        self.timeout_s = float(timeout_s)
        self.gpu = gpu
        self.clock = clock
        self.read_cpu = read_cpu or JobTree(pid, container)
        self.read_gpu = read_gpu or read_gpu_utilization
        self.note = note or (lambda message: None)
        self.min_busy_s = CPU_MIN_BUSY_TICKS / (ticks_per_s or float(os.sysconf("SC_CLK_TCK")))
        self.idle_since: float | None = None
        self.gpu_failed = False
        self._last: CpuSample | None = None
        self._last_at = 0.0

    @property
    def idle_for(self) -> float:
        """Seconds since the job was last seen busy (since the first poll when never)."""
        return 0.0 if self.idle_since is None else self.clock() - self.idle_since

    def poll(self) -> bool:
        """Take a sample; True once the job has been idle for ``timeout_s`` without a break. A
        container job counts as busy until its container runs (``docker run`` may be pulling)."""
        now = self.clock()
        tree = self.read_cpu
        if isinstance(tree, JobTree) and tree.container and tree.container_root() is None:
            self.idle_since, self._last = now, None
            return False
        sample = self.read_cpu()
        busy = self._cpu_busy(sample, now) or self._gpu_busy()
        self._last, self._last_at = sample, now
        if busy or self.idle_since is None:
            self.idle_since = now
            return False
        return now - self.idle_since >= self.timeout_s

    def _cpu_busy(self, sample: CpuSample, now: float) -> bool:
        if self._last is None:
            return False
        window = max(0.0, now - self._last_at)
        return cpu_growth(self._last, sample) >= max(CPU_BUSY_FRACTION * window, self.min_busy_s)

    def _gpu_busy(self) -> bool:
        if not self.gpu:
            return False
        try:
            utilization = self.read_gpu()
        except Exception as err:
            if not self.gpu_failed:
                self.note(
                    f"idle watchdog: cannot read GPU utilization ({type(err).__name__}: {err}); "
                    "going by CPU use alone"
                )
            self.gpu_failed = True
            return False
        return max(utilization) >= GPU_BUSY_PERCENT

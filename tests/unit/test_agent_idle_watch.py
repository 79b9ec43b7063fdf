"""The hung-job watchdog's decision (``agent.idle``) with fake readings and a fake clock, the ``/proc``
parsing it rests on, and the ``nvidia-smi`` reading against a stand-in script on ``PATH``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_cloudtrain.agent import idle
from airflow_cloudtrain.agent.idle import CpuSample, IdleWatch, JobTree


class Fake:
    """A clock and CPU / GPU readings the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.cpu: CpuSample = {(100, 1): 0.0}
        self.gpu: list[float] | Exception = [0.0]
        self.gpu_reads = 0

    def read_gpu(self) -> list[float]:
        self.gpu_reads += 1
        if isinstance(self.gpu, Exception):
            raise self.gpu
        return self.gpu

    def watch(self, timeout_s: float = 30.0, gpu: bool = False, notes: list[str] | None = None) -> IdleWatch:
        return IdleWatch(
            100,
            timeout_s,
            gpu=gpu,
            clock=lambda: self.now,
            read_cpu=lambda: dict(self.cpu),
            read_gpu=self.read_gpu,
            note=(notes if notes is not None else []).append,
            ticks_per_s=100,
        )

    def run(self, watch: IdleWatch, seconds: float, step: float = 5.0, cpu_per_s: float = 0.0) -> bool:
        """Advance ``seconds`` in polls of ``step``, the job using ``cpu_per_s`` cores; whether any poll
        said idle."""
        fired = False
        for _ in range(round(seconds / step)):
            self.now += step
            self.cpu[(100, 1)] += cpu_per_s * step
            fired = watch.poll() or fired
        return fired


def test_flat_cpu_is_idle_after_the_timeout_not_before() -> None:
    fake = Fake()
    watch = fake.watch(timeout_s=30)
    assert watch.poll() is False  # the first sample only sets the baseline
    assert fake.run(watch, 25) is False  # 25 s idle: not yet
    assert fake.run(watch, 5) is True and watch.idle_for == pytest.approx(30)
    assert fake.gpu_reads == 0  # no GPU asked for


def test_growing_cpu_is_never_idle_and_resets_the_clock() -> None:
    fake = Fake()
    watch = fake.watch(timeout_s=30)
    watch.poll()
    assert fake.run(watch, 300, cpu_per_s=0.5) is False
    assert fake.run(watch, 25) is False  # idle again, from the last busy sample
    fake.run(watch, 5, cpu_per_s=0.2)  # busy once more: the clock starts over
    assert fake.run(watch, 25) is False and fake.run(watch, 5) is True


def test_noise_below_the_threshold_is_still_idle() -> None:
    """A sleeping process's stray tick (under 1% of a core and 2 ticks) does not keep a hung job alive."""
    fake = Fake()
    watch = fake.watch(timeout_s=30)
    watch.poll()
    assert fake.run(watch, 30, cpu_per_s=0.001) is True  # 5 ms per 5 s window


def test_processes_exiting_or_appearing_do_not_fake_activity() -> None:
    fake = Fake()
    watch = fake.watch(timeout_s=30)
    fake.cpu[(101, 5)] = 40.0  # a child that worked a lot earlier
    watch.poll()
    fake.now += 5
    del fake.cpu[(101, 5)]  # it exits: its time leaves the sum, which is not "negative activity"
    fake.cpu[(102, 9)] = 0.0  # a new process that does nothing (e.g. ``sleep``)
    assert watch.poll() is False
    assert fake.run(watch, 30) is True
    assert idle.cpu_growth({(1, 1): 5.0, (2, 1): 1.0}, {(1, 1): 5.5, (3, 2): 0.25}) == pytest.approx(0.75)
    assert idle.cpu_growth({(7, 1): 9.0}, {(7, 2): 1.0}) == 1.0  # pid reused: a new process


def test_a_gpu_busy_job_with_no_cpu_is_not_idle() -> None:
    fake = Fake()
    fake.gpu = [0.0, 57.0]  # one of two GPUs busy
    watch = fake.watch(timeout_s=30, gpu=True)
    watch.poll()
    assert fake.run(watch, 300) is False and fake.gpu_reads > 0
    fake.gpu = [0.0, 0.0]
    assert fake.run(watch, 25) is False and fake.run(watch, 5) is True


def test_busy_cpu_skips_the_gpu_query() -> None:
    fake = Fake()
    watch = fake.watch(timeout_s=30, gpu=True)
    watch.poll()
    reads = fake.gpu_reads
    fake.run(watch, 50, cpu_per_s=1.0)
    assert fake.gpu_reads == reads


@pytest.mark.parametrize("error", [FileNotFoundError("nvidia-smi"), subprocess.CalledProcessError(9, "x")])
def test_gpu_read_failing_falls_back_to_cpu_noted_once(error: Exception) -> None:
    fake = Fake()
    fake.gpu = error
    notes: list[str] = []
    watch = fake.watch(timeout_s=30, gpu=True, notes=notes)
    watch.poll()
    assert fake.run(watch, 100, cpu_per_s=0.5) is False  # CPU alone still says busy
    assert fake.run(watch, 30) is True  # and idle
    assert len(notes) == 1 and "cannot read GPU utilization" in notes[0] and "CPU use alone" in notes[0]
    fake.gpu = [80.0]  # it works again: the GPU counts again
    assert fake.run(watch, 100) is False


def test_sample_interval() -> None:
    assert idle.sample_interval(3) == 0.75
    assert idle.sample_interval(1) == idle.MIN_SAMPLE_INTERVAL_S
    assert idle.sample_interval(3600) == idle.MAX_SAMPLE_INTERVAL_S


# -- /proc -----------------------------------------------------------------------------------------


def _stat(pid: int, ppid: int, pgrp: int, session: int, ticks: tuple[int, int, int, int], comm: str) -> str:
    utime, stime, cutime, cstime = ticks
    fields = ["S", ppid, pgrp, session, 0, -1, 4194304, 10, 0, 0, 0, utime, stime, cutime, cstime]
    fields += [20, 0, 1, 0, 5000 + pid, 1000, 100]  # priority, nice, threads, itrealvalue, starttime...
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields)


def test_parse_stat_survives_odd_command_names() -> None:
    text = _stat(42, 1, 42, 42, (10, 5, 3, 2), comm="we ird) (name")
    assert idle.parse_stat(text) == (42, 1, 42, 42, 5042, 20)
    assert idle.parse_stat("garbage") is None


def test_tree_is_the_session_and_the_descendants_of_the_roots() -> None:
    stats = [
        idle.parse_stat(_stat(*row))  # type: ignore[arg-type]
        for row in [
            (50, 1, 50, 50, (100, 0, 0, 0), "job"),  # the job: its own session
            (51, 50, 50, 50, (10, 0, 0, 0), "child"),
            (52, 51, 60, 60, (1, 0, 0, 0), "setsid-grandchild"),  # left the session, still a descendant
            (53, 1, 50, 50, (2, 0, 0, 0), "orphan"),  # reparented to init, still in the session
            (70, 1, 70, 70, (3, 0, 0, 0), "container-init"),
            (71, 70, 70, 70, (4, 0, 0, 0), "in-container"),
            (90, 1, 90, 90, (999, 0, 0, 0), "unrelated"),
        ]
    ]
    sample = idle.tree_cpu([50], stats, ticks_per_s=100)  # type: ignore[arg-type]
    assert sorted(pid for pid, _ in sample) == [50, 51, 52, 53]
    assert sample[(50, 5050)] == 1.0
    with_container = idle.tree_cpu([50, 70], stats, ticks_per_s=100)  # type: ignore[arg-type]
    assert sorted(pid for pid, _ in with_container) == [50, 51, 52, 53, 70, 71]


@pytest.mark.skipif(not idle.proc_available(), reason="needs Linux /proc")
def test_job_tree_sees_a_busy_grandchild_and_not_a_sleeping_one() -> None:
    busy = "import time\nt = time.time()\nwhile time.time() - t < 60: pass"
    proc = subprocess.Popen(
        ["bash", "-c", f"sleep 60 & {sys.executable} -c '{busy}'; wait"], start_new_session=True
    )
    try:
        tree = JobTree(proc.pid)

        def grown() -> bool:
            first = tree()
            time.sleep(0.3)
            return idle.cpu_growth(first, tree()) > 0.01

        deadline = time.monotonic() + 30
        while not grown():
            assert time.monotonic() < deadline, "the busy grandchild's CPU time never showed"
        assert len(tree()) >= 3  # bash, sleep and python
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started: bash, sleep, python
        proc.wait()


# -- nvidia-smi -------------------------------------------------------------------------------------


def _stand_in(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script.parent


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ('echo 57; echo " 0"', lambda got: got == [57.0, 0.0]),
        ("echo oops >&2; exit 9", lambda got: isinstance(got, subprocess.CalledProcessError)),
        ("echo '[N/A]'", lambda got: isinstance(got, ValueError)),
        ("true", lambda got: isinstance(got, ValueError)),  # no GPU listed
    ],
)
def test_read_gpu_utilization(
    body: str, check: Callable[[object], bool], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{_stand_in(tmp_path, body)}:/usr/bin:/bin")
    try:
        got: object = idle.read_gpu_utilization()
    except Exception as err:
        got = err
    assert check(got), got


def test_read_gpu_utilization_without_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError):
        idle.read_gpu_utilization()

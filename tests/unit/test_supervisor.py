"""``cloudtrain up`` as a supervisor: a process that dies is restarted with a line saying so, at once
the first time and after a growing pause while it keeps dying; one that lived long enough starts over."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

from airflow_cloudtrain.cli_supervisor import Supervisor
from airflow_cloudtrain.cli_up import LocalAirflow

DEADLINE_S = 120.0


class Crashing(LocalAirflow):
    """A LocalAirflow whose "processes" are a small Python program that exits with code 3 at once."""

    def _command(self, *args: str) -> list[str]:
        return [sys.executable, "-c", "import sys; print('starting'); sys.exit(3)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait_exit(proc: subprocess.Popen[bytes]) -> None:
    proc.wait(timeout=DEADLINE_S)


def test_a_dying_process_is_restarted_with_a_line_and_growing_backoff(tmp_path: Path) -> None:
    airflow = Crashing(tmp_path, {"AIRFLOW__API__PORT": "1"})
    airflow.start("triggerer")
    clock, out = Clock(), io.StringIO()
    sup = Supervisor(airflow, out=out, first_backoff_s=1.0, max_backoff_s=4.0, stable_s=60.0, clock=clock)
    delays = []
    for _ in range(5):
        _wait_exit(airflow.procs["triggerer"])
        before = airflow.procs["triggerer"]
        sup.check()  # notices the death: restarts now, or schedules the restart
        waited = 0.0
        while airflow.procs["triggerer"] is before:
            clock.now += 0.5
            waited += 0.5
            sup.check()
        delays.append(waited)
        clock.now += 1  # it died one second after its start: a quick death
    # at once (the first check after the scheduled time), then 1, 2, 4 s, and never more than 4
    assert delays == [0.0, 1.0, 2.0, 4.0, 4.0], delays
    lines = out.getvalue().splitlines()
    exits = [line for line in lines if "airflow triggerer exited with exit code 3" in line]
    assert len(exits) == 5 and "restarting it in 0 s" in exits[0] and "restarting it in 4 s" in exits[-1]
    assert "died 2 times in a row soon after starting" in exits[1]
    assert sum("airflow triggerer restarted (pid" in line for line in lines) == 5
    assert sup.restarts == 5
    _wait_exit(airflow.procs["triggerer"])
    assert (tmp_path / "logs" / "triggerer.out").read_text().count("starting") == 6  # output appended


def test_a_process_that_lived_long_enough_is_restarted_at_once(tmp_path: Path) -> None:
    airflow = Crashing(tmp_path, {"AIRFLOW__API__PORT": "1"})
    airflow.start("scheduler")
    clock, out = Clock(), io.StringIO()
    sup = Supervisor(airflow, out=out, first_backoff_s=1.0, stable_s=60.0, clock=clock)
    for _ in range(3):
        _wait_exit(airflow.procs["scheduler"])
        before = airflow.procs["scheduler"]
        clock.now += 120  # it ran two minutes before dying: no backoff
        sup.check()
        assert airflow.procs["scheduler"] is not before
    assert out.getvalue().count("restarting it in 0 s") == 3


def test_a_process_that_runs_on_is_left_alone(tmp_path: Path) -> None:
    class Sleeping(LocalAirflow):
        def _command(self, *args: str) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(600)"]

    airflow = Sleeping(tmp_path, {"AIRFLOW__API__PORT": "1"})
    proc = airflow.start("dag-processor")
    try:
        out = io.StringIO()
        sup = Supervisor(airflow, out=out)
        start = time.monotonic()
        while time.monotonic() - start < 1:
            sup.check()
            time.sleep(0.1)
        assert airflow.procs["dag-processor"] is proc and out.getvalue() == ""
    finally:
        airflow.stop(grace_s=10)
    assert airflow.left_running() == []

"""The pure parts of benchmarks/recovery.py: percentiles, summaries, reading the job's log."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "recovery.py"
_spec = importlib.util.spec_from_file_location("recovery_bench", PATH)
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up there
_spec.loader.exec_module(bench)


def test_percentile_interpolates_between_ranks() -> None:
    assert bench.percentile([3.0], 95) == 3.0
    assert bench.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 100) == 4.0
    assert bench.percentile([1.0, 2.0, 3.0], 95) == pytest.approx(2.9)
    assert bench.percentile(list(map(float, range(101))), 95) == pytest.approx(95.0)


def test_percentile_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        bench.percentile([], 50)
    with pytest.raises(ValueError):
        bench.percentile([1.0], 101)


def test_summarize_skips_missing_values() -> None:
    assert bench.summarize([None, None]) is None
    assert bench.summarize([]) is None
    stats = bench.summarize([2.0, None, 4.0, 6.0])
    assert stats == {"n": 3, "p50": 4.0, "p95": pytest.approx(5.8), "max": 6.0}


def test_steps_from_the_job_log() -> None:
    log = "fresh start restarts=0\nstarted\nstep 1 at 10.0\nstep 2 at 10.5\n[cloudtrain] step 9 at x\n"
    assert bench.resumed_step(log) == 0
    assert bench.highest_step(log) == 2  # a line that only contains "step N at" is not the job's
    resumed = "resumed from step 20 restarts=1\nstarted\nstep 21 at 1.0\nstep 22 at 1.5\n"
    assert bench.resumed_step(resumed) == 20
    assert bench.highest_step(resumed) == 22
    assert bench.resumed_step("") is None
    assert bench.highest_step("started\n") is None


def test_since_and_goals() -> None:
    assert bench.since(12.5, 10.0) == 2.5
    assert bench.since(None, 10.0) is None
    assert bench.since("n/a", 10.0) is None
    assert bench.goal_met("relaunch", False, {"n": 3, "p50": 4.0, "p95": 29.0, "max": 40.0}) is True
    assert bench.goal_met("relaunch", True, {"n": 3, "p50": 4.0, "p95": 31.0, "max": 40.0}) is False
    assert bench.goal_met("lost_steps", True, {"n": 3, "p50": 0.0, "p95": 9.0, "max": 10.5}) is False
    assert bench.goal_met("lost_steps", False, {"n": 3, "p50": 0.0, "p95": 9.0, "max": 10.5}) is None
    assert bench.goal_met("relaunch", True, None) is None
    assert bench.verdict(None) == "n/a"

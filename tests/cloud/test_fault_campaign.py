"""A fixed-seed handful of the fault campaign's scenarios (``benchmarks/faults.py``), so that its code
cannot rot: the same draw, the same DAG, the same tries in subprocesses and the same invariant checks
(no leak, no duplicate, the documented outcome), on this test worker's emulator and Airflow home.

The whole campaign (200 scenarios) runs in ``make faults``; docs/reliability.md has its table.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import dags_folder

ROOT = Path(__file__).resolve().parents[2]
SEED = 1
# cheap scenarios of seed 1 covering both clouds, both modes, a worker killed while waiting and right
# after the launch (then retried), and a lease that lapses (then `cloudtrain gc`)
NUMBERS = [7, 8, 9]


def _why(result: dict[str, Any]) -> str:
    """The scenario's outcome as text: pytest shortens a dict in an assertion's message to a line,
    which cut the reason a try failed out of CI's report."""
    return "\n".join(f"{k}: {v}" for k, v in result.items() if k != "scenario")


def _campaign() -> Any:
    spec = importlib.util.spec_from_file_location("faults_campaign", ROOT / "benchmarks" / "faults.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1800)  # up to two tries of a task, each waited on with its own deadline
@pytest.mark.parametrize("number", NUMBERS, ids=[f"s{n:03d}" for n in NUMBERS])
def test_a_drawn_scenario_leaks_nothing_runs_once_and_ends_as_documented(
    emu, airflow_db, number: int
) -> None:
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent  # this worker's emulator and DAGs folder
    scenario = faults.draw(SEED, number)
    assert scenario == faults.draw(SEED, number)  # a replay draws the same scenario
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], (
        f"scenario {scenario.id} (replay: python benchmarks/faults.py --seed {SEED} --only {scenario.id}): "
        f"{result}"
    )
    assert result["tries"], _why(result)


@pytest.mark.timeout(1800)
def test_an_agent_crash_mid_run_is_noticed_and_the_resume_loop_goes_on(emu, airflow_db) -> None:
    """The ``agent_crash`` fault, on a checkpoint-resume run: the agent dies while its machine runs on
    (nothing reports the job's end), the operator's watchdog notices the silent agent, terminates the
    machine and relaunches; the task succeeds, at most one instance of the run lived at a time and
    nothing is left."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario("s900", SEED, "resume", "ec2spot", False, [faults.AGENT_CRASH], 2.0)
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["success"] and len(result["crashed"]) == 1, _why(result)


@pytest.mark.faults  # 45 s of a dag.test() run: make faults (the emulator's fault is in make test)
@pytest.mark.timeout(1800)
def test_a_run_folder_whose_writes_fail_for_a_while_is_ridden_out(emu, airflow_db) -> None:
    """The ``folder_writes`` fault: every write to the run folder, the operator's and the agent's, fails
    with S3's 500 for 10 s from the moment the operator starts preparing the run (its spec, code and
    lease, then the agent's first status and logs). Retries ride it out: the task succeeds on one
    instance and nothing is left."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario("s901", SEED, "train", "ec2", False, [faults.FOLDER_WRITES], 2.0, "both", 0.0)
    before = emu.request_counts().get("unavailable:PutObject", 0)
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["success"], _why(result)
    assert emu.request_counts().get("unavailable:PutObject", 0) > before  # the window did refuse writes


@pytest.mark.faults  # two tries of a dag.test() run each: make faults
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_task_cleared_while_it_runs_relaunches_cleanly(emu, airflow_db, deferrable: bool) -> None:
    """The ``cleared`` fault: the task is cleared by hand 3 s into its wait (blocking: SIGTERM, the
    operator's ``on_kill``) or its deferral (the triggerer calls the trigger's ``on_kill``); the run is
    released, and the next try launches again and succeeds; never two instances at once, nothing left."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario("s903", SEED, "train", "ec2", deferrable, [faults.CLEARED], 3.0)
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["killed", "success"], _why(result)


@pytest.mark.faults  # a dag.test() run each: make faults
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("at", [-1.0, 0.0], ids=["before_the_run", "from_its_first_object"])
def test_a_run_folder_whose_writes_are_denied_fails_naming_it_and_leaves_nothing(
    emu, airflow_db, at: float
) -> None:
    """``folder_denied_long``: every write to the run folder, the operator's and the agent's, refused as
    access denied (S3 403 ``AccessDenied``: a bucket policy or an IAM change) until the task ended, from
    before the run (the operator's first write: the spec or the code, before any launch) or from the
    moment its first object appeared (the instance runs; the agent's results upload is refused).
    Access denied is not transient, so nothing retries it: the task fails naming the refusal and the
    object refused, its instance (if any) is released and nothing is left."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario(
        f"s{910 if at < 0 else 911}",
        SEED,
        "train",
        "ec2",
        False,
        [faults.FOLDER_DENIED_LONG],
        2.0,
        "both",
        at,
    )
    before = emu.request_counts().get("denied:PutObject", 0)
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["failed"], _why(result)
    assert emu.request_counts().get("denied:PutObject", 0) > before  # the writes were refused
    log = (dags_folder() / f"{scenario.dag_id}-try1.log").read_text()
    where = f"{faults.BUCKETS['aws']}/runs/{scenario.dag_id}/"  # the refused object, in the task's error
    raised = [x for x in log.splitlines() if re.match(r"[\w.]+(Error|Exception): ", x)]
    assert any("AccessDenied" in x and where in x for x in raised), raised


@pytest.mark.faults  # a dag.test() run: make faults
@pytest.mark.timeout(1800)
def test_a_gang_whose_agents_cannot_write_fails_with_their_own_words(emu, airflow_db) -> None:
    """``folder_denied_long`` on the agents' side of a 2-node gang (campaign s018): each node's gang
    record is refused, its agent fails the job and cannot write its final status either; the end
    marker in the live index (another prefix) carries its message. The gang's wait reads it, as the
    single run's does: the task fails naming the refusal, not "the instance being TERMINATED"."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario(
        "s918", SEED, "gang", "gcspot", False, [faults.FOLDER_DENIED_LONG], 2.0, "agent", -1.0
    )
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["failed"], _why(result)
    log = (dags_folder() / f"{scenario.dag_id}-try1.log").read_text()
    assert "storage.objects.create" in log and "being TERMINATED" not in log


@pytest.mark.faults  # a dag.test() run each: make faults
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("deferrable", [False, True], ids=["blocking", "deferrable"])
def test_a_task_marked_failed_while_it_runs_is_released_and_never_relaunched(
    emu, airflow_db, deferrable: bool
) -> None:
    """The ``marked_failed`` fault: the task is marked failed by hand 3 s into its wait (blocking: SIGTERM,
    the operator's ``on_kill``) or its deferral (the triggerer calls the trigger's ``on_kill``); unlike
    ``cleared``, no try follows. The run is released, nothing is left, and its one instance is all it
    ever launched."""
    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario("s914", SEED, "train", "ec2", deferrable, [faults.MARKED_FAILED], 3.0)
    result = faults.run_scenario(asdict(scenario))
    assert result["passed"], _why(result)
    assert result["tries"] == ["killed"], _why(result)


@pytest.mark.faults  # a dag.test() run: make faults
@pytest.mark.timeout(1800)
def test_a_run_folder_the_operator_cannot_write_delays_no_end_by_minutes(emu, airflow_db) -> None:
    """``folder_writes_long`` on the operator's side, from the moment the instance runs until the task
    ended: the run succeeds (its release writes nothing to the folder), and the ``delivered`` mark after
    the release, best effort, is given up within ``MARK_BUDGET_S`` instead of call_with_retry's 5
    minutes (it held a finished task that long)."""
    import threading
    from datetime import datetime, timedelta, timezone

    from airflow_cloudtrain.contract.runs import join
    from airflow_cloudtrain.lifecycle.run.abandon import MARK_BUDGET_S

    faults = _campaign()
    faults._EMU, faults._HOME = emu, dags_folder().parent
    scenario = faults.Scenario("s904", SEED, "train", "ec2", False, [], 2.0)
    when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=904)  # as _play dates it
    folder = join(faults.BUCKETS["aws"], faults.run_key(scenario, when).path()) + "/"
    done = threading.Event()

    def fail_once_running() -> None:
        while not done.wait(0.2):
            if emu.running_instances():
                emu.fail_writes(folder, side="airflow")
                return

    watcher = threading.Thread(target=fail_once_running, daemon=True)
    watcher.start()
    try:
        result = faults.run_scenario(asdict(scenario))
    finally:
        done.set()
        watcher.join(10)
    assert result["passed"] and result["tries"] == ["success"], _why(result)
    log = (dags_folder() / f"{scenario.dag_id}-try1.log").read_text()

    def at(text: str) -> datetime:
        line = next(x for x in log.splitlines() if text in x)
        return datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))

    gave_up = at("Could not mark the end of") - at("Released instance")
    assert gave_up.total_seconds() < MARK_BUDGET_S + 120, gave_up  # it was 5 minutes

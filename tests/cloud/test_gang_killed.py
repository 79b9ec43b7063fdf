"""A deferred ``CloudTrainOperator`` gang of three whose triggerer dies mid-run (SIGKILL: no cleanup code
of ours runs), then the DAG run goes on in this process: the task ends with the gang's outcome, the
run never holds two gangs (at most three of its instances alive at any moment) and nothing is left.

Try 1 runs ``dag.test()`` in a subprocess (its triggerer is in that process) and is killed once the
task has deferred to its ``RunTrigger`` and all three nodes run the job; the same DAG run then goes on
here (the pattern of ``test_resume_killed``'s triggerer test). EC2 only: the kill and the wait are the
same code for both clouds (``RunTrigger``, ``GangWatch``); the gang tests in ``test_gang_run`` cover
GCE's launch and release.

In ``dag.test()`` the run goes on as the task run again (as in ``test_resume_killed``): a gang is never
adopted, so that try releases the first gang's three nodes (their job still holds) and only then
launches a whole new gang, whose all-reduce is the task's outcome. A trigger handed to another live
triggerer (re-created from its serialized kwargs) is ``test_gang_resume``'s deferrable case.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dag_helpers import load_example, start_first_try, task_states, xcom
from test_gang_barrier import ALLREDUCE
from test_gang_run import nothing_left
from test_runs import cloud_of, scenario
from waiting import wait_for

PREAMBLE = """
import os


class MarkingTrain(CloudTrainOperator):
    def defer(self, **kwargs):
        mark = os.environ.get("CLOUDTRAIN_TEST_MARK")
        if mark:  # tells the test that the gang's trigger is about to run
            with open(mark, "a") as out:
                out.write(type(kwargs["trigger"]).__name__ + "\\n")
        super().defer(**kwargs)
"""


class AliveSampler(threading.Thread):
    """The most instances alive at once in the emulated clouds, sampled until stopped (a sample can
    miss a moment, never invent one: a count over three is two gangs)."""

    def __init__(self, emu: Any) -> None:
        super().__init__(daemon=True)
        self.emu, self.most, self.seen = emu, 0, set[str]()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            alive = {i["id"] for i in self.emu.running_instances()}
            self.most, self.seen = max(self.most, len(alive)), self.seen | alive
            time.sleep(0.05)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def test_triggerer_killed_mid_gang_ends_with_one_gang_and_leaves_nothing(
    emu: Any, airflow_db: Any, capfd: Any, tmp_path: Path
) -> None:
    dag_id = "gang_trigger_killed_aws"
    script, release = tmp_path / "allreduce.py", tmp_path / "first-try-killed"
    script.write_text(ALLREDUCE)
    # the first gang holds (its nodes start before the kill) until it is stopped, so only the next try
    # can end it; a gang started after the kill all-reduces. Bounded at 10 minutes if the test fails
    command = (
        f"if [ ! -e '{release}' ]; then echo holding; for i in $(seq 1 3000); do sleep 0.2; done; exit 3; fi; "
        f"exec {sys.executable} {script}"
    )
    scenario(
        dag_id,
        "aws",
        command,
        deferrable=True,
        extra=", num_nodes=3",
        operator="MarkingTrain",
        preamble=PREAMBLE,
    )
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    mark = tmp_path / "deferred"
    assert emu.running_instances() == []
    sampler = AliveSampler(emu)
    sampler.start()
    try:
        proc = start_first_try(dag_id, when, {"CLOUDTRAIN_TEST_MARK": str(mark)})

        def deferred_and_holding() -> list[str] | None:
            if not mark.exists() or "RunTrigger" not in mark.read_text():
                return None
            holding = [i["id"] for i in emu.running_instances() if "holding" in emu.agent_log(i["id"])]
            return holding if len(holding) == 3 else None

        first_gang = wait_for(deferred_and_holding, timeout=240)
        proc.kill()
        proc.wait(timeout=60)
        alive = {i["id"] for i in emu.running_instances()}
        assert set(first_gang) <= alive  # the gang runs on without its triggerer
        release.touch()

        run = load_example(dag_id).test(logical_date=when, run_after=when)
    finally:
        sampler.stop()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, out[-3000:]
    # the run goes on as a new try of the task (``dag.test()`` has no separate triggerer to hand the
    # trigger to): a gang is never adopted, so the first gang goes before a whole new one launches
    (line,) = [x for x in out.splitlines() if "Releasing the 3 node(s) an earlier try of this gang left" in x]
    assert all(iid in line for iid in first_gang), line
    result = xcom(run, "train")
    assert result["num_nodes"] == 3 and result["state"] == "succeeded"
    assert [n["rank"] for n in result["nodes"]] == [0, 1, 2]
    assert [n["exit_code"] for n in result["nodes"]] == [0, 0, 0]
    second_gang = {n["instance_id"] for n in result["nodes"]}
    assert not second_gang & set(first_gang)
    assert sampler.most <= 3, f"{sampler.most} instances alive at once: two gangs"
    ids = nothing_left(emu, "aws", dag_id, run)
    assert set(ids) == set(first_gang) | second_gang == sampler.seen  # six instances in all, none left


def test_worker_killed_after_two_of_three_nodes_ends_with_one_gang_and_leaves_nothing(
    emu: Any, airflow_db: Any, capfd: Any, tmp_path: Path
) -> None:
    """A blocking gang's worker SIGKILLed (no ``on_kill``, no cleanup of ours) once two of its three
    nodes exist: the next try releases what the first left (the third node too, if its create call went
    out before the kill) before it launches one whole new gang; never more than three alive at once."""
    dag_id = "gang_worker_killed_aws"
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    # the first try's nodes hold whenever their jobs start (a quick job could end before the kill,
    # and a file the test creates after the kill would reach a node whose job starts later: that gang
    # would all-reduce and end by itself before the retry looks). The retry runs the DAG rewritten to
    # all-reduce (its spec is written after the first gang is released). Bounded at 10 minutes
    hold = "echo holding; for i in $(seq 1 3000); do sleep 0.2; done; exit 3"
    scenario(dag_id, "aws", hold, extra=", num_nodes=3")
    when = datetime(2026, 4, 2, tzinfo=timezone.utc)
    assert emu.running_instances() == []
    sampler = AliveSampler(emu)
    sampler.start()
    try:
        proc = start_first_try(dag_id, when, {})
        first = wait_for(
            lambda: [i["id"] for i in emu.running_instances()] if len(emu.running_instances()) >= 2 else None,
            timeout=240,
        )
        proc.kill()
        proc.wait(timeout=60)
        left = {i["id"] for i in emu.running_instances()}
        assert set(first) <= left  # nothing of ours ran after the kill: the partial gang is still there
        dag = scenario(dag_id, "aws", f"exec {sys.executable} {script}", extra=", num_nodes=3")
        run = dag.test(logical_date=when, run_after=when)
    finally:
        sampler.stop()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, out[-3000:]
    (line,) = [x for x in out.splitlines() if "an earlier try of this gang left" in x]
    named = set(re.findall(r"i-[0-9a-f]+", line))  # the nodes the retry released
    assert left <= named, (line, left)
    result = xcom(run, "train")
    assert [n["exit_code"] for n in result["nodes"]] == [0, 0, 0]
    second_gang = {n["instance_id"] for n in result["nodes"]}
    assert not second_gang & left
    assert sampler.most <= 3, f"{sampler.most} instances alive at once: two gangs"
    # every instance ever alive is the first try's or the new gang's, and is gone. Not only those
    # whose agents wrote to the run folder (``nothing_left``'s ids): a node launched just before the
    # kill may be released before its agent has written anything
    ids = nothing_left(emu, "aws", dag_id, run)
    assert set(ids) <= sampler.seen == named | second_gang
    states = cloud_of("aws").describe(sorted(sampler.seen))
    assert all(s.state == "terminated" for s in states.values()), states

"""``CheckpointResumeOperator(num_nodes=3)`` on the emulated EC2 and GCE, inside real Airflow: a gang
that survives losing a node, as a user would check it.

Every rank runs the checkpoint-resume job (``jobs/steps.py``: a step every 0.25 s, a checkpoint every
two steps and on SIGTERM, resuming from the newest complete checkpoint it finds). Once the head has
uploaded a checkpoint a few steps past where its gang started (the run folder has it: the agent logs
the upload after the manifest is written), rank 1 is interrupted WITH a notice; in the next gang,
rank 2 WITHOUT one. Each time the whole gang is stopped, released and relaunched, and every rank of
the new gang restores the head's last checkpoint (the one the stopped head uploaded on its SIGTERM);
the ledger has three rows per attempt whose totals add up; the two losses are two interruptions and
no error restart; only heads uploaded checkpoints; nothing is left; never two gangs alive at once.
Deferred, two of the gangs' triggers are handed to a new triggerer process mid-wait (``handover``),
one of them while both triggerers watch through a loss.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import task_states, xcom
from handover import HandOver
from test_checkpoint_resume import BUCKET, job_steps, resume_dag
from test_gang_killed import AliveSampler
from test_gang_run import gang_resources
from test_runs import cloud_of
from waiting import wait_for

from airflow_cloudtrain.contract.runs import (
    CHECKPOINTS_PREFIX,
    Manifest,
    RunKey,
    manifest_key,
    manifest_versions,
)
from airflow_cloudtrain.storage import open_run_folder

UPLOADED = re.compile(r"checkpoint step (\d+) uploaded to")


def rank_of(log: str) -> int | None:
    found = re.search(r"node rank (\d+)", log)
    return int(found.group(1)) if found else None


class GangInterrupter:
    """For each planned loss (steps past the gang's start, notice seconds, rank): waits for a gang of
    three instances not seen before whose head has uploaded a checkpoint that many steps past the step
    it restored, then interrupts that rank's instance. Remembers each gang's ids and victim."""

    def __init__(
        self,
        emu: Any,
        plan: list[tuple[int, float, int]],
        done_flag: Path,
        last: int,
        gates: list[threading.Event | None] | None = None,
    ) -> None:
        self.emu, self.plan, self.done_flag = emu, plan, done_flag
        self.last = last  # the job's last checkpoint before it holds (at STEPS - 1): always reachable
        # per planned loss, an event it waits for besides the checkpoint (a triggerer hand-over under way)
        self.gates = gates or [None] * len(plan)
        self.done: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _gang(self, used: set[str]) -> dict[int, str] | None:
        ranks: dict[int, str] = {}
        for inst in self.emu.running_instances():
            if inst["id"] not in used and (rank := rank_of(self.emu.agent_log(inst["id"]))) is not None:
                ranks[rank] = inst["id"]
        return ranks if len(ranks) == 3 else None

    def _run(self) -> None:
        used: set[str] = set()
        # a bound for a failing test only: on a loaded machine (the full suite on 2 cores) a gang of
        # three takes minutes to boot, and giving up early lets the jobs finish uninterrupted
        deadline = time.monotonic() + 900
        try:
            for (steps, notice_s, rank), gate in zip(self.plan, self.gates, strict=True):
                while time.monotonic() < deadline:
                    try:
                        if (gate is None or gate.is_set()) and self._interrupt_when_ready(
                            used, steps, notice_s, rank
                        ):
                            break
                    except Exception:  # an instance gone between the listing and its log: look again
                        pass
                    time.sleep(0.1)
        finally:
            self.done_flag.touch()  # the jobs may take their last step

    def _interrupt_when_ready(self, used: set[str], steps: int, notice_s: float, rank: int) -> bool:
        gang = self._gang(used)
        if gang is None:
            return False
        log = self.emu.agent_log(gang[0])
        start = re.search(r"resumed from step (\d+)", log)
        base = int(start.group(1)) if start else 0
        uploaded = [int(n) for n in UPLOADED.findall(log)]
        if not uploaded or uploaded[-1] < min(base + steps, self.last):
            return False
        self.done.append({"gang": gang, "victim": gang[rank], "uploaded": uploaded[-1]})
        used |= set(gang.values())
        self.emu.interrupt(gang[rank], notice_s=notice_s)
        return True

    def join(self) -> None:
        self.thread.join(10)


def head_manifests(run_uri: str) -> set[str | None]:
    """Which instances wrote the checkpoint versions the run folder holds."""
    folder = open_run_folder(run_uri)
    keys = folder.list(CHECKPOINTS_PREFIX + "/")
    return {
        Manifest.from_json(folder.get_text(manifest_key(v)) or "").instance_id
        for v in manifest_versions(list(keys))
    }


CASES = [("aws", False, False), ("gcp", True, False)]
if os.environ.get("CLOUDTRAIN_GANG_RESUME_ALL"):  # the other two combinations, on demand
    CASES += [("aws", True, False), ("gcp", False, False)]
# The hand-over runs in `make faults`: twice in four suites run beside another `make test` (load
# average 20-30) the xdist worker running it died without a trace ("node down"); not explained yet
PARAMS = [pytest.param(p, d, False, id=f"{p}-{'deferrable' if d else 'blocking'}") for p, d, _ in CASES] + [
    pytest.param("gcp", True, True, id="gcp-deferrable-handover", marks=pytest.mark.faults)
]


@pytest.mark.parametrize(("provider", "deferrable", "hand_over"), PARAMS)
def test_a_gang_that_loses_a_node_resumes_whole_from_the_heads_checkpoint(
    emu: Any,
    airflow_db: Any,
    capfd: Any,
    tmp_path: Path,
    monkeypatch: Any,
    provider: str,
    deferrable: bool,
    hand_over: bool,
) -> None:
    """Deferred, the first two gangs' triggers are also handed to a new triggerer mid-wait
    (``handover``): the first while both triggerers watch through the loss with notice, the second
    (the old one cancelled first) before the loss without notice."""
    seed = int(os.environ.get("CLOUDTRAIN_TEST_SEED") or random.randrange(10_000))  # to replay one
    rng = random.Random(seed)
    at = [rng.randint(2, 5) * 2, rng.randint(2, 5) * 2]  # checkpoints come every two steps
    print(f"seed {seed}: interrupting {at} steps past each gang's start")
    done = tmp_path / "interrupted"
    handover = None
    if hand_over:
        import airflow.sdk.definitions.dag as sdk_dag

        handover = HandOver(sdk_dag._run_inline_trigger, {1: True, 2: False})
        monkeypatch.setattr(sdk_dag, "_run_inline_trigger", handover)
    # rank 1 with a notice (the agent polls the metadata every 5 s: 30 s leave a loaded machine time),
    # then rank 2 without one; deferred, each once its gang's hand-over is under way
    # 80 steps: a job told of its interruption late (a loaded machine) still leaves the next gang room
    gates = [handover.gate(1), handover.gate(2)] if handover else None
    interrupter = GangInterrupter(emu, [(at[0], 30.0, 1), (at[1], 0.0, 2)], done, last=78, gates=gates)
    command = f'echo "node rank $NODE_RANK"; STEPS_FINISH_AFTER={done} python3 steps.py 80 2 0.25'
    dag_id = f"gang_resume_{provider}_{int(deferrable)}"
    sampler = AliveSampler(emu)
    sampler.start()
    try:
        run = resume_dag(dag_id, provider, command, deferrable, extra="num_nodes=3").test()
    finally:
        sampler.stop()
    interrupter.join()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, out[-4000:]
    assert len(interrupter.done) == 2
    if handover is not None:  # three deferrals, the first two handed over
        # the first: both watched through the loss (either may have told it); the second: the old
        # copy cancelled before the loss, which the new one told; the third gang's end, inline
        assert handover.deferrals == 3
        assert [(h["overlap"], h["cancelled"]) for h in handover.done] == [(True, False), (False, True)]
        assert handover.done[1]["winner"] == "new"
        assert all(any("[rank 1]" in x for x in h["lines"]) for h in handover.done)
        assert "Triggerer stopping: the run continues on the cloud" in out
    result = xcom(run, "train")
    rows = result["attempts"]

    # three rows per attempt, one per rank, the attempt's number and end shared by its rows
    assert [(r["attempt"], r["rank"]) for r in rows] == [(a, k) for a in (1, 2, 3) for k in range(3)], rows
    ended = [[r["ended"] for r in rows if r["attempt"] == a] for a in (1, 2, 3)]
    assert ended == [["interrupted"] * 3, ["interrupted_no_notice"] * 3, ["finished"] * 3]
    for number, lost in ((1, interrupter.done[0]), (2, interrupter.done[1])):
        gang = {r["rank"]: r["instance_id"] for r in rows if r["attempt"] == number}
        assert gang == lost["gang"]
        victim = next(r for r in rows if r["instance_id"] == lost["victim"])
        assert victim["node_state"] == "interrupted" and f"rank {victim['rank']}" in victim["message"]

    # every rank of a relaunched gang restored the head's last checkpoint of the gang before: the one
    # the stopped head uploaded on its SIGTERM, past where the interrupter saw it
    heads = [r for r in rows if r["rank"] == 0]
    for before, attempt in ((heads[0], 2), (heads[1], 3)):
        restored = {r["restored_step"] for r in rows if r["attempt"] == attempt}
        assert restored == {before["checkpoint_step"]}, (restored, before)
        reached = max(job_steps(emu.agent_log(before["instance_id"])))
        step = before["checkpoint_step"]
        assert interrupter.done[attempt - 2]["uploaded"] <= step <= reached
        for r in rows:
            if r["attempt"] == attempt:  # the job's own word, on every rank
                assert f"resumed from step {step}" in emu.agent_log(r["instance_id"])
    # only heads uploaded (with checkpoint_ranks="head" no rank races the head on checkpoints/)
    assert head_manifests(result["run_uri"]) <= {r["instance_id"] for r in heads}
    assert all(r["checkpoint_step"] is None for r in rows if r["rank"])

    # the totals are the rows' sums; a lost node is one interruption of the gang, not an error
    totals = result["totals"]
    assert totals["attempts"] == 3 and totals["rows"] == 9
    assert totals["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert result["cost_usd"] == totals["cost_usd"] and all(r["cost_usd"] > 0 for r in rows)
    assert result["interruptions"] == totals["interruptions"] == 2
    assert totals["error_restarts"] == 0 and result["restarts"] == 2
    assert "(a gang's attempt counts once" in out
    folder = open_run_folder(result["run_uri"])
    stored = json.loads(folder.get_text(f"ledger/{result['run_id']}.json"))
    assert [(r["attempt"], r["rank"], r["instance_id"]) for r in stored["attempts"]] == [
        (r["attempt"], r["rank"], r["instance_id"]) for r in rows
    ]

    # the XCom's gang keys are the last attempt's; its head finished all 80 steps
    assert result["num_nodes"] == 3
    assert [n["rank"] for n in result["nodes"]] == [0, 1, 2]
    assert result["instance_id"] == result["nodes"][0]["instance_id"] == heads[2]["instance_id"]
    assert all(n["exit_code"] == 0 and n["private_ip"] for n in result["nodes"])
    assert folder.get_text(f"results/{heads[2]['instance_id']}/final.json") == '{"step": 80}'

    # nothing left: all nine instances ended, no security group / firewall rule of the run; never
    # more than one gang alive at once
    ids = [r["instance_id"] for r in rows]
    assert sampler.most <= 3, f"{sampler.most} instances alive at once: two gangs"
    assert sampler.seen == set(ids)
    digest = RunKey(dag_id, "train", run.run_id, -1, BUCKET[provider]).digest

    def all_gone() -> bool:
        states = cloud_of(provider).describe(ids)
        return all(s.state == "terminated" for s in states.values()) and not gang_resources(
            emu, provider, digest
        )

    wait_for(all_gone, timeout=120, message="the gangs' instances and network to be gone")


def manifest_writers(run_uri: str, base: str) -> set[str | None]:
    """Which instances wrote the checkpoint versions under ``base`` of the run folder."""
    folder = open_run_folder(f"{run_uri}/{base}" if base else run_uri)
    keys = folder.list(CHECKPOINTS_PREFIX + "/")
    return {
        Manifest.from_json(folder.get_text(manifest_key(v)) or "").instance_id
        for v in manifest_versions(list(keys))
    }


@pytest.mark.faults  # three agents uploading every rank: long for make test; make faults runs it
def test_checkpoint_ranks_all_keeps_and_restores_each_ranks_own(
    emu: Any, airflow_db: Any, capfd: Any, tmp_path: Path
) -> None:
    """``checkpoint_ranks="all"``: every rank's agent uploads its own directory (rank r >= 1 under
    ``ranks/<r>/``) and, after rank 1 is lost with a notice, every rank of the new gang restores its
    own rank's version of the newest step that every rank uploaded (``agent.gang.common_steps``).

    The first gang's jobs hold at step 8, so the two ranks that keep running stop there and keep
    every version (2, 4, 6, 8); rank 1 stops where its notice found it, usually behind them: the gang
    then goes back to rank 1's newest step that the others have too, and the head's log says so."""
    done = tmp_path / "interrupted"
    interrupter = GangInterrupter(emu, [(4, 30.0, 1)], done, last=8)
    command = (
        f'echo "node rank $NODE_RANK"; STEPS_HOLD_AT=8 STEPS_FINISH_AFTER={done} python3 steps.py 24 2 0.25'
    )
    extra = 'num_nodes=3, checkpoint_ranks="all"'
    run = resume_dag("gang_resume_all", "aws", command, extra=extra).test()
    interrupter.join()
    out = capfd.readouterr().out
    assert task_states(run) == {"train": "success"}, out[-4000:]
    result = xcom(run, "train")
    rows = result["attempts"]
    assert [(r["attempt"], r["rank"], r["ended"]) for r in rows] == [
        (a, k, e) for a, e in ((1, "interrupted"), (2, "finished")) for k in range(3)
    ], rows
    first, second = rows[:3], rows[3:]
    uploaded = [{int(n) for n in UPLOADED.findall(emu.agent_log(row["instance_id"]))} for row in first]
    common = max(set.intersection(*uploaded))
    assert [row["restored_step"] for row in second] == [common] * 3, (uploaded, second)
    for rank in range(3):
        assert common <= first[rank]["checkpoint_step"], (rank, first[rank])
        assert f"resumed from step {common}" in emu.agent_log(second[rank]["instance_id"])
        base = f"ranks/{rank}" if rank else ""
        writers = manifest_writers(result["run_uri"], base)
        assert writers and writers <= {first[rank]["instance_id"], second[rank]["instance_id"]}
    if len({max(steps) for steps in uploaded}) > 1:
        assert f"every rank restores step {common}, the newest they all have" in out
    assert result["interruptions"] == 1 and result["totals"]["error_restarts"] == 0


def test_a_resuming_gang_killed_mid_run_leaves_nothing_and_bills_every_node(
    emu: Any, airflow_db: Any, capfd: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task killed (SIGTERM: Airflow's ``on_kill``) while its gang runs: every node and the gang's
    security group go, and the ledger in the run folder has the attempt as one ``abandoned`` row per
    node, whose shares add up to what the gang cost.

    The signal lands in the worst place: inside the wait's poll, before it reads the nodes' statuses.
    Airflow runs ``on_kill`` on that thread, there; the poll then reads what the kill left (nodes
    marked released, terminated), which must not pass for the attempt's end (CI once caught the
    ledger calling it an interruption)."""
    from airflow_cloudtrain.core.logstream import LogFollower

    dag_id = "gang_resume_killed"
    before = signal.getsignal(signal.SIGTERM)
    fired, armed = threading.Event(), threading.Event()
    follow = LogFollower.poll

    def follow_after_the_kill(self: LogFollower, *args: Any) -> Any:  # the poll's first read
        if armed.is_set() and not fired.is_set() and threading.current_thread() is threading.main_thread():
            fired.set()
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs on this thread before the call
        return follow(self, *args)

    monkeypatch.setattr(LogFollower, "poll", follow_after_the_kill)

    def watch() -> None:  # once the head's agent uploaded a checkpoint: the gang runs its job
        deadline = time.monotonic() + 500
        while time.monotonic() < deadline:
            for inst in emu.running_instances():
                log = emu.agent_log(inst["id"])
                if rank_of(log) == 0 and UPLOADED.search(log):
                    armed.set()
                    return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    try:
        thread.start()
        command = 'echo "node rank $NODE_RANK"; STEPS_HOLD_AT=4 python3 steps.py 24 2 0.25'
        run = resume_dag(dag_id, "aws", command, extra="num_nodes=3").test()
        thread.join(5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert fired.is_set()
    assert task_states(run) == {"train": "failed"}
    key = RunKey(dag_id, "train", run.run_id, -1, BUCKET["aws"])
    folder = open_run_folder(f"{BUCKET['aws']}/{key.path()}")
    ledger = json.loads(folder.get_text(f"ledger/{key.short_id}.json") or "{}")
    rows = ledger["attempts"]
    assert [(r["attempt"], r["rank"], r["ended"]) for r in rows] == [(1, k, "abandoned") for k in range(3)]
    assert ledger["totals"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows))
    assert all(r["cost_usd"] > 0 for r in rows)
    ids = [r["instance_id"] for r in rows]

    def all_gone() -> bool:
        states = cloud_of("aws").describe(ids)
        return all(s.state == "terminated" for s in states.values()) and not gang_resources(
            emu, "aws", key.digest
        )

    wait_for(all_gone, timeout=120, message="the gang's instances and network to be gone")

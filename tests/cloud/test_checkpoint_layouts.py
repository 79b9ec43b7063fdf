"""Framework checkpoint layouts through real agents on both clouds, interrupted twice.

The job (``jobs/layouts.py``) saves the way TensorFlow, Lightning, Orbax, Hugging Face or a plain
"overwrite ``checkpoint.pt``" job does, does not handle SIGTERM (the frameworks do not), and resumes
through the framework's own "find latest" rule, which also verifies every byte it loads. Agent 1 is
stopped like a spot notice stops it (SIGTERM to the agent: the job is killed wherever it is, the
agent's final sync keeps what is complete); agent 2 restores, goes on, and is lost with its
instance (SIGKILL to the agent and the job: no final sync); agent 3 restores what the periodic sync
had kept and finishes. Each restore must be a checkpoint the job had completely saved, the newest
one the agent could know was complete, and the step the status reports must be the step the job
really resumed from.
"""

from __future__ import annotations

import json
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_agent_checkpoints import FAST, Agent, manifests, newest, reap
from test_agent_checkpoints import run_folder as run_folder  # the fixture
from waiting import wait_for

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder

JOB = Path(__file__).resolve().parent / "jobs" / "layouts.py"
LAYOUTS = ["tensorflow", "lightning", "orbax", "huggingface", "overwrite"]
STEP_S = 0.05
# (total steps, a save every N steps). A file rewritten in place is taken once two looks a second
# apart agree, so the overwriting job saves every second or so, as a real one (every few minutes)
# leaves far more room; the others save often to be interrupted in the middle of a save.
# total: room for two more saves after the first run's hold (``HOLD_AFTER_SAVES`` saves in, on a busy
# machine where the upload is seen late) before the hold at the last step: 8 * 30 + 2 * 30 < 330 - 1
PACE = {"overwrite": (330, 30)}
DEFAULT_PACE = (40, 2)


def _spec(folder: RunFolder, scheme: str, layout: str, hold: Path, **env: str) -> None:
    total, every = PACE.get(layout, DEFAULT_PACE)
    spec = runs.RunSpec(
        run_id="ct-layouts",
        run_uri=folder.uri,
        cloud="ec2spot" if scheme == "s3" else "gcspot",
        command=f"exec {sys.executable} -S {JOB} {layout} {total} {every} {STEP_S}",
        env={"LAYOUTS_HOLD_AT_END": str(hold), **env},
        **{**FAST, "checkpoint_interval_s": 0.5},
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())


def _saves(agent: Agent) -> list[tuple[int, float]]:
    """(step, when) of every save the job finished, from the job's record on the instance's disk: the
    uploaded log of an instance lost without notice ends at its last periodic upload, which may come
    before or after the checkpoint sync that took a newer save."""
    record = agent.workdir / "saves.log"
    text = record.read_text() if record.exists() else ""
    return [(int(s), float(t)) for s, t in re.findall(r"^saved (\d+) at ([\d.]+)$", text, re.M)]


def _complete(agent: Agent) -> set[int]:
    """The steps a restore may find of this agent's job: every save it finished, and the one under way
    when it was killed (stopped at any instruction, the job may have committed that save, an atomic
    rename or its last file, without getting to write its "saved" line; the framework's rule that
    found it verified every byte, so a torn one is ``CORRUPT``, never a resume)."""
    record = agent.workdir / "saves.log"
    started = re.findall(r"^saving (\d+)$", record.read_text() if record.exists() else "", re.M)
    return {s for s, _ in _saves(agent)} | {int(s) for s in started[-1:]}


# the file the framework's "find latest" reads, where a version can hold a step without it (a
# Lightning step file uploaded before the first ``last.ckpt`` was written: a complete checkpoint, but
# not one ``ckpt_path="last"`` finds)
FOUND_BY = {"lightning": "last.ckpt", "overwrite": "checkpoint.pt"}


def _has_checkpoint(folder: RunFolder, layout: str) -> bool:
    """A version holds a checkpoint the framework's rule finds after a restore."""
    found = manifests(folder)
    if layout in FOUND_BY:
        return any(any(f["path"] == FOUND_BY[layout] for f in m.files) for m in found.values())
    return any(m.step is not None for m in found.values())


def _resumed(agent: Agent) -> int:
    found = wait_for(
        lambda: re.search(r"^(resumed from step (\d+)|CORRUPT .*)$", agent.job_log(), re.M),
        timeout=120,
        message="the job to resume",
    )
    assert not found.group(0).startswith("CORRUPT"), found.group(0)
    return int(found.group(2))


def _kill_job(agent: Agent) -> None:
    """SIGKILL the agent's job: every process whose environment names the agent's workdir (the job
    runs in its own session; the agent itself only has the workdir on its command line)."""
    reap(agent.workdir)


def _kill_instance(agent: Agent) -> None:
    """The instance is gone without notice: the agent and the job die at once, nothing is synced."""
    assert agent.proc is not None
    agent.proc.kill()
    agent.proc.wait(timeout=60)
    _kill_job(agent)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_framework_layout_resumes_after_two_interruptions(
    layout: str, run_folder: tuple[Any, RunFolder, Path, str]
) -> None:
    emu, folder, tmp, scheme = run_folder
    hold = tmp / "finish"
    _spec(folder, scheme, layout, hold)
    rng = random.Random()

    # 1: stopped like a notice stops it, at a random point after a few saves
    first = Agent(emu, folder, tmp, scheme).start()
    assert _resumed(first) == 0
    wait_for(
        lambda: len(_saves(first)) >= 3 and _has_checkpoint(folder, layout), timeout=120, message="an upload"
    )
    time.sleep(rng.uniform(0, 0.3))  # a random point: maybe in the middle of a save
    assert first.proc is not None
    before = newest(folder)  # the final sync can only add a newer version to what is there
    first.proc.send_signal(signal.SIGTERM)
    status = first.wait()
    assert status.state == runs.INTERRUPTED, status
    saved = _complete(first)
    assert not [n for n in first.notes() if n.startswith("WARNING")]  # a first attempt: nothing to say

    # 2: restores the newest complete checkpoint the agent could know was complete
    second = Agent(emu, folder, tmp, scheme).start()
    resumed = _resumed(second)
    assert resumed in saved, (resumed, saved)  # a checkpoint the job had completely saved
    assert before[1].step is None or resumed >= before[1].step, (resumed, before)
    assert not [n for n in second.notes() if n.startswith("WARNING")]
    # the status says the step the job resumed from (a files snapshot carries none in its names)
    second_status = wait_for(lambda: second.status() if second.status().restore else None, timeout=60)
    assert second_status.restore is not None and second_status.restore["version"] >= 1
    if layout != "overwrite":
        assert second_status.restored_step == resumed

    # 3: the instance is lost without notice after a few more saves; a relaunch takes the periodic sync
    wait_for(lambda: len([s for s, _ in _saves(second) if s > resumed]) >= 2, timeout=120, message="saves")
    wait_for(
        lambda: newest(folder)[1].instance_id == second.iid, timeout=120, message="a periodic upload of run 2"
    )
    time.sleep(rng.uniform(0, 0.3))
    _kill_instance(second)
    kept_version, kept = newest(folder)
    third = Agent(emu, folder, tmp, scheme).start()
    again = _resumed(third)
    if layout != "overwrite":
        assert again in _complete(second) and again > resumed, (again, resumed)
        assert again == kept.step  # the newest kept version: periodic, since nothing synced at the end
    else:  # each file at its newest stable version: checkpoint.pt may still be the one run 2 restored
        assert again in saved | _complete(second) and again >= resumed, (again, resumed)
    hold.write_text("go")
    status = third.wait()
    assert status.state == runs.SUCCEEDED, third.log()[-3000:]
    result = json.loads(folder.get_text(runs.join(runs.results_prefix(third.iid), "result.json")) or "{}")
    assert result == {"resumed_from": again, "step": PACE.get(layout, DEFAULT_PACE)[0]}
    assert status.restore is not None and status.restore["version"] >= kept_version
    for agent in (first, second, third):  # never a temporary name in the run folder
        assert not [k for k in folder.list("checkpoints/") if "tmp" in k or k.endswith("_temp")], agent.iid


@pytest.mark.parametrize("scheme_layout", ["overwrite"])
def test_a_job_killed_while_writing_restores_the_previous_version(
    scheme_layout: str, run_folder: tuple[Any, RunFolder, Path, str]
) -> None:
    """The job dies halfway through rewriting ``checkpoint.pt`` in place: the torn file never
    replaces the version the run folder has."""
    emu, folder, tmp, scheme = run_folder
    gate = tmp / "gate"
    pause = {"LAYOUTS_PAUSE_IN_SAVE": "3", "LAYOUTS_GATE": str(gate), "LAYOUTS_GATE_BEFORE_SAVE": "3"}
    _spec(folder, scheme, scheme_layout, tmp / "finish", **pause)
    first = Agent(emu, folder, tmp, scheme).start()
    every = PACE[scheme_layout][1]
    wait_for(lambda: len(_saves(first)) == 2, timeout=120, message="two saves")
    wait_for(lambda: _has_checkpoint(folder, scheme_layout), timeout=120, message="checkpoint.pt uploaded")
    gate.write_text("go")  # the third save may start now: it stops halfway
    wait_for(lambda: "paused in save" in first.job_log(), timeout=120, message="the job to pause in its save")
    saved = [s for s, _ in _saves(first)]
    assert saved == [every, 2 * every]
    _kill_job(first)  # killed while writing
    status = first.wait()
    assert status.state == runs.FAILED and status.exit_code == 137, status
    version, manifest = newest(folder)
    entry = next(f for f in manifest.files if f["path"] == "checkpoint.pt")
    data = folder.get_bytes(entry.get("key") or runs.join(runs.checkpoint_prefix(version), "checkpoint.pt"))
    assert data is not None and len(data) == entry["size"]
    kept = int.from_bytes(data[4:12], "big")  # the step inside the version the run folder has
    _spec(folder, scheme, scheme_layout, tmp / "finish")  # the relaunch saves without pausing
    second = Agent(emu, folder, tmp, scheme).start()
    assert _resumed(second) == kept and kept in saved  # a whole, earlier version: never the torn one
    (tmp / "finish").write_text("go")
    assert second.wait().state == runs.SUCCEEDED


def test_a_relaunch_that_restores_nothing_says_why(run_folder: tuple[Any, RunFolder, Path, str]) -> None:
    """Progress made, nothing kept (a Trainer directory that never got its state file): the relaunch
    warns once, naming what was there and why it was not taken; the status carries the reason."""
    emu, folder, tmp, scheme = run_folder
    script = tmp / "hf_broken.py"
    script.write_text(
        "import os, pathlib, time\n"
        "d = pathlib.Path(os.environ['CLOUDTRAIN_CHECKPOINT_DIR'])\n"
        "(d / 'checkpoint-500').mkdir(exist_ok=True)\n"
        "(d / 'checkpoint-500' / 'model.safetensors').write_bytes(b'weights')\n"
        "print('saved', flush=True)\n"
        "time.sleep(0 if os.environ['CLOUDTRAIN_RESTARTS'] != '0' else 3600)\n"
    )
    spec = runs.RunSpec(
        run_id="ct-hf",
        run_uri=folder.uri,
        cloud="ec2spot" if scheme == "s3" else "gcspot",
        command=f"exec {sys.executable} -S {script}",
        **{**FAST, "checkpoint_interval_s": 0.5},
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    first = Agent(emu, folder, tmp, scheme).start()
    wait_for(lambda: folder.get_text(runs.LEFT_OUT_KEY), timeout=120, message="the left-out record")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)
    first.wait()
    assert not [n for n in first.notes() if n.startswith("WARNING")]
    spec.restarts = 1
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    second = Agent(emu, folder, tmp, scheme).start()
    status = second.wait()
    warnings = [n for n in second.notes() if n.startswith("WARNING")]
    assert len(warnings) == 1, second.notes()
    assert "checkpoint-500/model.safetensors" in warnings[0] and "no trainer_state.json yet" in warnings[0]
    assert status.restored_step is None and status.restore is not None
    assert "no trainer_state.json yet" in status.restore["note"]


@pytest.mark.parametrize("layout", ["huggingface", "orbax"])
def test_a_notice_uploads_the_newest_directory_without_a_later_neighbour(
    layout: str, run_folder: tuple[Any, RunFolder, Path, str]
) -> None:
    """The job saved its newest step directory and sits at its last step; no periodic round runs
    (interval one hour). The notice's final sync still takes that directory: nothing waits for a
    later neighbour or a marker the framework never writes."""
    emu, folder, tmp, scheme = run_folder
    spec = runs.RunSpec(
        run_id="ct-notice",
        run_uri=folder.uri,
        cloud="ec2spot" if scheme == "s3" else "gcspot",
        command=f"exec {sys.executable} -S {JOB} {layout} 20 5 0.01",
        env={"LAYOUTS_HOLD_AT_END": str(tmp / "never")},
        **{**FAST, "checkpoint_interval_s": 3600.0},
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    agent = Agent(emu, folder, tmp, scheme).start()
    wait_for(lambda: [s for s, _ in _saves(agent)] == [5, 10, 15], timeout=120, message="three saves")
    assert not manifests(folder)  # nothing went up yet
    if scheme == "s3":
        emu.metadata.set_spot_action(agent.iid, "terminate", at=time.time() + 120)
    else:
        emu.metadata.set_preempted(agent.iid)
    status = agent.wait()
    assert status.state == runs.INTERRUPTED and status.checkpoint is not None, status
    assert status.checkpoint["step"] == 15 and newest(folder)[1].layout == layout
    second = Agent(emu, folder, tmp, scheme).start()
    assert _resumed(second) == 15
    (tmp / "never").write_text("go")
    assert second.wait().state == runs.SUCCEEDED

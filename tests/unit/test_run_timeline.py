"""The per-run timeline's marks (``ui.timeline``, ``ui.run_timeline``): checkpoints and the step
restored on the attempt that made them, the deadline line, an attempt still running drawn up to now
with an open end, and a fleet's workers with their finished items and the counts over time, all read
from what the run folder already holds (its ledger, manifests, statuses, worker and item records)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from airflow_cloudtrain.contract.runs import Manifest, RunStatus, manifest_key, status_key
from airflow_cloudtrain.contract.workqueue import ItemOutcome, WorkerRecord, outcome_key
from airflow_cloudtrain.lifecycle.resume.history import AttemptRow, RunHistory, ledger_key
from airflow_cloudtrain.ui.run_timeline import checkpoint_marks, fleet_parts, timeline_of
from airflow_cloudtrain.ui.timeline import Bar, Mark, Series, timeline_svg

T0 = 1_764_201_600.0


class Folder:
    """A run folder's listing and reads (what the timeline uses of ``RunFolder``)."""

    def __init__(self, objects: dict[str, str]) -> None:
        self.objects = objects

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def get_text(self, key: str) -> str | None:
        return self.objects.get(key)


def test_marks_the_running_bar_and_the_deadline_are_drawn() -> None:
    bars = [
        Bar("#1", T0, T0 + 100, True, True, marks=(Mark(T0 + 40, "checkpoint", "step 4"),)),
        Bar(
            "#2", T0 + 120, T0 + 200, False, False, marks=(Mark(T0 + 130, "restore", "step 4"),), running=True
        ),
    ]
    svg = timeline_svg(bars, "r", deadline=T0 + 300)
    assert re.findall(r'class="ct-mark ct-(\w+)" data-index="(\d)"', svg) == [
        ("checkpoint", "0"),
        ("restore", "1"),
    ]
    assert "<title>checkpoint: step 4</title>" in svg
    assert 'class="ct-running" data-index="1"' in svg and svg.count('class="ct-running"') == 1
    deadline = re.search(r'class="ct-deadline" x1="([\d.]+)"', svg)
    last_bar_end = max(
        float(x) + float(w)
        for x, w in re.findall(r'ct-bar \w+" data-index="\d" x="([\d.]+)" y="\d+" width="([\d.]+)"', svg)
    )
    assert deadline is not None and float(deadline[1]) > last_bar_end  # the axis reaches the deadline
    # a mark outside its bar's lifetime is not drawn on it
    assert "ct-mark" not in timeline_svg(
        [Bar("#1", T0, T0 + 10, True, False, marks=(Mark(T0 + 50, "checkpoint"),))]
    )
    series = timeline_svg(bars, series=[Series("workers running", ((T0, 1.0), (T0 + 50, 2.0)))])
    assert 'class="ct-series" data-name="workers running"' in series and "(max 2)" in series


def test_checkpoints_restores_and_the_deadline_come_from_the_ledger_manifests_and_statuses() -> None:
    history = RunHistory("ct-r", "s3://b/r", "deadline", T0, deadline_at=T0 + 3600)
    history.attempts = [
        AttemptRow(1, 1, "interrupted", instance_id="i-1", checkpoint_step=8, checkpoint_saved_at=T0 + 50),
        AttemptRow(2, 1, "finished", instance_id="i-2", restored_step=8, job_started_at=T0 + 130),
    ]
    running = RunStatus("running", "i-3", job_started_at=T0 + 300, restored_step=12,
                        checkpoint={"step": 16, "uploaded_at": T0 + 340})  # fmt: skip
    folder = Folder(
        {
            ledger_key("ct-r"): json.dumps(history.to_dict()),
            manifest_key(5): Manifest(step=12, created_at=T0 + 200, instance_id="i-2").to_json(),
            manifest_key(5).replace("MANIFEST.json", "model.pt"): "x",
            status_key("i-3"): running.to_json(),
        }
    )
    marks, deadline = checkpoint_marks(folder, "ct-r", ["i-1", "i-2", "i-3"])  # type: ignore[arg-type]
    assert deadline == T0 + 3600
    seen = {iid: [(m.kind, m.label, m.at - T0) for m in ms] for iid, ms in marks.items()}
    assert seen == {
        "i-1": [("checkpoint", "step 8", 50)],
        "i-2": [("restore", "step 8", 130), ("checkpoint", "step 12", 200)],
        "i-3": [("restore", "step 12", 300), ("checkpoint", "step 16", 340)],
    }


def test_every_checkpoint_in_a_status_history_is_marked_and_an_old_status_still_renders() -> None:
    history = [{"at": T0 + 10 * n, "step": 2 * n, "version": n} for n in range(1, 8)]
    history += [{"at": T0 + 90, "step": None, "version": 8}, {"at": T0 + 95, "step": None, "version": 9}]
    done = RunStatus("interrupted", "i-1", job_started_at=T0 + 5, checkpoint_history=history,
                     checkpoint={"step": None, "uploaded_at": T0 + 95},
                     interruption={"checkpoint_at": T0 + 95, "checkpoint_step": None})  # fmt: skip
    old = RunStatus("interrupted", "i-0", checkpoint={"step": 4, "uploaded_at": T0 - 20})  # no history
    folder = Folder(
        {
            status_key("i-0"): old.to_json(),
            status_key("i-1"): done.to_json(),  # the newest two manifests say the last two again
            manifest_key(8): Manifest(step=None, created_at=T0 + 90.2, instance_id="i-1").to_json(),
            manifest_key(9): Manifest(step=None, created_at=T0 + 95.1, instance_id="i-1").to_json(),
        }
    )
    marks, _ = checkpoint_marks(folder, "ct-x", ["i-0", "i-1"])  # type: ignore[arg-type]
    assert [(m.label, m.at - T0) for m in marks["i-0"]] == [("step 4", -20)]
    assert [m.label for m in marks["i-1"]] == [f"step {2 * n}" for n in range(1, 8)] + [
        "version 8",
        "version 9",
    ]
    bars = [Bar("#1", T0 - 60, T0 - 10, True, True, instance_id="i-0"),
            Bar("#2", T0, T0 + 100, True, False, instance_id="i-1")]  # fmt: skip
    svg = timeline_svg([replace(b, marks=tuple(marks[b.instance_id])) for b in bars])
    drawn = re.findall(r'class="ct-mark ct-checkpoint" data-index="(\d)"', svg)
    assert drawn.count("0") == 1 and drawn.count("1") == len(history)


def test_a_fleet_is_its_workers_with_their_items_and_the_counts_over_time() -> None:
    def outcome(item: str, iid: str, at: float) -> tuple[str, str]:
        return outcome_key(item), ItemOutcome(
            item, "succeeded", f"{iid}.1", iid, 0, ended_at=T0 + at
        ).to_json()

    folder = Folder(
        dict(
            [
                ("workers/i-a.json", WorkerRecord("i-a", T0, "left", ended_at=T0 + 100).to_json()),
                ("workers/i-b.json", WorkerRecord("i-b", T0 + 20, "working", updated_at=T0 + 90).to_json()),
                outcome("item-0", "i-a", 40),
                outcome("item-1", "i-a", 90),
                outcome("item-2", "i-b", 70),
            ]
        )
    )
    bars, series = fleet_parts(folder, True, T0 + 150, in_flight=True)  # type: ignore[arg-type]
    assert [(b.label, b.end - T0, b.running, len(b.marks)) for b in bars] == [
        ("i-a", 100, False, 2),
        ("i-b", 150, True, 1),  # still working: up to now
    ]
    workers, items = series
    assert [(t - T0, v) for t, v in workers.points] == [(0, 1), (20, 2), (100, 1)]
    assert [(t - T0, v) for t, v in items.points] == [(40, 1), (70, 2), (90, 3)]


def test_without_reading_the_run_folder_a_running_first_attempt_is_a_bar_to_now() -> None:
    row = {"key": "ct-c", "dag_id": "d", "task_id": "t", "instance_id": "i-9", "instance_type": "m5.large",
           "spot": True, "launched_at": T0, "cost_so_far_usd": 0.01, "run_uri": "s3://b/c"}  # fmt: skip
    svg = timeline_of(None, [row], now=T0 + 60, read=False)
    assert 'class="ct-bar spot" data-index="0"' in svg and 'class="ct-running" data-index="0"' in svg
    assert "$0.0100 so far" in svg


def _job(job_id: str, numeric: str, created: float, started: float | None, ended: float, state: str) -> str:
    return json.dumps({"state": state, "at": T0 + ended + 3, "job_id": job_id, "job_name": f"p/x/{numeric}",
                       "created_at": T0 + created, "started_at": None if started is None else T0 + started,
                       "ended_at": T0 + ended, "spot": True, "cost_usd": 0.01})  # fmt: skip


def test_a_vertex_run_is_its_jobs_and_the_earlier_ones_with_their_states_and_checkpoints() -> None:
    from airflow_cloudtrain.ui.vertex_timeline import checkpoint_step, vertex_bars

    class JobFolder(Folder):
        def list_modified(self, prefix: str) -> dict[str, float]:
            return {k: T0 + float(v) for k, v in self.objects.items() if k.startswith(prefix)}

    jobs = "_cloudtrain/jobs/{}/delivered.json".format
    folder = JobFolder(
        {
            jobs("1"): _job("train_0", "1", 0, 10, 60, "JOB_STATE_SUCCEEDED"),  # the job it resumed
            jobs("2"): _job("train_1", "2", 100, 120, 150, "JOB_STATE_FAILED"),  # this run's first try
            jobs("3"): _job("train_1", "3", 200, None, 205, "JOB_STATE_CANCELLED"),  # never ran
            jobs("4"): _job("train_2", "4", 300, 310, 400, "JOB_STATE_SUCCEEDED"),  # a later resume
            jobs("5"): json.dumps({"state": "JOB_STATE_SUCCEEDED", "at": T0}),  # an older release's
            "checkpoints/ckpt-000004.json": "40",
            "checkpoints/ckpt-8.index": "130",
            "checkpoints/ckpt-8.data-00000-of-00001": "131",
            "checkpoints/checkpoint": "131",  # TensorFlow's state file: no step
            "checkpoints/checkpoint-12/model.safetensors": "350",  # the later resume's
        }
    )
    assert checkpoint_step("ckpt-8.data-00000-of-00001") == 8 and checkpoint_step("checkpoint-12/x.bin") == 12
    index_bar = Bar("#1 n1-standard-4", T0 + 203, T0 + 206, True, False, instance_id="train_1")
    bars = vertex_bars(folder, "train_1", [index_bar])  # type: ignore[arg-type]
    assert [(b.label, b.start - T0, b.end - T0) for b in bars] == [
        ("#1 train_0", 0, 60),
        ("#2 train_1", 100, 150),
        ("#3 train_1", 200, 205),
    ]
    assert [[(m.kind, m.label, m.at - T0) for m in b.marks] for b in bars] == [
        [("state", "created", 0), ("state", "running", 10), ("checkpoint", "step 4", 40), ("state", "succeeded", 60)],
        [("state", "created", 100), ("state", "running", 120), ("checkpoint", "step 8", 131), ("state", "failed", 150)],
        [("state", "created", 200), ("state", "cancelled", 205)],
    ]  # fmt: skip
    assert "never ran" in bars[2].detail and "$0.0100" in bars[1].detail
    svg = timeline_svg(bars)
    assert "job state" in svg and svg.count('class="ct-mark ct-state"') == 8
    assert "<title>state: failed</title>" in svg and "<title>checkpoint: step 8</title>" in svg
    # a job with no such record yet (still running, or an older release): the index's bars stay
    running = replace(index_bar, start=T0 + 320, end=T0 + 360, running=True, instance_id="train_3")
    assert [b.label for b in vertex_bars(folder, "train_3", [running])] == [  # type: ignore[arg-type]
        "#1 train_0",
        "#2 train_1",
        "#3 train_1",
        "#4 train_2",
        "#1 n1-standard-4",
    ]

"""example_dags/retrain_spot.py inside real Airflow (dag.test()) on the emulated clouds, with two
spot interruptions injected while it trains: one with a notice, one without. What a user checks
afterwards: the run succeeded, three attempts, each resumed where the previous one's checkpoint
was, the job said so, the model is the one an uninterrupted run computes, and the ledger adds up."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dag_helpers import load_example, task_states, xcom

EXAMPLES = Path(__file__).resolve().parents[2] / "example_dags"
STEPS = 60
# Interrupt the first instance once its job passed 1/4 of the steps, with a 10 s notice; the second
# once its job passed 1/2 (and ran some steps itself: see spot_interrupter), without a notice.
PLAN = [(STEPS // 4, 10.0), (STEPS // 2, 0.0)]


def _interrupter_module() -> Any:
    spec = importlib.util.spec_from_file_location("spot_interrupter", EXAMPLES / "spot_interrupter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_interrupted(emu: Any) -> tuple[Any, list[dict[str, Any]]]:
    """dag.test() with the interrupter watching: the run and the interruptions it injected."""
    dag = load_example("retrain_spot")
    interrupter = _interrupter_module().Interrupter(emu, PLAN, timeout_s=280)
    interrupter.start()
    try:
        run = dag.test()
    finally:
        done = interrupter.stop()
    return run, done


def _get_text(uri: str) -> str:
    scheme, rest = uri.split("://", 1)
    bucket, key = rest.split("/", 1)
    if scheme == "s3":
        import boto3

        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    from google.cloud import storage

    return storage.Client().bucket(bucket).blob(key).download_as_text()


def _uninterrupted_model(data_uri: str, tmp_path: Path) -> dict[str, Any]:
    """The same training script, run here from step 0 to the end without a stop: the reference."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "out").mkdir()
    env = {
        **os.environ,
        "CLOUDTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "CLOUDTRAIN_OUTPUT_DIR": str(tmp_path / "out"),
        "CLOUDTRAIN_RESUMED": "0",
        "CLOUDTRAIN_RESTARTS": "0",
        "LEARNING_RATE": "0.01",
    }
    subprocess.run(
        [sys.executable, "train.py", "--data", data_uri, "--steps", str(STEPS), "--every", "5"],
        cwd=EXAMPLES / "train_code_spot",
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return json.loads((tmp_path / "out" / "model.json").read_text())


def _check(emu: Any, run: Any, done: list[dict[str, Any]], tmp_path: Path, scheme: str) -> None:
    assert run.state == "success", task_states(run)
    assert task_states(run) == {"prepare_data": "success", "train": "success", "evaluate": "success"}
    result = xcom(run, "train")
    json.dumps(result)  # JSON-safe
    rows = result["attempts"]

    # Two interruptions, as injected (notice, then none), then the attempt that finished.
    assert [d["notice_s"] for d in done] == [p[1] for p in PLAN]
    assert [r["ended"] for r in rows] == ["interrupted", "interrupted_no_notice", "finished"], rows
    assert [r["instance_id"] for r in rows[:2]] == [d["instance_id"] for d in done]
    assert len({r["instance_id"] for r in rows}) == 3 and all(r["spot"] for r in rows)
    assert result["results_uri"].startswith(f"{scheme}://") and result["exit_code"] == 0

    # Each attempt resumed from the newest complete checkpoint the previous one left; the restored
    # steps never go back. They need not grow: an interruption without notice that comes before the
    # attempt's next checkpoint leaves the same newest checkpoint (on a loaded machine the first
    # notice's checkpoint can be step 30, and the second attempt can vanish before step 35).
    assert rows[0]["restored_step"] is None
    restored = [r["restored_step"] for r in rows[1:]]
    for prev, row in zip(rows[:-1], rows[1:], strict=True):
        if prev["ended"] == "interrupted":  # the agent recorded its final checkpoint inside the notice
            assert row["restored_step"] == prev["checkpoint_step"], rows
        else:  # gone at once: a manifest may land just before the status that would record it (or
            # before any status recorded an upload at all: then the ledger knows no step, None)
            assert prev["checkpoint_step"] is None or row["restored_step"] >= prev["checkpoint_step"], rows
    assert 0 < restored[0] <= restored[1] < STEPS, restored
    # with the notice the job saved a checkpoint after it was interrupted (at or past where it was)
    assert rows[0]["checkpoint_step"] >= done[0]["step"]
    # without one, the next attempt resumed from the newest checkpoint that existed when the instance
    # vanished: at least the newest one its agent said it uploaded (the ledger's, as far as its last
    # status recorded it), and never past a step the job reached. The interrupter's view of the step is
    # not a bound: the job may run on (and upload) between its look and the interruption.
    second_log = emu.agent_log(rows[1]["instance_id"])
    uploaded = [int(m) for m in re.findall(r"checkpoint step (\d+) uploaded to ", second_log)]
    reached = max(int(m) for m in re.findall(r"\bstep (\d+)/\d+\b", second_log))
    assert restored[1] >= max([restored[0], *uploaded]), (restored, uploaded)
    assert restored[1] <= reached, (restored, reached)
    if rows[1]["checkpoint_step"] is not None:
        assert restored[0] <= rows[1]["checkpoint_step"] <= restored[1]
        assert rows[1]["checkpoint_step"] % 5 == 0
    # the second resume is from a checkpoint of the second attempt (every 5 steps), or, when it vanished
    # before its first one, from the same checkpoint it had itself resumed from
    assert restored[1] % 5 == 0 or restored[1] == restored[0]
    assert rows[2]["checkpoint_step"] == STEPS
    assert result["resumed_step"] == restored[-1]
    assert result["restarts"] == 2 and result["interruptions"] == 2

    # The job said where it resumed from, on every attempt.
    assert "fresh start" in emu.agent_log(rows[0]["instance_id"])
    for row in rows[1:]:
        log = emu.agent_log(row["instance_id"])
        assert f"resumed from step {row['restored_step']} " in log, log[-2000:]
    # ... also in the run folder's copy of the finished attempt's log (what a user reads)
    from airflow_cloudtrain.contract.runs import log_prefix
    from airflow_cloudtrain.storage import open_run_folder

    folder = open_run_folder(result["run_uri"])
    job_log = "".join(folder.get_text(k) or "" for k in folder.list(log_prefix(rows[2]["instance_id"])))
    assert f"resumed from step {restored[-1]} " in job_log

    # The ledger adds up: totals are the sum of the rows, in the XCom and in the ledger file.
    totals = result["totals"]
    assert totals["attempts"] == 3 and totals["launches"] == 3
    assert totals["interruptions"] == 2 == sum(r["ended"].startswith("interrupted") for r in rows)
    assert totals["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in rows), abs=1e-6)
    assert result["cost_usd"] == totals["cost_usd"] > 0 and all(r["cost_usd"] > 0 for r in rows)
    assert totals["spot_cost_usd"] == pytest.approx(totals["cost_usd"], abs=1e-6)
    lost = [r["work_lost_s"] for r in rows]
    assert all(v is not None and v >= 0 for v in lost) and lost[2] == 0
    assert totals["work_lost_s"] == pytest.approx(sum(lost), abs=1e-3)
    ledger = json.loads(_get_text(result["ledger_uri"]))
    assert ledger["state"] == "succeeded"
    assert [r["instance_id"] for r in ledger["attempts"]] == [r["instance_id"] for r in rows]
    assert ledger["totals"]["cost_usd"] == pytest.approx(
        sum(r["cost_usd"] for r in ledger["attempts"]), abs=1e-6
    )

    # The evaluation read the model: all the steps, learned, and exactly what an uninterrupted run gets.
    model = json.loads(_get_text(f"{result['results_uri']}/model.json"))
    evaluation = xcom(run, "evaluate")
    assert evaluation["model"] == model and evaluation["attempts"] == 3
    assert model["steps"] == STEPS and model["resumed"] and model["restarts"] == 2
    assert abs(model["w"] - 3) < 0.3 and abs(model["b"] - 2) < 0.3
    reference = _uninterrupted_model(xcom(run, "prepare_data"), tmp_path)
    assert (model["w"], model["b"], model["loss"]) == (reference["w"], reference["b"], reference["loss"])
    assert emu.running_instances() == []


def test_retrain_spot_survives_two_interruptions_on_ec2(emu, airflow_db, monkeypatch, tmp_path) -> None:
    for var in (
        "CLOUDTRAIN_SPOT_CLOUD",
        "CLOUDTRAIN_BUCKET",
        "CLOUDTRAIN_SPOT_REGION",
        "CLOUDTRAIN_DEFERRABLE",
    ):
        monkeypatch.delenv(var, raising=False)
    run, done = _run_interrupted(emu)
    _check(emu, run, done, tmp_path, "s3")
    assert xcom(run, "train")["cloud"] == "ec2spot"


def test_retrain_spot_survives_two_interruptions_on_gce(emu, airflow_db, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CLOUDTRAIN_SPOT_CLOUD", "gcspot")
    monkeypatch.setenv("CLOUDTRAIN_BUCKET", "gs://cloudtrain-emulated/retrain")
    monkeypatch.delenv("CLOUDTRAIN_SPOT_REGION", raising=False)
    monkeypatch.delenv("CLOUDTRAIN_DEFERRABLE", raising=False)
    run, done = _run_interrupted(emu)
    _check(emu, run, done, tmp_path, "gs")
    result = xcom(run, "train")
    assert result["cloud"] == "gcspot" and result["zone"].startswith("us-central1-")

"""The hung-job watchdog for real: the agent as a subprocess against S3 (moto server) and the
emulator's metadata server, with ``idle_timeout_s`` set.

A job that sleeps (no CPU) is stopped and the run ends as ``idle``; a job that burns CPU runs to the
end. With GPUs asked for, a stand-in ``nvidia-smi`` first on the agent's ``PATH`` says how busy the
GPU is: busy keeps a CPU-idle job alive, 0 % (or a failing ``nvidia-smi``: CPU alone) stops it.
Every wait is on the agent's exit with a generous deadline; how fast is only checked loosely.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import agent_processes
import pytest

from airflow_cloudtrain.agent.logs import NOTE_PREFIX
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.storage import open_run_folder

REPO = Path(__file__).resolve().parents[2]
FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.5, "metadata_poll_s": 0.5}
IDLE_MESSAGE = "no CPU or GPU use for 3 s (idle_timeout): stopped the hung job"
BURN = "import time\nt = time.time()\nwhile time.time() - t < 6: pass\nprint('burnt')"


def run_agent(
    s3: Any, md: MetadataServer, tmp: Path, path_first: Path | None = None, **spec: Any
) -> tuple[runs.RunStatus, str, float]:
    """One agent run to its end: (final status, job log with the agent's notes, seconds it took)."""
    iid = f"i-{uuid.uuid4().hex[:12]}"
    uri = f"s3://{s3.bucket}/runs/dag/idle/{iid}/-1"
    folder = open_run_folder(uri)
    folder.put_text(
        runs.SPEC_KEY,
        runs.RunSpec(run_id="ct-idle", run_uri=uri, cloud="ec2spot", **{**FAST, **spec}).to_json(),
    )
    env = {**os.environ, "AWS_EC2_METADATA_SERVICE_ENDPOINT": md.endpoint_for(iid)}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
    argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", uri, "--instance-id", iid]
    argv += ["--workdir", str(tmp / iid)]
    started = time.monotonic()
    try:
        done = agent_processes.run_agent(argv, REPO, env, timeout=240)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the agent did not finish in 240 s: {str(err.stderr)[-3000:]}")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    keys = folder.list(runs.log_prefix(iid))
    log = b"".join(folder.get_bytes(k) or b"" for k in keys).decode()
    status = runs.RunStatus.from_json(folder.get_text(runs.status_key(iid)) or "{}")
    return status, log, took


def stand_in_nvidia_smi(tmp: Path, body: str) -> Path:
    """A directory holding an ``nvidia-smi`` that runs ``body`` (e.g. ``echo 57``)."""
    bindir = tmp / "fake-gpu-bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return bindir


def test_sleeping_job_is_stopped_as_idle(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    status, log, took = run_agent(s3, metadata, tmp_path, command="echo started; sleep 600", idle_timeout_s=3)
    assert status.state == runs.IDLE and status.message == IDLE_MESSAGE, (status, log[-2000:])
    assert status.final and status.exit_code == 143  # SIGTERM ended the sleep
    assert "started\n" in log and f"{NOTE_PREFIX}{IDLE_MESSAGE}" in log
    assert f"{NOTE_PREFIX}finished: idle, exit code 143" in log
    assert took < 120  # stopped: far from its 600 s (loose; the machine may be loaded)


def test_cpu_burning_job_is_not_idle(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    command = f'{sys.executable} -c "{BURN}"'
    status, log, _ = run_agent(s3, metadata, tmp_path, command=command, idle_timeout_s=3)
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, (status, log[-2000:])
    assert "burnt\n" in log and "idle_timeout" not in log


def test_busy_gpu_keeps_a_cpu_idle_job_alive(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    bindir = stand_in_nvidia_smi(tmp_path, "echo 57")
    status, log, _ = run_agent(
        s3, metadata, tmp_path, bindir, command="sleep 8; echo slept", gpus=1, idle_timeout_s=3
    )
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, (status, log[-2000:])
    assert "slept\n" in log and "idle_timeout" not in log and "GPU utilization" not in log


@pytest.mark.parametrize(
    ("body", "gpu_note"),
    [("echo 0", False), ("echo 'NVIDIA-SMI has failed' >&2; exit 9", True)],
    ids=["gpu-idle", "nvidia-smi-fails"],
)
def test_idle_gpu_or_failing_nvidia_smi_is_stopped_as_idle(
    body: str, gpu_note: bool, s3: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    bindir = stand_in_nvidia_smi(tmp_path, body)
    status, log, _ = run_agent(
        s3, metadata, tmp_path, bindir, command="echo started; sleep 600", gpus=1, idle_timeout_s=3
    )
    assert status.state == runs.IDLE and status.message == IDLE_MESSAGE, (status, log[-2000:])
    notes = [ln for ln in log.splitlines() if "cannot read GPU utilization" in ln]
    assert len(notes) == (1 if gpu_note else 0), notes  # noted once, then CPU alone decides
    if gpu_note:
        assert "CalledProcessError" in notes[0] and "CPU use alone" in notes[0]

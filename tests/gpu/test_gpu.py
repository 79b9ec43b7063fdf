"""What only a machine with an NVIDIA GPU can show: run on one by hand (docs/gpu.md), skipped elsewhere.

(a) The idle watchdog's GPU reading (``agent.idle``): a job busy on the GPU with almost no CPU counts
as busy, through ``read_gpu_utilization`` (``nvidia-smi``), while a CPU-only watch on the same
process calls it idle; once it stops launching kernels (still holding its CUDA context, like a hung
job) the GPU reads idle and the watchdog fires after its timeout.

(b) A real PyTorch checkpoint and resume through the agent: ``python -m airflow_cloudtrain.agent``
against moto's S3 server on loopback runs ``train_mlp.py`` (a seeded MLP on CUDA), which saves with
``airflow_cloudtrain.checkpoint``; the agent uploads checkpoints. The instance then vanishes: agent
and job are SIGKILLed mid-training, after a checkpoint reached the bucket. A second agent (a new
instance) restores the newest complete checkpoint, the job resumes there (``CLOUDTRAIN_RESUMED=1``),
and its losses and final model, optimizer and RNG state equal, bit for bit, those of an uninterrupted
run with the same seed.

Needs ``nvidia-smi``, torch with CUDA, and (b) also boto3 and moto's server (``moto[server]``); each
missing piece skips. Nothing here imports torch at module level. Set ``CLOUDTRAIN_GPU_REPORT`` to a
file to get the measured numbers as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_cloudtrain.agent.idle import (
    CPU_BUSY_FRACTION,
    GPU_BUSY_PERCENT,
    IdleWatch,
    JobTree,
    cpu_growth,
    read_gpu_utilization,
)
from airflow_cloudtrain.agent.logs import NOTE_PREFIX
from airflow_cloudtrain.contract import runs

pytestmark = pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="no nvidia-smi: no NVIDIA GPU here"
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUSY = HERE / "gpu_busy.py"
TRAIN = HERE / "train_mlp.py"
TOTAL_STEPS = 400
SAVE_EVERY = 25  # train_mlp.SAVE_EVERY
WATCH_TIMEOUT_S = 3.0
POLL_S = 0.5


def need_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


def record(section: str, **values: Any) -> None:
    """Print the measured numbers and add them to ``$CLOUDTRAIN_GPU_REPORT`` (JSON), when set."""
    print(f"gpu report {section}: {json.dumps(values)}")
    path = os.environ.get("CLOUDTRAIN_GPU_REPORT")
    if path:
        report = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
        report[section] = values
        Path(path).write_text(json.dumps(report, indent=1))


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(every)


# -- (a) the idle watchdog's GPU reading ------------------------------------------------------------
def _gpu_idle() -> list[float] | None:
    readings = read_gpu_utilization()
    return readings if max(readings) < GPU_BUSY_PERCENT else None


def _read_line(proc: subprocess.Popen[str], expected: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the job prints within seconds; pytest-timeout guards a hang
    assert line.strip() == expected, f"busy job said {line!r} (exit code {proc.poll()})"


def test_gpu_busy_job_with_idle_cpu_is_busy_then_idle_once_its_kernels_stop() -> None:
    need_cuda()
    before = wait_for("the GPU to read idle before the job", _gpu_idle, timeout=60)
    proc = subprocess.Popen(
        [sys.executable, str(BUSY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as jobs.run_process starts a job: JobTree follows its session
    )
    assert proc.stdin is not None
    try:
        _read_line(proc, "ready")
        first_busy = wait_for(
            "the GPU to read busy", lambda: (r := read_gpu_utilization()) and max(r) >= 50 and r, timeout=60
        )
        # Busy phase: one watch with the GPU (the agent's, spec with gpus), one by CPU alone.
        gpu_watch = IdleWatch(proc.pid, WATCH_TIMEOUT_S, gpu=True)
        cpu_watch = IdleWatch(proc.pid, WATCH_TIMEOUT_S, gpu=False)
        tree = JobTree(proc.pid)
        cpu_before, began = tree(), time.monotonic()
        busy_readings: list[float] = []
        cpu_fired_after: float | None = None
        while time.monotonic() - began < 3 * WATCH_TIMEOUT_S:
            assert not gpu_watch.poll(), f"GPU watch fired on a busy GPU: {busy_readings}"
            if cpu_watch.poll() and cpu_fired_after is None:
                cpu_fired_after = time.monotonic() - began
            busy_readings.append(max(read_gpu_utilization()))
            time.sleep(POLL_S)
        window = time.monotonic() - began
        cpu_fraction = cpu_growth(cpu_before, tree()) / window
        gpu_idle_for = gpu_watch.idle_for
        assert proc.poll() is None
        assert not gpu_watch.gpu_failed
        assert gpu_idle_for < 2 * POLL_S + 1.0  # seen busy at (about) its last poll
        assert min(busy_readings) >= 50, busy_readings
        # the process used (almost) no CPU: by CPU alone the watchdog would have stopped it
        assert cpu_fraction < CPU_BUSY_FRACTION, cpu_fraction
        assert cpu_fired_after is not None and cpu_fired_after >= WATCH_TIMEOUT_S

        # Idle phase: no more kernels, the CUDA context stays (a hung job).
        proc.stdin.write("idle\n")
        proc.stdin.flush()
        _read_line(proc, "idle")
        idle_readings = wait_for("the GPU to read idle after the kernels stopped", _gpu_idle, timeout=60)
        idle_watch = IdleWatch(proc.pid, WATCH_TIMEOUT_S, gpu=True)
        began = time.monotonic()
        wait_for("the GPU watch to fire on the idle job", idle_watch.poll, timeout=60, every=POLL_S)
        fired_after = time.monotonic() - began
        assert fired_after >= WATCH_TIMEOUT_S
        assert proc.poll() is None, "the hung job is still alive when the watchdog fires"
        assert not idle_watch.gpu_failed
        record(
            "idle_watch",
            nvidia_smi_before=before,
            nvidia_smi_first_busy=first_busy,
            busy_readings=busy_readings,
            busy_window_s=round(window, 2),
            busy_job_cpu_fraction_of_one_core=round(cpu_fraction, 5),
            cpu_only_watch_fired_after_s=round(cpu_fired_after, 2),
            gpu_watch_idle_for_at_end_s=round(gpu_idle_for, 2),
            nvidia_smi_after_kernels_stopped=idle_readings,
            gpu_watch_fired_on_idle_job_after_s=round(fired_after, 2),
            watch_timeout_s=WATCH_TIMEOUT_S,
        )
    finally:
        if proc.poll() is None:
            with_stdin = proc.stdin
            try:
                with_stdin.write("exit\n")
                with_stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# -- (b) a real PyTorch checkpoint and resume through the agent --------------------------------------
@pytest.fixture()
def run_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A run folder on moto's S3 server (loopback), and the environment the agents inherit."""
    need_cuda()
    pytest.importorskip("boto3")
    server_module = pytest.importorskip("moto.server")  # needs moto[server] (flask)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # no instance metadata here: a closed loopback port answers at once (the agent notes and goes on)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    from airflow_cloudtrain.storage import open_run_folder, s3_client

    s3_client().create_bucket(Bucket="cloudtrain-gpu")
    try:
        yield open_run_folder(f"s3://cloudtrain-gpu/runs/gpu/{uuid.uuid4().hex[:12]}/-1")
    finally:
        server.stop()


def _write_spec(folder: Any, delay: float, restarts: int) -> None:
    spec = runs.RunSpec(
        run_id="ct-gpu",
        run_uri=folder.uri,
        cloud="ec2spot",
        command=f"exec {sys.executable} {TRAIN} {TOTAL_STEPS} {delay}",
        gpus=1,
        log_interval_s=0.2,
        heartbeat_interval_s=1.0,
        metadata_poll_s=60.0,
        checkpoint_interval_s=0.5,
        restarts=restarts,
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())


def _start_agent(folder: Any, workdir: Path, iid: str) -> subprocess.Popen[bytes]:
    """The agent as on an instance; its output goes to ``<workdir>.log`` (never a pipe that fills)."""
    argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", folder.uri]
    argv += ["--instance-id", iid, "--workdir", str(workdir)]
    with open(f"{workdir}.log", "wb") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)


def _agent_output(workdir: Path) -> str:
    return Path(f"{workdir}.log").read_text(errors="replace")[-3000:]


def _manifest_steps(folder: Any) -> list[int]:
    """The steps the run folder's complete checkpoint versions hold."""
    steps = []
    for version in runs.manifest_versions(folder.list(runs.CHECKPOINTS_PREFIX + "/")):
        step = runs.Manifest.from_json(folder.get_text(runs.manifest_key(version)) or "").step
        if step is not None:
            steps.append(step)
    return sorted(steps)


def _job_log(folder: Any, iid: str) -> str:
    keys = folder.list(runs.log_prefix(iid))
    text = runs.strip_stamps(b"".join(folder.get_bytes(k) or b"" for k in keys).decode())
    return "".join(line for line in text.splitlines(True) if not line.startswith(NOTE_PREFIX))


def _losses(text: str) -> dict[int, str]:
    return {int(step): loss for step, loss in re.findall(r"^step (\d+) loss (\S+)$", text, re.M)}


def _first_difference(losses: dict[int, str], reference: dict[int, str]) -> str | None:
    """The first step whose loss differs from the reference's (exactly), None when none does."""
    for step in sorted(losses):
        if losses[step] != reference[step]:
            return f"step {step}: loss {losses[step]}, uninterrupted run {reference[step]}"
    return None


def _fingerprints(text: str) -> list[str]:
    return re.findall(r"^fingerprint x .*$|^fingerprint weights \S+", text, re.M)


def _resumed(text: str) -> tuple[int, dict[str, str]]:
    found = re.search(r"^resumed from step (\d+) \(.*\) env (.*)$", text, re.M)
    assert found, text[-2000:]
    return int(found.group(1)), json.loads(found.group(2))


def _assert_same(torch: Any, left: Any, right: Any, where: str = "state") -> int:
    """Bitwise equality of two nested checkpoint states; returns how many tensors were compared."""
    if isinstance(left, dict):
        assert sorted(left, key=str) == sorted(right, key=str), where
        return sum(_assert_same(torch, left[k], right[k], f"{where}.{k}") for k in left)
    if isinstance(left, list | tuple):
        assert len(left) == len(right), where
        return sum(
            _assert_same(torch, a, b, f"{where}[{i}]")
            for i, (a, b) in enumerate(zip(left, right, strict=True))
        )
    if isinstance(left, torch.Tensor):
        assert left.dtype == right.dtype and left.shape == right.shape, where
        assert torch.equal(left.cpu(), right.cpu()), f"{where} differs"
        return 1
    assert left == right, f"{where}: {left!r} != {right!r}"
    return 0


def test_pytorch_job_killed_mid_training_resumes_bitwise_from_latest_uploaded_checkpoint(
    run_folder: Any, tmp_path: Path
) -> None:
    torch = need_cuda()
    folder = run_folder

    # The reference: the same job, uninterrupted, outside the agent.
    ref = tmp_path / "reference"
    env = {
        **os.environ,
        "CLOUDTRAIN_CHECKPOINT_DIR": str(ref / "checkpoints"),
        "CLOUDTRAIN_OUTPUT_DIR": str(ref / "output"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(TRAIN), str(TOTAL_STEPS), "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    reference_s = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    reference_losses = _losses(done.stdout)
    assert sorted(reference_losses) == list(range(1, TOTAL_STEPS + 1))
    reference = torch.load(ref / "output" / "final.pt", map_location="cpu")

    # Attempt 1: slow steps, so it is mid-training when the instance vanishes.
    _write_spec(folder, delay=0.05, restarts=0)
    first_iid = f"i-{uuid.uuid4().hex[:12]}"
    first_dir = tmp_path / first_iid
    first = _start_agent(folder, first_dir, first_iid)
    pid_file = first_dir / "output" / "pid"
    try:

        def started() -> bool:
            if first.poll() is not None:  # the agent died before the job started: say why
                pytest.fail(f"agent exited with {first.returncode}: {_agent_output(first_dir)}")
            return pid_file.is_file()

        wait_for("the job to start", started, timeout=180)
        wait_for(
            "two checkpoints uploaded",
            lambda: (steps := _manifest_steps(folder)) and steps[-1] >= 2 * SAVE_EVERY,
            timeout=240,
        )
        job_pid = int(pid_file.read_text())
    finally:
        first.kill()  # SIGKILL: the instance is gone, no final sync
        first.wait()
        if pid_file.is_file():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    wait_for("the killed job to be gone", lambda: not Path(f"/proc/{job_pid}").exists(), timeout=30)
    uploaded = _manifest_steps(folder)
    latest_uploaded = uploaded[-1]
    local_steps = sorted(int(p.name[5:11]) for p in (first_dir / "checkpoints").glob("ckpt-*.pt"))
    first_log = _job_log(folder, first_iid)
    first_losses = _losses(first_log)
    killed_at = max(first_losses)
    assert latest_uploaded % SAVE_EVERY == 0 and 2 * SAVE_EVERY <= latest_uploaded < TOTAL_STEPS
    assert killed_at < TOTAL_STEPS and "done at step" not in first_log, "killed mid-training"
    assert local_steps and local_steps[-1] >= latest_uploaded
    assert _resumed(first_log)[1]["CLOUDTRAIN_RESUMED"] == "0"
    # same data and initial weights as the reference (printed before any training step)
    assert _fingerprints(first_log) == _fingerprints(done.stdout), done.stdout[:600]
    # the curve before the kill is the reference's
    assert _first_difference(first_losses, reference_losses) is None

    # Attempt 2: a new instance on the same run folder restores the newest complete upload.
    _write_spec(folder, delay=0.0, restarts=1)
    second_iid = f"i-{uuid.uuid4().hex[:12]}"
    second_dir = tmp_path / second_iid
    second = _start_agent(folder, second_dir, second_iid)
    try:
        second.wait(timeout=240)
    except subprocess.TimeoutExpired:
        second.kill()
        second.wait()
        pytest.fail(f"second agent did not finish: {_agent_output(second_dir)}")
    assert second.returncode == 0, _agent_output(second_dir)
    status = runs.RunStatus.from_json(folder.get_text(runs.status_key(second_iid)) or "")
    second_log = _job_log(folder, second_iid)
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, (status, second_log[-3000:])
    assert status.restored_step == latest_uploaded
    resumed_step, resumed_env = _resumed(second_log)
    assert resumed_step == latest_uploaded
    assert resumed_env == {
        "CLOUDTRAIN_RESUMED": "1",
        "CLOUDTRAIN_RESUMED_STEP": str(latest_uploaded),
        "CLOUDTRAIN_RESTARTS": "1",
    }
    second_losses = _losses(second_log)
    assert sorted(second_losses) == list(range(latest_uploaded + 1, TOTAL_STEPS + 1))  # nothing skipped
    # the loss curve goes on exactly as the uninterrupted run's (work since the upload redone)
    assert _first_difference(second_losses, reference_losses) is None

    final = tmp_path / "final.pt"
    folder.download(runs.join(runs.results_prefix(second_iid), "final.pt"), final)
    resumed = torch.load(final, map_location="cpu")
    assert resumed["step"] == reference["step"] == TOTAL_STEPS
    tensors = _assert_same(torch, resumed, reference)
    record(
        "checkpoint_resume",
        torch=torch.__version__,
        device=torch.cuda.get_device_name(0),
        total_steps=TOTAL_STEPS,
        save_every=SAVE_EVERY,
        reference_run_s=round(reference_s, 1),
        uploaded_steps_at_kill=uploaded,
        local_checkpoints_at_kill=local_steps,
        last_logged_step_before_kill=killed_at,
        restored_step=status.restored_step,
        resumed_env=resumed_env,
        redone_steps=killed_at - latest_uploaded,
        first_resumed_loss={latest_uploaded + 1: second_losses[latest_uploaded + 1]},
        final_loss={TOTAL_STEPS: second_losses[TOTAL_STEPS]},
        tensors_bitwise_equal=tensors,
    )

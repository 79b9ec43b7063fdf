"""A job killed while it rewrites ``checkpoint.pt`` in place never gets its half-written file uploaded,
however long ago its last write was; a save it finished before the agent's own SIGKILL still goes up.

The first case failed beside another ``make test`` (docs/testing.md, "the torn in-place checkpoint"):
the job stalled in its write for longer than the two seconds the agent then allowed, no round looked
while it had the file open, and the torn file went up as a version. The second is why the rule that
replaced that window needs the agent's frozen look right before its SIGKILL."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_checkpoint import MemoryFolder
from waiting import wait_for

from airflow_cloudtrain.agent.checkpoints import CheckpointSync, process_alive
from airflow_cloudtrain.agent.jobs import StopRequest, run_process
from airflow_cloudtrain.contract import runs

WHOLE = b"W" * 200_000
NEW = b"N" * 200_000


def _sync(folder: MemoryFolder, local: Path) -> CheckpointSync:
    return CheckpointSync(folder, local, "i-1", note=lambda _: None, call=lambda fn, what: fn(), settle_s=0.0)


def _stored(folder: MemoryFolder) -> bytes:
    """The bytes of ``checkpoint.pt`` in the newest version the run folder has."""
    newest = max(runs.manifest_versions(folder.list(runs.CHECKPOINTS_PREFIX + "/")))
    manifest = runs.Manifest.from_json(str(folder.get_text(runs.manifest_key(newest))))
    entry = next(e for e in manifest.files if e["path"] == "checkpoint.pt")
    data = folder.get_bytes(entry.get("key") or runs.join(runs.checkpoint_prefix(newest), "checkpoint.pt"))
    assert data is not None and hashlib.sha256(data).hexdigest() == entry["sha256"]
    return data


def _uploaded_once(tmp_path: Path) -> tuple[MemoryFolder, Path, CheckpointSync]:
    folder, local = MemoryFolder(), tmp_path / "ckpt"
    local.mkdir()
    (local / "checkpoint.pt").write_bytes(WHOLE)
    sync = _sync(folder, local)
    sync.sync()
    assert _stored(folder) == WHOLE
    return folder, local, sync


def test_a_rewrite_stalled_long_before_an_outside_kill_is_never_uploaded(tmp_path: Path) -> None:
    """The job truncates ``checkpoint.pt``, writes half and stalls; no round looks meanwhile; the
    kernel kills it (SIGKILL from outside the agent) long after its last write. The version the run
    folder has stays."""
    folder, local, sync = _uploaded_once(tmp_path)
    writer = (
        "import sys, time\n"
        "sys.stdin.readline()\n"
        "f = open(sys.argv[1], 'wb')\n"
        "f.write(b'T' * 100_000); f.flush()\n"
        "print('half', flush=True)\n"
        "time.sleep(600)\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", writer, str(local / "checkpoint.pt")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sync.job_started(job.pid)  # the look at the job's start: the whole file, closed
        assert job.stdin is not None and job.stdout is not None
        job.stdin.write("go\n")
        job.stdin.flush()
        assert job.stdout.readline().strip() == "half"
        long_ago = time.time() - 60  # the stall: its last write a minute before the kill
        os.utime(local / "checkpoint.pt", (long_ago, long_ago))
        job.send_signal(signal.SIGKILL)
        wait_for(lambda: not process_alive(job.pid), timeout=60, message="the job to die")
    finally:
        job.kill()
        job.wait()
    sync.job_ended(time.time(), killed=True)
    sync.sync()
    assert _stored(folder) == WHOLE


def _stopped_by_the_agent(tmp_path: Path, handler: str) -> tuple[MemoryFolder, Path]:
    """Run a job under ``run_process`` whose SIGTERM handler runs ``handler`` and then ignores the
    stop, so that the agent's SIGKILL ends it after a short grace period; the final sync follows."""
    folder, local, sync = _uploaded_once(tmp_path)
    ready = tmp_path / "ready"
    job = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "ckpt, marks = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "def on_term(*_):\n"
        f"{handler}"
        "    while True: time.sleep(1)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "(marks / 'ready').write_text('')\n"
        "while True: time.sleep(1)\n"
    )
    asked: list[StopRequest] = []

    def should_stop() -> StopRequest | None:
        if not asked and ready.exists():
            asked.append(StopRequest("interrupted", "a notice", grace_s=2.0))
            return asked[0]
        return None

    code, stop = run_process(
        [sys.executable, "-c", job, str(local / "checkpoint.pt"), str(tmp_path)],
        dict(os.environ),
        str(tmp_path),
        lambda chunk: None,
        should_stop,
        on_start=sync.job_started,
        on_exit=lambda killed: sync.job_ended(time.time(), killed),
        on_stopping=sync.job_stopping,
    )
    assert stop is not None and code == 128 + signal.SIGKILL
    sync.sync()
    return folder, tmp_path


def test_a_save_finished_in_the_grace_period_goes_up_after_the_agents_kill(tmp_path: Path) -> None:
    """The job saves on SIGTERM, closes the file, and hangs (a stuck collective); the agent kills it at
    the end of the grace period. Its look with the job frozen saw the file closed: the save goes up.
    (On a machine so busy that the handler had not finished by then, the earlier version stays.)"""
    folder, marks = _stopped_by_the_agent(
        tmp_path,
        "    ckpt.write_bytes(b'N' * 200_000)\n    (marks / 'saved').write_text('')\n",
    )
    assert _stored(folder) == (NEW if (marks / "saved").exists() else WHOLE)


def test_a_save_still_open_at_the_agents_kill_is_never_uploaded(tmp_path: Path) -> None:
    """The job's SIGTERM handler starts rewriting ``checkpoint.pt`` in place and stalls halfway; the
    agent's SIGKILL ends it. The frozen look saw the file open: the version the run folder has stays."""
    folder, _ = _stopped_by_the_agent(
        tmp_path,
        "    f = open(ckpt, 'wb'); f.write(b'T' * 100_000); f.flush()\n    (marks / 'writing').write_text('')\n",
    )
    assert _stored(folder) == WHOLE

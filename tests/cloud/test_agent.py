"""The agent as a real subprocess against S3 (moto server) and the emulator's metadata server.

What the operator relies on: the final status is the last write (logs and results complete when it
shows), log chunks are gap-free, notices and max_runtime stop the job with SIGTERM first, the
agent reports and powers off whatever went wrong, and results land in ``results/<instance-id>/``
(one folder per attempt). A throttling store (S3 ``503 SlowDown``, GCS ``429`` / ``503``) does not
lose a run: the agent runs in-process against a client that throttles 30% of its calls, and, when
the emulator can throttle (``Emulator.throttle``), as a subprocess against it.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from agent_processes import start_agent
from waiting import wait_for

from airflow_cloudtrain.agent.jobs import build_job_command, notice_grace
from airflow_cloudtrain.agent.logs import NOTE_PREFIX, LogStreamer
from airflow_cloudtrain.agent.runner import NOTICE_GRACE_S, Agent
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.bootstrap import AWS_DOWNLOAD_PY, build_agent_zip
from airflow_cloudtrain.emulator import DEFAULT_BUCKET, Emulator
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.storage import S3_RETRIES, RunFolder, open_run_folder, s3_client

REPO = Path(__file__).resolve().parents[2]
FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.2, "metadata_poll_s": 0.2}


class Run:
    """One agent run: writes the spec, starts the agent, reads back what it wrote."""

    def __init__(self, s3: Any, md: MetadataServer, tmp: Path, cloud: str = "ec2spot", **spec: Any) -> None:
        self.iid = f"i-{uuid.uuid4().hex[:12]}"
        self.uri = f"s3://{s3.bucket}/runs/dag/task/{self.iid}/-1"
        self.folder = open_run_folder(self.uri)
        self.spec = runs.RunSpec(run_id="ct-test", run_uri=self.uri, cloud=cloud, **{**FAST, **spec})
        self.folder.put_text(runs.SPEC_KEY, self.spec.to_json())
        self.tmp, self.md, self.proc = tmp, md, None

    def start(self, *args: str, cmd: list[str] | None = None, env: dict[str, str] | None = None) -> Run:
        env = {
            **os.environ,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.md.endpoint_for(self.iid),
            "GCE_METADATA_HOST": self.md.gce_host_for(self.iid),
            **(env or {}),
        }
        base = cmd or [sys.executable, "-m", "airflow_cloudtrain.agent"]
        argv = [*base, "--run-uri", self.uri, "--workdir", str(self.tmp / "work"), *args]
        self.proc = start_agent(argv, REPO, env)
        return self

    def wait(self, timeout: float = 120) -> runs.RunStatus:
        """The agent's final status once it exited (``timeout``: a deadline for a loaded machine, not a
        measure of speed)."""
        assert self.proc is not None
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout, self.stderr = out.decode(), err.decode()
        assert self.proc.returncode == 0, self.stderr
        return self.status()

    def status(self) -> runs.RunStatus:
        text = self.folder.get_text(runs.status_key(self.iid))
        assert text is not None, "no status.json"
        return runs.RunStatus.from_json(text)

    def chunks(self) -> list[bytes]:
        keys = self.folder.list(runs.log_prefix(self.iid))
        assert [runs.log_seq(k) for k in keys] == list(range(len(keys)))  # no gaps
        return [self.folder.get_bytes(k) or b"" for k in keys]

    def log(self, notes: bool = False) -> str:
        """The job's output as it printed it (lines without their stamps), the agent's notes too."""
        text = runs.strip_stamps(b"".join(self.chunks()).decode())
        return (
            text
            if notes
            else "".join(line for line in text.splitlines(True) if not line.startswith(NOTE_PREFIX))
        )

    def result(self, name: str) -> str | None:
        """A result file of this run's instance (``results/<instance-id>/<name>``)."""
        return self.folder.get_text(runs.join(runs.results_prefix(self.iid), name))

    def wait_for_log(self, needle: str, timeout: float = 90) -> None:
        wait_for(lambda: needle in self.log(), timeout=timeout, message=f"{needle!r} in the log")


JOB = r"""for i in $(seq 1 12); do echo "line $i"; echo "err $i" >&2; sleep 0.05; done
echo done > "$CLOUDTRAIN_OUTPUT_DIR/result.txt"
mkdir -p "$CLOUDTRAIN_OUTPUT_DIR/sub" && echo nested > "$CLOUDTRAIN_OUTPUT_DIR/sub/a.txt"
printf 'no newline at the end'"""
JOB_OUTPUT = "".join(f"line {i}\nerr {i}\n" for i in range(1, 13)) + "no newline at the end"


def test_success_final_status_is_last_write(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, command=JOB)
    seen: list[str] = []
    at_final: dict[str, list[str]] = {}

    def observe() -> None:  # what an operator polling the folder sees the moment the status is final
        while not at_final:
            text = run.folder.get_text(runs.status_key(run.iid))
            if text:
                status = runs.RunStatus.from_json(text)
                seen.append(status.state)
                if status.final:
                    at_final["logs"] = run.folder.list(runs.log_prefix(run.iid))
                    at_final["results"] = run.folder.list(runs.RESULTS_PREFIX + "/")
            time.sleep(0.02)

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    poweroff = tmp_path / "powered-off"
    status = run.start("--poweroff", f"touch '{poweroff}'").wait()  # instance id from the metadata server
    observer.join(10)
    assert status.state == runs.SUCCEEDED and status.exit_code == 0 and status.instance_id == run.iid
    assert status.started_at <= status.job_started_at <= status.ended_at  # type: ignore[operator]
    assert "running" in seen and poweroff.exists()
    # merged stdout/stderr, in order, nothing lost or doubled; the agent ends the unterminated last
    # line before its own closing notes
    assert run.log() == JOB_OUTPUT + "\n"
    assert f"{JOB_OUTPUT}\n{NOTE_PREFIX}uploaded 2 result file(s)\n" in run.log(notes=True)
    chunks = run.chunks()
    assert len(chunks) > 1 and all(chunks)
    assert at_final["logs"] == run.folder.list(runs.log_prefix(run.iid))
    results = runs.results_prefix(run.iid)
    assert results == f"results/{run.iid}"  # one folder per instance (attempt)
    assert at_final["results"] == [f"{results}/result.txt", f"{results}/sub/a.txt"]
    assert run.result("sub/a.txt") == "nested\n"
    # no live index in this spec (live_uri None): heartbeats go to the run folder's heartbeat file
    assert run.spec.live_uri is None
    assert abs(float(run.folder.get_text(runs.heartbeat_key(run.iid)) or 0) - time.time()) < 30
    assert "line 12" in run.stdout  # echoed to the agent's own output too


def test_failing_command(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, command="echo oops; exit 3")
    status = run.start("--instance-id", run.iid).wait()  # given, not asked from the metadata service
    assert status.state == runs.FAILED and status.exit_code == 3 and "code 3" in status.message


def test_setup_cmds_run_first(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(
        s3, metadata, tmp_path, command="cat marker; echo job", setup_cmds=["echo one > marker", "echo two"]
    )
    assert run.start().wait().state == runs.SUCCEEDED
    assert run.log() == "two\none\njob\n"


def test_failing_setup_cmd_fails_the_run(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    setup = ["true", "echo broken; exit 7", "echo never"]
    run = Run(s3, metadata, tmp_path, command="echo job", setup_cmds=setup)
    status = run.start().wait()
    assert status.state == runs.FAILED and status.exit_code == 7
    assert "exit 7" in status.message and "code 7" in status.message
    assert run.log() == "broken\n"


TRAPPING_JOB = """trap 'echo got-term; echo saved > "$CLOUDTRAIN_OUTPUT_DIR/checkpoint"; exit 143' TERM
echo started
while true; do sleep 0.1; done"""


def test_spot_notice_sends_sigterm(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, command=TRAPPING_JOB).start()
    run.wait_for_log("started")
    metadata.set_spot_action(run.iid, "terminate", at=time.time() + 60)
    status = run.wait()
    assert status.state == runs.INTERRUPTED and status.exit_code == 143
    assert status.interruption and status.interruption["kind"] == "spot"
    assert (
        status.interruption["action"] == "terminate" and status.interruption["notice_at"] > status.started_at
    )
    assert "got-term" in run.log() and run.result("checkpoint") == "saved\n"


def test_gce_preemption(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, cloud="gcspot", command=TRAPPING_JOB).start()
    run.wait_for_log("started")
    metadata.set_preempted(run.iid)
    status = run.wait()
    assert status.state == runs.INTERRUPTED and status.interruption["kind"] == "preemption"  # type: ignore[index]
    assert run.result("checkpoint") == "saved\n"


def test_job_ignoring_sigterm_is_killed_when_the_notice_runs_out(
    s3: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    run = Run(s3, metadata, tmp_path, command="trap '' TERM; echo started; while true; do sleep 0.1; done")
    run.start().wait_for_log("started")
    started = time.monotonic()
    metadata.set_spot_action(run.iid, "stop", at=time.time() + 1.5)
    status = run.wait()
    assert status.state == runs.INTERRUPTED and status.exit_code == 137  # SIGKILL after the grace
    # the grace the 1.5 s notice leaves (at least 1 s), not NOTICE_GRACE_S (25 s): read from what the
    # agent said, since the wall clock of a loaded machine cannot tell 1 s from 25 s reliably
    assert "stopping the job, 1.0 s grace of " in run.log(notes=True)
    assert time.monotonic() - started < 60  # and it was killed, not left running


def test_stop_grace_caps_what_the_notice_leaves(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    """``stop_grace_s`` 2 on a notice that leaves ~100 s: a job ignoring SIGTERM is killed after 2 s."""
    job = "trap '' TERM; echo started; while true; do sleep 0.1; done"
    run = Run(s3, metadata, tmp_path, command=job, stop_grace_s=2.0).start()
    run.wait_for_log("started")
    started = time.monotonic()
    metadata.set_spot_action(run.iid, "terminate", at=time.time() + 100)
    status = run.wait()
    assert status.state == runs.INTERRUPTED and status.exit_code == 137, status
    assert "stopping the job, 2.0 s grace of " in run.log(notes=True)
    assert time.monotonic() - started < 60  # the 2 s asked for, not the ~95 s the notice leaves


@pytest.mark.parametrize(
    ("left", "stop_grace", "reserve", "grace"),
    [
        (120, None, 5, 115),  # AWS: two minutes less the reserve
        (30, None, 5, 25),  # GCE, or the agent's SIGTERM (no time in the notice)
        (60, None, 12, 48),  # a slow last upload keeps more back
        (7, None, 3, 4),  # short notices (the emulator's)
        (7, None, 5, 3.5),  # the reserve takes at most half of a short notice
        (1.3, None, 5, 1),  # never under a second
        (-4, None, 5, 1),  # a notice already past its time
        (900, None, 5, 115),  # no notice leaves more than AWS's two minutes
        (120, 10, 5, 10),  # stop_grace_s asks for less than the notice leaves: that
        (30, 60, 5, 25),  # asks for more: what the notice leaves less the reserve
        (7, 60, 3, 4),
        (120, 0, 5, 1),
        (900, 300, 5, 115),
    ],
)
def test_notice_grace(left: float, stop_grace: float | None, reserve: float, grace: float) -> None:
    assert notice_grace(left, stop_grace, reserve) == pytest.approx(grace)
    assert NOTICE_GRACE_S == notice_grace(30) == 25.0  # the agent's SIGTERM without a spec


class _RecordingFolder(RunFolder):
    """The run folder, remembering every status.json the agent writes, in order (the status writer
    holds its lock while it writes, so the order is the writes' order)."""

    def __init__(self, uri: str, status_key: str) -> None:
        super().__init__(uri)
        self.status_key, self.statuses = status_key, []

    def put_bytes(self, key: str, data: bytes) -> None:
        super().put_bytes(key, data)
        if key == self.status_key:
            self.statuses.append(runs.RunStatus.from_json(data.decode()))


SAVING_JOB = r"""D="$CLOUDTRAIN_CHECKPOINT_DIR"
trap 'echo s7 > "$D/.ckpt-00007.pt.tmp"; mv "$D/.ckpt-00007.pt.tmp" "$D/ckpt-00007.pt"; exit 143' TERM
echo started
while true; do sleep 0.1; done"""


def test_notice_record_is_filled_in_before_the_final_status(
    s3: Any, metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a notice the status's interruption record gains ``job_stopped_at`` once the job exited and
    ``checkpoint_at`` / ``checkpoint_step`` once its last checkpoint is up: each written as the agent
    gets there, all before the final status. ``checkpoint`` says which step and when it was saved."""
    run = Run(s3, metadata, tmp_path, command=SAVING_JOB, checkpoint_interval_s=3600.0)
    folder = _RecordingFolder(run.uri, runs.status_key(run.iid))
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", metadata.endpoint_for(run.iid))
    agent = Agent(run.uri, instance_id=run.iid, workdir=str(tmp_path / "work"), folder=folder)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    run.wait_for_log("started")
    metadata.set_spot_action(run.iid, "terminate", at=time.time() + 60)
    thread.join(120)
    assert not thread.is_alive(), "the agent did not finish"
    final = folder.statuses[-1]
    assert final.state == runs.INTERRUPTED and final.exit_code == 143, final
    record = final.interruption or {}
    assert record["kind"] == "spot" and record["checkpoint_step"] == 7
    assert record["notice_at"] <= record["job_stopped_at"] <= record["checkpoint_at"] <= final.ended_at
    before = folder.statuses[:-1]
    assert not any(s.final for s in before)
    with_record = [s.interruption or {} for s in before]
    stopped = next(i for i, r in enumerate(with_record) if "job_stopped_at" in r)
    uploaded = next(i for i, r in enumerate(with_record) if "checkpoint_step" in r)
    assert stopped < uploaded and "checkpoint_at" not in with_record[stopped]
    assert with_record[uploaded] == record  # the final status adds nothing to it
    version = runs.manifest_versions(run.folder.list(runs.CHECKPOINTS_PREFIX + "/"))[-1]
    manifest = runs.Manifest.from_json(run.folder.get_text(runs.manifest_key(version)) or "")
    assert manifest.step == 7
    assert manifest.saved_at is not None and manifest.saved_at <= record["job_stopped_at"]
    assert final.checkpoint == {
        "step": 7,
        "saved_at": manifest.saved_at,
        "uploaded_at": record["checkpoint_at"],
    }
    assert final.restored_step is None
    # the grace: what the ~60 s notice leaves less the 5 s reserve for the sync
    said = re.search(r"stopping the job, ([\d.]+) s grace", run.log(notes=True))
    assert said is not None and 40 < float(said.group(1)) <= 55


def test_max_runtime(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    """max_runtime counts from the agent's start (spec download, agent zip, setup), so it has to leave
    the job time to start even on a loaded machine (1.5 s did not; 20 s leaves room for two test runs on
    two cores); the test waits on the job having started, not on the clock."""
    run = Run(s3, metadata, tmp_path, command="echo start; sleep 120", max_runtime_s=20).start()
    run.wait_for_log("start")
    started = time.monotonic()
    status = run.wait(timeout=150)
    assert status.state == runs.TIMED_OUT and "max_runtime of 20 s" in status.message
    assert status.job_started_at is not None and run.log() == "start\n"
    assert time.monotonic() - started < 100  # stopped, not left to finish its 120 s sleep


def test_code_tarball_is_unpacked(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {
            "train.sh": 'cp data/x.txt "$CLOUDTRAIN_OUTPUT_DIR/"\n',
            "data/x.txt": "payload",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    s3.put_object(Bucket=s3.bucket, Key="elsewhere/code.tar.gz", Body=buffer.getvalue())
    code_uri = f"s3://{s3.bucket}/elsewhere/code.tar.gz"
    run = Run(s3, metadata, tmp_path, command="bash train.sh", code_uri=code_uri)
    assert run.start().wait().state == runs.SUCCEEDED
    assert run.result("x.txt") == "payload"


def test_env_reaches_job_but_not_agent_output(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    secret, agent_secret = "sekrit-value-123", "agent-env-secret-456"
    command = (
        f'test "$API_KEY" = {secret} && echo "$PLAIN" && test -d "$CLOUDTRAIN_CHECKPOINT_DIR" && '
        'echo "$CLOUDTRAIN_RUN_ID $CLOUDTRAIN_RUN_URI" > "$CLOUDTRAIN_OUTPUT_DIR/ids"'
    )
    run = Run(s3, metadata, tmp_path, command=command, env={"API_KEY": secret, "PLAIN": "hello"})
    status = run.start(env={"AGENT_ONLY": agent_secret}).wait()
    assert status.state == runs.SUCCEEDED and run.log() == "hello\n"
    assert run.result("ids") == f"ct-test {run.uri}\n"
    written = run.stdout + run.stderr + run.log(notes=True) + status.to_json()
    assert secret not in written and agent_secret not in written and "testing" not in written


def test_missing_spec_still_reports_and_powers_off(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, command="true")
    run.folder.delete_prefix("")  # no spec.json
    poweroff = tmp_path / "powered-off"
    status = run.start("--poweroff", f"touch '{poweroff}'").wait()
    assert status.state == runs.FAILED and "spec.json" in status.message and poweroff.exists()


def test_agent_error_still_reports_and_powers_off(s3: Any, metadata: MetadataServer, tmp_path: Path) -> None:
    run = Run(s3, metadata, tmp_path, command="true", code_uri=f"s3://{s3.bucket}/no/such.tar.gz")
    poweroff = tmp_path / "powered-off"
    status = run.start("--poweroff", f"touch '{poweroff}'").wait()
    assert status.state == runs.FAILED and status.message.startswith("agent error:") and poweroff.exists()


def test_zipapp_fetched_like_user_data_runs_the_job(
    s3: Any, metadata: MetadataServer, tmp_path: Path
) -> None:
    # the job imports the checkpoint helpers from the agent zip the agent put on its PYTHONPATH (-S:
    # not from the installed provider)
    job = "from airflow_cloudtrain import checkpoint; print('from-zip', checkpoint.step_of('ckpt-3.pt'))"
    run = Run(s3, metadata, tmp_path, command=f'{sys.executable} -S -c "{job}"')
    run.folder.put_bytes(runs.AGENT_KEY, build_agent_zip())
    agent_zip = tmp_path / "agent.zip"
    subprocess.run(
        [sys.executable, "-c", AWS_DOWNLOAD_PY, runs.join(run.uri, runs.AGENT_KEY), str(agent_zip)],
        check=True,
        timeout=60,
    )
    status = run.start(cmd=[sys.executable, str(agent_zip)]).wait()
    assert status.state == runs.SUCCEEDED and run.log() == "from-zip 3\n", run.log(notes=True)


def test_docker_argv() -> None:
    spec = runs.RunSpec(
        run_id="ct-1", run_uri="s3://b/r", cloud="ec2", command="python train.py", image="img:1", gpus=1
    )
    spec.env = {"TOKEN": "value-not-on-argv", "A": "x"}
    argv, extra = build_job_command(spec, "/work", volumes=["/mnt/data"])
    names = [
        "A",
        "CLOUDTRAIN_CHECKPOINT_DIR",
        "CLOUDTRAIN_OUTPUT_DIR",
        "CLOUDTRAIN_RESTARTS",
        "CLOUDTRAIN_RESUMED",
        "CLOUDTRAIN_RESUME_REPORT",
        "CLOUDTRAIN_RUN_ID",
        "CLOUDTRAIN_RUN_URI",
        "TOKEN",
    ]
    assert argv == [
        *("docker", "run", "--rm", "--init", "--name", "cloudtrain-ct-1", "--gpus", "all"),
        *("-v", "/work:/workspace", "-w", "/workspace", "-v", "/mnt/data:/mnt/data"),
        *(x for name in names for x in ("-e", name)),
        *("img:1", "bash", "-lc", "python train.py"),
    ]
    assert extra["CLOUDTRAIN_OUTPUT_DIR"] == "/workspace/output" and extra["TOKEN"] == "value-not-on-argv"
    assert extra["CLOUDTRAIN_RESUMED"] == "0" and extra["CLOUDTRAIN_RESTARTS"] == "0"
    assert "CLOUDTRAIN_RESUMED_STEP" not in extra and "PYTHONPATH" not in extra
    assert "value-not-on-argv" not in " ".join(argv)
    # resumed, with the agent zip in the workdir: appended to the image's PYTHONPATH inside the container
    spec.restarts, spec.checkpoint_dir = 2, "/mnt/data/ckpt"
    argv, extra = build_job_command(
        spec, "/work", (), resumed_step=42, agent_zip="/work/.cloudtrain/agent.zip"
    )
    assert (
        argv[-1]
        == 'export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/workspace/.cloudtrain/agent.zip"\npython train.py'
    )
    assert "/mnt/data/ckpt:/mnt/data/ckpt" in argv  # an absolute checkpoint_dir is mounted as is
    assert extra["CLOUDTRAIN_CHECKPOINT_DIR"] == "/mnt/data/ckpt" and extra["CLOUDTRAIN_RESTARTS"] == "2"
    assert (extra["CLOUDTRAIN_RESUMED"], extra["CLOUDTRAIN_RESUMED_STEP"]) == ("1", "42")
    spec.gpus, spec.image, spec.checkpoint_dir = 0, "img:2", None
    assert "--gpus" not in build_job_command(spec, "/work")[0]
    spec.image = None
    argv, extra = build_job_command(spec, "/work")
    assert argv == ["bash", "-lc", "python train.py"] and extra["CLOUDTRAIN_OUTPUT_DIR"] == "/work/output"
    assert extra["CLOUDTRAIN_CHECKPOINT_DIR"] == "/work/checkpoints"
    spec.checkpoint_dir, spec.env = "ckpt", {"PYTHONPATH": "/opt/lib"}
    extra = build_job_command(spec, "/work", agent_zip="/work/.cloudtrain/agent.zip")[1]
    assert extra["CLOUDTRAIN_CHECKPOINT_DIR"] == "/work/ckpt"  # relative: under the workdir
    assert extra["PYTHONPATH"] == os.pathsep.join(["/opt/lib", "/work/.cloudtrain/agent.zip"])


def test_run_folder_storage(s3: Any, tmp_path: Path) -> None:
    folder = open_run_folder(f"s3://{s3.bucket}/runs/x/", s3_client=boto3.session.Session())
    assert folder.get_bytes("nothing") is None
    folder.put_text("results/b.txt", "b")
    folder.put_bytes("results-old/a.txt", b"a")
    (tmp_path / "up/sub").mkdir(parents=True)
    (tmp_path / "up/sub/c.json").write_text(json.dumps({"c": 1}))
    assert folder.upload_dir(tmp_path / "up", "results") == ["results/sub/c.json"]
    assert folder.list("results") == ["results-old/a.txt", "results/b.txt", "results/sub/c.json"]
    folder.download("results/sub/c.json", tmp_path / "down/c.json")
    folder.download(f"s3://{s3.bucket}/runs/x/results/b.txt", tmp_path / "down/b.txt")
    assert (tmp_path / "down/b.txt").read_text() == "b" and json.loads((tmp_path / "down/c.json").read_text())
    assert folder.delete_prefix("results") == 2  # a folder: results-old/ stays
    assert folder.list() == ["results-old/a.txt"]


class _FakeBlob:
    def __init__(self, store: dict[str, bytes], name: str) -> None:
        self.store, self.name = store, name

    def upload_from_string(self, data: bytes) -> None:
        self.store[self.name] = data

    def download_as_bytes(self) -> bytes:
        from google.api_core.exceptions import NotFound

        if self.name not in self.store:
            raise NotFound("no such object")
        return self.store[self.name]

    def delete(self) -> None:
        del self.store[self.name]


class _FakeGcsClient:
    """Just the google-cloud-storage calls the run folder makes (no GCS server in the tests)."""

    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}

    def bucket(self, name: str) -> Any:
        return type("Bucket", (), {"blob": lambda _, key: _FakeBlob(self.store, key)})()

    def list_blobs(self, bucket: str, prefix: str = "") -> list[_FakeBlob]:
        return [_FakeBlob(self.store, k) for k in sorted(self.store) if k.startswith(prefix)]


def test_run_folder_on_gcs(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _FakeGcsClient()
    folder = open_run_folder("gs://bkt/runs/y", gcs_client=client)
    assert folder.get_text("spec.json") is None
    folder.put_text("spec.json", "{}")
    folder.put_text("results/a", "a")
    assert client.store["runs/y/spec.json"] == b"{}" and folder.get_text("spec.json") == "{}"
    assert folder.list() == ["results/a", "spec.json"]
    assert folder.delete_prefix("results") == 1 and folder.list() == ["spec.json"]
    # with the emulator variable set, a default client is anonymous: built without credentials
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    assert type(open_run_folder("gs://bkt/r")._backend().client).__name__ == "Client"


class _FlakyFolder(RunFolder):
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.fail = False

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.fail:
            raise OSError("network down")
        self.objects[key] = data


def test_log_streamer_keeps_bytes_across_failed_uploads() -> None:
    folder = _FlakyFolder()
    streamer = LogStreamer(folder, "i-1", echo=io.BytesIO())
    assert streamer.flush() == 0  # nothing new: no empty chunk
    streamer.write(b"a\nb")
    streamer.flush()  # the partial line waits
    folder.fail = True
    streamer.write(b"c\n")
    with pytest.raises(OSError):
        streamer.flush()
    folder.fail = False
    streamer.write(b"tail")
    streamer.flush(final=True)
    assert list(folder.objects) == [runs.log_key("i-1", 0), runs.log_key("i-1", 1)]
    text = b"".join(folder.objects.values()).decode()
    assert runs.strip_stamps(text) == "a\nbc\ntail"
    assert [runs.split_stamp(line)[0] is not None for line in text.splitlines()] == [True, True, True]


def test_upload_dir_wraps_each_file(s3: Any, tmp_path: Path) -> None:
    folder = open_run_folder(f"s3://{s3.bucket}/runs/w")
    for name in ("a.txt", "sub/b.txt"):
        (tmp_path / "out" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / name).write_text(name)
    wrapped: list[object] = []

    def call(upload: Any) -> None:
        wrapped.append(upload)
        upload()

    assert folder.upload_dir(tmp_path / "out", "results/i-1", call=call) == [
        "results/i-1/a.txt",
        "results/i-1/sub/b.txt",
    ]
    assert len(wrapped) == 2 and folder.get_text("results/i-1/sub/b.txt") == "sub/b.txt"


# -- a store that throttles ------------------------------------------------------------------------

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>r</RequestId></Error>"
)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.body


def _throttle(client: Any, rate: float, seed: int) -> dict[str, int]:
    """Answer ``rate`` of the client's S3 requests with 503 SlowDown before they leave the machine."""
    from botocore.awsrequest import AWSResponse

    rng, lock = random.Random(seed), threading.Lock()
    counts = {"requests": 0, "throttled": 0}

    def before_send(request: Any, **_: Any) -> Any:
        with lock:
            counts["requests"] += 1
            if rng.random() >= rate:
                return None
            counts["throttled"] += 1
        return AWSResponse(request.url, 503, {"Content-Type": "application/xml"}, _Raw(SLOW_DOWN))

    client.meta.events.register("before-send.s3", before_send)
    return counts


def _in_process(run: Run, folder: RunFolder, monkeypatch: pytest.MonkeyPatch) -> runs.RunStatus:
    """The agent's whole run in this process (so its client can be made to throttle), then its status."""
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", run.md.endpoint_for(run.iid))
    monkeypatch.setenv("GCE_METADATA_HOST", run.md.gce_host_for(run.iid))
    agent = Agent(run.uri, instance_id=run.iid, workdir=str(run.tmp / "work"), folder=folder)
    assert agent.run() == 0
    return run.status()


@pytest.mark.parametrize("sdk_retries", [True, False], ids=["agent-client", "no-sdk-retries"])
def test_agent_finishes_when_s3_throttles(
    sdk_retries: bool, s3: Any, metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30% of S3 calls answered 503 SlowDown: the run still ends right, with its whole log and results.

    ``agent-client`` is the agent's own client (botocore retries, standard mode); ``no-sdk-retries``
    takes those away, so the agent's own retry and the next-flush logic carry it alone."""
    from botocore.config import Config

    assert S3_RETRIES == {"mode": "standard", "max_attempts": 10}
    run = Run(s3, metadata, tmp_path, command=JOB)
    if sdk_retries:
        client = s3_client()
        assert client.meta.config.retries["total_max_attempts"] == 11  # 10 retries after the first try
    else:
        client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 1}))
    counts = _throttle(client, 0.3, seed=7 if sdk_retries else 11)
    status = _in_process(run, RunFolder(run.uri, s3_client=client), monkeypatch)
    assert counts["throttled"] >= 3, counts
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, status
    assert run.log() == JOB_OUTPUT + "\n"  # gap-free and complete (run.chunks checks the seqs)
    assert run.result("result.txt") == "done\n" and run.result("sub/a.txt") == "nested\n"
    assert f"{NOTE_PREFIX}uploaded 2 result file(s)" in run.log(notes=True)


class _ThrottledGcs:
    """A GCS client (the calls the run folder makes) that answers ``rate`` of them 429 or 503."""

    def __init__(self, rate: float, seed: int) -> None:
        self.store: dict[str, bytes] = {}
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.rate, self.throttled = rate, 0

    def maybe_throttle(self) -> None:
        from google.api_core.exceptions import ServiceUnavailable, TooManyRequests

        with self.lock:
            roll = self.rng.random()
            if roll >= self.rate:
                return
            self.throttled += 1
        raise (TooManyRequests if roll < self.rate / 2 else ServiceUnavailable)("slow down")

    def bucket(self, name: str) -> Any:
        return type("Bucket", (), {"blob": lambda _, key: _ThrottledBlob(self, key)})()

    def list_blobs(self, bucket: str, prefix: str = "") -> list[_ThrottledBlob]:
        self.maybe_throttle()
        return [_ThrottledBlob(self, k) for k in sorted(self.store) if k.startswith(prefix)]


class _ThrottledBlob:
    def __init__(self, client: _ThrottledGcs, name: str) -> None:
        self.client, self.name = client, name

    def upload_from_string(self, data: bytes) -> None:
        self.client.maybe_throttle()
        self.client.store[self.name] = data

    def upload_from_filename(self, path: str) -> None:
        self.client.maybe_throttle()
        self.client.store[self.name] = Path(path).read_bytes()

    def download_as_bytes(self) -> bytes:
        from google.api_core.exceptions import NotFound

        self.client.maybe_throttle()
        if self.name not in self.client.store:
            raise NotFound("no such object")
        return self.client.store[self.name]

    def download_to_filename(self, path: str) -> None:
        Path(path).write_bytes(self.download_as_bytes())


def test_agent_finishes_when_gcs_throttles(
    metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30% of GCS calls answered 429 / 503 (and no SDK retries at all): the run still ends right."""
    client = _ThrottledGcs(0.0, seed=3)
    uri = "gs://bkt/runs/dag/task/gce/-1"
    folder = RunFolder(uri, gcs_client=client)
    code = io.BytesIO()
    with tarfile.open(fileobj=code, mode="w:gz") as tar:
        info = tarfile.TarInfo("data.txt")
        info.size = 7
        tar.addfile(info, io.BytesIO(b"payload"))
    folder.put_bytes(runs.CODE_KEY, code.getvalue())
    spec = runs.RunSpec(
        run_id="ct-gcs",
        run_uri=uri,
        cloud="gcspot",
        command=JOB + '\ncp data.txt "$CLOUDTRAIN_OUTPUT_DIR/"',
        code_uri=runs.join(uri, runs.CODE_KEY),
        **FAST,
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    iid = "ct-gce-vm-1"
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.gce_host_for(iid))
    client.rate = 0.3
    agent = Agent(uri, instance_id=iid, workdir=str(tmp_path / "work"), folder=folder)
    assert agent.run() == 0
    client.rate = 0.0
    assert client.throttled >= 3
    status = runs.RunStatus.from_json(folder.get_text(runs.status_key(iid)) or "{}")
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, status
    keys = folder.list(runs.log_prefix(iid))
    assert [runs.log_seq(k) for k in keys] == list(range(len(keys)))
    text = runs.strip_stamps(b"".join(folder.get_bytes(k) or b"" for k in keys).decode())
    assert "".join(line for line in text.splitlines(True) if not line.startswith(NOTE_PREFIX)) == (
        JOB_OUTPUT + "\n"
    )
    results = runs.results_prefix(iid)
    assert folder.list(results + "/") == [f"{results}/{n}" for n in ("data.txt", "result.txt", "sub/a.txt")]
    assert folder.get_text(f"{results}/data.txt") == "payload"


@pytest.mark.skipif(
    not hasattr(Emulator, "throttle"), reason="Emulator.throttle(rate=..., api=...) is not there yet"
)
@pytest.mark.parametrize("fault", ["throttled", "unavailable"])
@pytest.mark.parametrize("api", ["s3", "storage"])  # the emulator's service names: S3, GCS
def test_agent_subprocess_finishes_when_the_emulator_throttles(
    api: str, fault: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The real agent process against the emulated S3 / GCS answering 30% of requests with their
    throttling error (503 SlowDown / 429) or their server error (500 InternalError / 503): every log
    chunk, the status and the results arrive whole, in order."""
    emu = request.getfixturevalue("emu")  # only started when the emulator can throttle
    iid = f"i-{uuid.uuid4().hex[:12]}" if api == "s3" else f"vm-{uuid.uuid4().hex[:12]}"
    uri = f"{'s3' if api == 's3' else 'gs'}://{DEFAULT_BUCKET}/runs/throttled/{api}/{iid}/-1"
    folder = open_run_folder(uri)
    spec = runs.RunSpec(
        run_id="ct-t", run_uri=uri, cloud="ec2spot" if api == "s3" else "gcspot", command=JOB, **FAST
    )
    folder.put_text(runs.SPEC_KEY, spec.to_json())
    env = {
        **os.environ,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": emu.metadata.endpoint_for(iid),
        "GCE_METADATA_HOST": emu.metadata.gce_host_for(iid),
    }
    argv = [
        sys.executable,
        "-m",
        "airflow_cloudtrain.agent",
        "--run-uri",
        uri,
        "--instance-id",
        iid,
        "--workdir",
        str(tmp_path / "work"),
    ]
    emu.reset_counts()
    (emu.throttle if fault == "throttled" else emu.unavailable)(rate=0.3, api=api)
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    finally:
        emu.clear_faults()
    throttled = {k: v for k, v in emu.request_counts().items() if k.startswith(f"{fault}:")}
    assert sum(throttled.values()) >= 1, emu.request_counts()  # it really was throttled
    assert done.returncode == 0, done.stderr
    status = runs.RunStatus.from_json(folder.get_text(runs.status_key(iid)) or "{}")
    assert status.state == runs.SUCCEEDED, (status, done.stderr[-3000:])
    keys = folder.list(runs.log_prefix(iid))
    assert [runs.log_seq(k) for k in keys] == list(range(len(keys)))
    text = runs.strip_stamps(b"".join(folder.get_bytes(k) or b"" for k in keys).decode())
    assert "".join(ln for ln in text.splitlines(True) if not ln.startswith(NOTE_PREFIX)) == JOB_OUTPUT + "\n"
    assert folder.get_text(runs.join(runs.results_prefix(iid), "sub/a.txt")) == "nested\n"

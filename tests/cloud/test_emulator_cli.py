"""``cloudtrain emulator`` as a user runs it: a process on fixed ports that writes the exports Airflow's
processes source, serves the real clients there, and on SIGTERM (as on Ctrl-C) ends every instance's
processes and every server, removes its temporary work directory, and prints no traceback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import psutil
import pytest
from waiting import wait_for

from airflow_cloudtrain.cli_emulator import read_env_file
from airflow_cloudtrain.cli_up import ephemeral_ports_start
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.emulator import DEFAULT_BUCKET, PORT_OFFSETS
from airflow_cloudtrain.emulator.aws.images import an_image

DEADLINE_S = 120.0  # generous: the machine may be busy; every wait ends as soon as its condition holds


def _free_base_port() -> int:
    """A base port whose whole block of ports is free now (tests run in parallel), below the kernel's
    ephemeral range: a block inside it could be taken by any connection's local port between this
    check and the emulator's bind (met beside another ``make test``: "cannot listen on ... (Address
    already in use)"), and again between a stop and the restart on the same ports."""
    import random

    top = ephemeral_ports_start() - len(PORT_OFFSETS)
    for _ in range(200):
        base = random.randrange(20000, max(top, 20001))
        socks = []
        try:
            for offset in range(len(PORT_OFFSETS)):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free block of ports")


class EmulatorProcess:
    """``cloudtrain emulator ...`` in its own session, its output in files (nothing to drain)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        n = len(list(tmp.glob("stdout-*.txt")))  # each start its own files: a restart keeps the first's
        self.out, self.err = tmp / f"stdout-{n}.txt", tmp / f"stderr-{n}.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_"))}
        env.pop("STORAGE_EMULATOR_HOST", None)
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_cloudtrain.cli", "emulator", *args],
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
            )

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture()
def start(tmp_path: Path) -> Iterator[Callable[..., EmulatorProcess]]:
    started: list[EmulatorProcess] = []

    def run(*args: str) -> EmulatorProcess:
        proc = EmulatorProcess(tmp_path, *args)
        started.append(proc)
        return proc

    yield run
    for proc in started:  # a failed test must not leave an emulator behind
        leftovers = proc.descendants()
        proc.kill()
        for child in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_emulator_serves_on_its_ports_writes_the_env_file_and_stops_cleanly_on_sigterm(
    start: Callable[..., EmulatorProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _free_base_port()
    env_file = tmp_path / "airflow" / "emulator.env"
    emu = start("--port", str(base), "--env-file", str(env_file))
    wait_for(lambda: env_file.exists() or emu.proc.poll() is not None, message="the env file")
    assert env_file.exists(), emu.stderr()  # an emulator that could not start says why
    env = read_env_file(env_file)

    # Fixed ports: the endpoints a restart will have again; the connections point at them too.
    assert env["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{base + PORT_OFFSETS['aws']}"
    assert env["STORAGE_EMULATOR_HOST"] == f"http://127.0.0.1:{base + PORT_OFFSETS['gcs']}"
    assert f'"endpoint_url": "http://127.0.0.1:{base}"' in env["AIRFLOW_CONN_AWS_DEFAULT"]
    gce = f"http://127.0.0.1:{base + PORT_OFFSETS['gce']}"
    assert f'"compute_endpoint": "{gce}"' in env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"]
    workdir = Path(
        wait_for(
            lambda: re.search(r"Work directory: (\S+)", emu.stdout()), message="the work directory line"
        )[1]
    )
    assert workdir.is_dir()

    # The real clients work against it: S3 and EC2 (boto3), GCS and Compute Engine (Google's).
    aws = {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "region_name": env["AWS_DEFAULT_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }
    s3, ec2 = boto3.client("s3", **aws), boto3.client("ec2", **aws)
    uri = f"s3://{DEFAULT_BUCKET}/runs/cli/{uuid.uuid4().hex[:8]}"
    pid_file = tmp_path / "job.pid"
    spec = runs.RunSpec(
        run_id="ct-cli",
        run_uri=uri,
        cloud="ec2",
        command=f"echo $$ > {pid_file}; exec sleep 600",
        log_interval_s=0.2,
        heartbeat_interval_s=0.2,
        metadata_poll_s=0.2,
    )
    s3.put_object(Bucket=DEFAULT_BUCKET, Key=f"{uri.split('/', 3)[3]}/{runs.SPEC_KEY}", Body=spec.to_json())
    image = an_image(ec2)
    user_data = f"#!/bin/bash\nCT_RUN_URI='{uri}'\nCT_CLOUD=ec2\n"
    tags = [{"ResourceType": "instance", "Tags": [{"Key": runs.TAG_MANAGED, "Value": "true"}]}]
    launched = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        UserData=user_data,
        TagSpecifications=tags,
    )
    iid = launched["Instances"][0]["InstanceId"]

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1, storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", env["STORAGE_EMULATOR_HOST"])
    gcs = storage.Client(project="my-project", credentials=AnonymousCredentials())
    gcs.bucket(DEFAULT_BUCKET).blob("cli/hello.txt").upload_from_string(b"hello")
    assert gcs.bucket(DEFAULT_BUCKET).blob("cli/hello.txt").download_as_bytes() == b"hello"
    zones = compute_v1.ZonesClient(credentials=AnonymousCredentials(), client_options={"api_endpoint": gce})
    assert any(z.name == "us-central1-a" for z in zones.list(project="my-project"))

    # The instance's agent and job run as the emulator's descendants; the status line is timestamped.
    job_pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), message="the job to start")
    )
    assert psutil.pid_exists(job_pid)
    line = wait_for(
        lambda: re.search(rf"^\[\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ\] running: .*{iid}", emu.stdout(), re.M),
        message="a running line",
    )
    assert line
    processes = emu.descendants()
    assert job_pid in {p.pid for p in processes}

    emu.proc.send_signal(signal.SIGTERM)
    assert emu.proc.wait(timeout=DEADLINE_S) == 0
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes),
        message="every process of the emulator to end",
    )
    assert not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE
    assert not workdir.exists()  # the temporary work directory went with it
    assert env_file.exists()  # the exports stay valid for the next start on the same ports
    assert "Traceback" not in emu.stderr(), emu.stderr()
    # the running line is printed when the set of instances changes, not every few seconds
    assert emu.stdout().count(f"{iid} (aws t3.micro") == 1


def test_emulator_keeps_a_given_state_dir_and_stops_on_ctrl_c(
    start: Callable[..., EmulatorProcess], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env_file = tmp_path / "emulator.env"
    emu = start("--port", "0", "--state-dir", str(state), "--env-file", str(env_file))
    wait_for(env_file.exists, message="the env file")
    # the env file is written before the lines that follow it are printed: wait for the line itself
    wait_for(lambda: f"Work directory: {state}" in emu.stdout(), message="the work directory's line")
    emu.proc.send_signal(signal.SIGINT)
    assert emu.proc.wait(timeout=DEADLINE_S) == 0
    assert state.is_dir() and (state / "image-home").is_dir()  # the user's directory stays
    assert "Traceback" not in emu.stderr(), emu.stderr()


def test_a_taken_port_is_a_clear_error(start: Callable[..., EmulatorProcess]) -> None:
    base = _free_base_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + PORT_OFFSETS["gce"]))
        taken.listen()
        emu = start("--port", str(base))
        assert emu.proc.wait(timeout=DEADLINE_S) == 1
    err = emu.stderr()
    assert f"cannot listen on 127.0.0.1:{base + PORT_OFFSETS['gce']}" in err and "--port" in err
    assert "Traceback" not in err


def test_bad_port_is_refused_by_the_parser() -> None:
    from airflow_cloudtrain.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["emulator", "--port", "80"])
    assert build_parser().parse_args(["emulator"]).port == 4750


def test_the_metadata_server_is_quiet_when_an_instance_ends_mid_request(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """An instance's agent killed while it asks the metadata service: the client is gone, which is no
    error worth a traceback on the emulator's console; any other error still is one."""
    import struct

    from airflow_cloudtrain.emulator.metadata import MetadataServer

    with MetadataServer() as md:
        request = (
            "PUT /i-gone/latest/api/token HTTP/1.1\r\nHost: x\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\n"
        )
        for _ in range(50):  # ask, then vanish at once (RST): the answer meets a closed connection
            with socket.create_connection(("127.0.0.1", md.port)) as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.sendall((request + "\r\n").encode())
        with socket.create_connection(("127.0.0.1", md.port)) as conn:  # still serving
            conn.sendall(
                b"GET /i-x/computeMetadata/v1/instance/name HTTP/1.1\r\nMetadata-Flavor: Google\r\n\r\n"
            )
            assert b"200 OK" in conn.recv(4096)
        server = md._serving.server  # type: ignore[union-attr]
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "Traceback" not in capfd.readouterr().err
        try:
            raise ValueError("a real bug")
        except ValueError:
            server.handle_error(None, ("127.0.0.1", 1))
        assert "ValueError: a real bug" in capfd.readouterr().err


def test_a_vms_metadata_names_its_own_project_and_zone() -> None:
    import urllib.request

    from airflow_cloudtrain.emulator.metadata import MetadataServer

    def get(md: MetadataServer, vm: str, path: str) -> str:
        req = urllib.request.Request(
            f"http://{md.gce_host_for(vm)}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read().decode()

    with MetadataServer() as md:
        md.describe_vm("vm-1", "my-project", "us-central1-a")
        assert get(md, "vm-1", "project/project-id") == "my-project"
        assert get(md, "vm-1", "instance/zone") == "projects/my-project/zones/us-central1-a"
        assert get(md, "vm-1", "instance/name") == "vm-1"


def _clients(env: dict[str, str]) -> tuple[Any, Any]:
    aws = {
        "endpoint_url": env["AWS_ENDPOINT_URL"],
        "region_name": env["AWS_DEFAULT_REGION"],
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }
    return boto3.client("s3", **aws), boto3.client("ec2", **aws)


def _status(env_file: Path) -> str:
    """``cloudtrain emulator status`` as a user runs it next to the emulator."""
    done = subprocess.run(
        [sys.executable, "-m", "airflow_cloudtrain.cli", "emulator", "status", "--env-file", str(env_file)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_a_state_dir_keeps_instances_and_buckets_across_a_restart_and_status_lists_them(
    start: Callable[..., EmulatorProcess], tmp_path: Path
) -> None:
    """Stopped with an instance running, the emulator saves its clouds in the state directory, even
    when its agents' parent is too busy to report the agent's end; the next start has the same
    instance running (its agent started again: the job runs anew), the run folder's objects, the GCS
    objects; ``status`` lists what runs, asked over the wire."""
    state, env_file = tmp_path / "state", tmp_path / "emulator.env"
    first = start("--port", "0", "--state-dir", str(state), "--env-file", str(env_file))
    wait_for(env_file.exists, message="the env file")
    assert "no instance running" in _status(env_file)
    env = read_env_file(env_file)
    s3, ec2 = _clients(env)
    uri = f"s3://{DEFAULT_BUCKET}/runs/kept/{uuid.uuid4().hex[:8]}"
    pids = tmp_path / "job.pids"
    spec = runs.RunSpec(
        run_id="ct-kept",
        run_uri=uri,
        cloud="ec2",
        command=f"echo $$ >> {pids}; exec sleep 600",
        log_interval_s=0.2,
        heartbeat_interval_s=0.2,
        metadata_poll_s=0.2,
    )
    spec_key = f"{uri.split('/', 3)[3]}/{runs.SPEC_KEY}"
    s3.put_object(Bucket=DEFAULT_BUCKET, Key=spec_key, Body=spec.to_json())
    image = an_image(ec2)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": runs.TAG_MANAGED, "Value": "true"}]}]
    iid = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        UserData=f"#!/bin/bash\nCT_RUN_URI='{uri}'\nCT_CLOUD=ec2\n",
        TagSpecifications=tags,
    )["Instances"][0]["InstanceId"]
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    def gcs(endpoint: str) -> Any:
        # the suite's own emulator may have set it in this process: put back what was there
        with mock.patch.dict(os.environ, {"STORAGE_EMULATOR_HOST": endpoint}):
            return storage.Client(project="p", credentials=AnonymousCredentials()).bucket(DEFAULT_BUCKET)

    gcs(env["STORAGE_EMULATOR_HOST"]).blob("kept/hello.txt").upload_from_string(b"hello")
    first_pid = int(
        wait_for(lambda: pids.exists() and pids.read_text().split()[0], message="the job to start")
    )
    listed = _status(env_file)
    assert iid in listed and "t3.micro" in listed and "running" in listed, listed

    # the agents' warm parent is paused at the stop (a loaded machine's worst case): the agent's end is
    # not reported, and the state is saved all the same
    children = psutil.Process(first.proc.pid).children()  # the agents are the parent's forks, not these
    (parent,) = [p for p in children if "agent_zygote" in " ".join(p.cmdline())]
    parent.suspend()
    first.proc.send_signal(signal.SIGTERM)
    wait_for(
        lambda: "its end was not reported" in first.stderr(), timeout=DEADLINE_S, message="the kill noted"
    )
    parent.resume()
    assert first.proc.wait(timeout=DEADLINE_S) == 0
    assert "Traceback" not in first.stderr() and "not saved" not in first.stderr(), first.stderr()
    wait_for(lambda: not psutil.pid_exists(first_pid), message="the job to end with the stop")
    env_file.unlink()

    second = start("--port", "0", "--state-dir", str(state), "--env-file", str(env_file))
    wait_for(env_file.exists, message="the env file")
    # the restore line comes before the first "running:" line; when it is missing, say why
    wait_for(lambda: "running:" in second.stdout(), message="the first running line")
    outputs = (first.stdout(), first.stderr(), second.stdout(), second.stderr())
    assert "Restored the clouds' state" in second.stdout(), outputs
    env = read_env_file(env_file)
    s3, ec2 = _clients(env)
    described = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert described["State"]["Name"] == "running"
    assert s3.get_object(Bucket=DEFAULT_BUCKET, Key=spec_key)["Body"].read() == spec.to_json().encode()
    assert gcs(env["STORAGE_EMULATOR_HOST"]).blob("kept/hello.txt").download_as_bytes() == b"hello"
    # the instance's agent started again on the same instance: the job runs anew
    wait_for(lambda: len(pids.read_text().split()) == 2, message="the job to start again")
    assert iid in _status(env_file)
    ec2.terminate_instances(InstanceIds=[iid])
    wait_for(lambda: "no instance running" in _status(env_file), message="no instance in the status")
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=DEADLINE_S) == 0
    assert "Traceback" not in second.stderr(), second.stderr()

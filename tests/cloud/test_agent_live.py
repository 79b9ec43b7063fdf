"""The agent's side of the live index, for real: the agent (a subprocess, or in-process where the test
records every write) against S3 (moto server) and GCS (the emulator's ``GcsServer``), read back with
the real boto3 / google-cloud-storage clients.

What the triggerer relies on (``runs``: "the live index"): with ``live_uri`` set the beacon exists
while the job runs and is rewritten only on a change (its ETag / md5 stays while nothing happens);
heartbeats rewrite the ``.beat`` object beside it (its LastModified / updated moves), and no
``heartbeat`` file is written;
every stored log line carries the time it was written; the beacon's tail reads back the chunks'
lines; the final beacon (final status, every chunk) comes after the final status and the end marker
after it, last. Without ``live_uri`` nothing of that: the heartbeat file, as before. Every wait is on
a condition with a generous deadline (the CI machine is small and busy).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from agent_processes import AgentProcess, start_agent
from waiting import wait_for

from airflow_cloudtrain.agent.logs import NOTE_PREFIX
from airflow_cloudtrain.agent.runner import Agent
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.emulator.gcp.gcs import GcsServer
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.storage import RunFolder, open_run_folder

REPO = Path(__file__).resolve().parents[2]
FAST = {"log_interval_s": 0.2, "heartbeat_interval_s": 0.2, "metadata_poll_s": 0.3}
GCS_BUCKET = "cloudtrain-agent-live"
GCS_PROJECT = "cloudtrain-emulated"


def when(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def gcs() -> Iterator[GcsServer]:
    """GCS for the gs:// runs; the test process and the agents reach it by STORAGE_EMULATOR_HOST."""
    server = GcsServer()
    server.start()
    server.create_bucket(GCS_BUCKET)
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ.update(server.env())
    yield server
    if saved is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = saved
    server.stop()


class Store:
    """One bucket and what the triggerer reads of an object: its ETag (S3) / md5Hash (GCS)."""

    def __init__(self, scheme: str, bucket: str, client: Any) -> None:
        self.scheme, self.bucket, self.client = scheme, bucket, client

    @property
    def root(self) -> str:
        return f"{self.scheme}://{self.bucket}"

    def digest(self, uri: str) -> str | None:
        """The object's ETag / md5Hash: its MD5 (a single-part upload), hex; None when missing."""
        _, bucket, key = runs.split_uri(uri)
        if self.scheme == "s3":
            from botocore.exceptions import ClientError

            try:
                return str(self.client.head_object(Bucket=bucket, Key=key)["ETag"]).strip('"')
            except ClientError:
                return None
        import base64

        blob = self.client.bucket(bucket).get_blob(key)
        return None if blob is None else base64.b64decode(blob.md5_hash).hex()


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "s3":
        s3 = request.getfixturevalue("s3")
        return Store("s3", s3.bucket, s3)
    request.getfixturevalue("gcs")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=GCS_PROJECT, credentials=AnonymousCredentials())
    return Store("gs", GCS_BUCKET, client)


class Run:
    """One run with (by default) a live index: writes the spec, starts the agent, reads back."""

    def __init__(self, store: Store, md: MetadataServer, tmp: Path, live: bool = True, **spec: Any) -> None:
        self.store, self.md, self.tmp = store, md, tmp
        self.iid = f"i-{uuid.uuid4().hex[:12]}"
        self.uri = f"{store.root}/runs/dag/task/{self.iid}/-1"
        self.folder = open_run_folder(self.uri)
        self.live_uri = runs.live_index_uri(store.root)
        self.live = open_run_folder(self.live_uri)
        cloud = "ec2spot" if store.scheme == "s3" else "gcspot"
        fields = {**FAST, "live_uri": self.live_uri if live else None, **spec}
        self.spec = runs.RunSpec(run_id="ct-live", run_uri=self.uri, cloud=cloud, **fields)
        self.folder.put_text(runs.SPEC_KEY, self.spec.to_json())
        self.proc: AgentProcess | None = None

    @property
    def beacon_uri(self) -> str:
        return runs.join(self.live_uri, runs.beacon_name(self.iid))

    def env(self) -> dict[str, str]:
        return {
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.md.endpoint_for(self.iid),
            "GCE_METADATA_HOST": self.md.gce_host_for(self.iid),
        }

    def start(self) -> Run:
        argv = [sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", self.uri]
        argv += ["--instance-id", self.iid, "--workdir", str(self.tmp / "work")]
        env = {**os.environ, **self.env()}
        self.proc = start_agent(argv, REPO, env)
        return self

    def wait(self, timeout: float = 180.0) -> runs.RunStatus:
        assert self.proc is not None
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            pytest.fail(f"the agent did not finish in {timeout} s: {err.decode()[-3000:]}")
        assert self.proc.returncode == 0, err.decode()[-3000:]
        return self.status()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def status(self) -> runs.RunStatus:
        text = self.folder.get_text(runs.status_key(self.iid))
        assert text is not None, "no status.json"
        return runs.RunStatus.from_json(text)

    def beacon(self) -> runs.Beacon | None:
        raw = self.live.get_bytes(runs.beacon_name(self.iid))
        return None if raw is None else runs.Beacon.from_bytes(raw)

    def end(self) -> runs.RunStatus | None:
        text = self.live.get_text(runs.end_name(self.iid))
        return None if text is None else runs.RunStatus.from_json(text)

    def chunks(self) -> list[str]:
        keys = self.folder.list(runs.log_prefix(self.iid))
        assert [runs.log_seq(k) for k in keys] == list(range(len(keys)))  # no gaps
        return [(self.folder.get_bytes(k) or b"").decode() for k in keys]


def test_the_beat_object_is_the_heartbeat_and_the_beacon_changes_only_with_the_run(
    store: Store, metadata: MetadataServer, tmp_path: Path
) -> None:
    """While the job waits (no output, no status change) the beacon stays as it is (same bytes, same
    ETag / md5, same LastModified) and heartbeats move the ``.beat`` object's LastModified / updated;
    no heartbeat file is written."""
    release = tmp_path / "release"
    job = f"echo waiting; while [ ! -e '{release}' ]; do sleep 0.1; done; echo released"
    run = Run(store, metadata, tmp_path, command=job).start()
    try:

        def started() -> runs.Beacon | None:
            beacon = run.beacon()
            ok = beacon and beacon.status["state"] == runs.RUNNING and "Z waiting\n" in beacon.tail
            return beacon if ok else None

        beacon = wait_for(started, message="a running beacon with the job's first line")
        assert beacon.instance_id == run.iid and beacon.log_seq >= 1
        assert [runs.split_stamp(line)[1] for line in beacon.lines_from(beacon.tail_from) or []][-1] == (
            "waiting"
        )
        assert "updated_at" not in beacon.status and beacon.run_status().started_at is not None
        first_at = run.live.modified_at(runs.beacon_name(run.iid))
        digest = store.digest(run.beacon_uri)
        assert first_at is not None and digest is not None
        listed = run.live.list_modified()  # the same time from a listing (what the Vertex timeline reads)
        assert abs(listed[runs.beacon_name(run.iid)] - first_at) < 1
        raw = run.live.get_bytes(runs.beacon_name(run.iid)) or b""
        assert hashlib.md5(raw).hexdigest() == digest  # the ETag / md5 is the MD5 of these bytes
        assert runs.Beacon.from_bytes(raw).to_bytes() == raw  # canonical
        # heartbeats: the beat object moves (S3 keeps whole seconds: wait for a later one) ...
        beat_at = wait_for(lambda: run.live.modified_at(runs.beat_name(run.iid)), message="a heartbeat")
        seen = wait_for(
            lambda: (at := run.live.modified_at(runs.beat_name(run.iid))) and at > beat_at and at,
            message="the beat's LastModified to move",
        )
        assert seen > beat_at and float(run.live.get_text(runs.beat_name(run.iid)) or 0) > 0
        # ... and the beacon did not: nothing changed
        assert store.digest(run.beacon_uri) == digest
        assert run.live.get_bytes(runs.beacon_name(run.iid)) == raw
        assert run.live.modified_at(runs.beacon_name(run.iid)) == first_at
        assert run.live.modified_at("no-such-beacon.json") is None
        assert run.folder.get_bytes(runs.heartbeat_key(run.iid)) is None  # the beacon is the heartbeat
        release.touch()
        status = run.wait()
    finally:
        run.kill()
    assert status.state == runs.SUCCEEDED, status
    final = run.beacon()
    assert final is not None and final.run_status().state == runs.SUCCEEDED
    assert store.digest(run.beacon_uri) != digest  # what changed shows in the ETag / md5
    assert run.folder.get_bytes(runs.heartbeat_key(run.iid)) is None
    assert not [k for k in run.folder.list("instances/") if k.endswith("/heartbeat")]


def test_lines_are_stamped_and_the_end_marker_comes_last(
    store: Store, metadata: MetadataServer, tmp_path: Path
) -> None:
    """``echo a; sleep 3; echo b``: each stored line carries when it was written (a and b >= 2.5 s
    apart); the final beacon's tail reads back the chunks' lines; when the end marker shows, the
    final beacon (every chunk) is already there, and the end marker holds the final status."""
    run = Run(store, metadata, tmp_path, command="echo a; sleep 3; echo b")
    at_end: dict[str, Any] = {}

    def observe() -> None:  # what a triggerer listing the live index sees when the end shows up
        deadline = time.monotonic() + 500
        while not at_end and time.monotonic() < deadline:
            if run.live.get_bytes(runs.end_name(run.iid)) is not None:
                at_end["beacon"] = run.beacon()
                at_end["chunks"] = len(run.folder.list(runs.log_prefix(run.iid)))
                at_end["status"] = run.status()
            time.sleep(0.02)

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    try:
        status = run.start().wait()
    finally:
        run.kill()
    observer.join(60)
    assert status.state == runs.SUCCEEDED and status.exit_code == 0, status
    chunks = run.chunks()
    lines = [line for chunk in chunks for line in chunk.splitlines()]
    stamped = [runs.split_stamp(line) for line in lines]
    assert all(stamp is not None for stamp, _ in stamped), lines  # notes too
    texts = [text for _, text in stamped]
    assert any(text.startswith(NOTE_PREFIX) for text in texts)
    job = {text: stamp for stamp, text in stamped if not text.startswith(NOTE_PREFIX)}
    assert set(job) == {"a", "b"}, lines
    assert 2.5 <= when(job["b"] or "") - when(job["a"] or "") < 60
    assert abs(when(job["a"] or "") - (status.job_started_at or 0)) < 30  # wall-clock UTC
    assert runs.strip_stamps("".join(chunks)).count("a\nb\n") == 1
    # the final beacon: final status, every chunk, and a tail that reads back their lines
    beacon = run.beacon()
    assert beacon is not None and beacon.run_status().state == runs.SUCCEEDED
    assert beacon.log_seq == len(chunks) and beacon.tail_from == 0
    assert beacon.lines_from(0) == lines
    for seq in range(len(chunks)):
        assert beacon.lines_from(seq) == [line for chunk in chunks[seq:] for line in chunk.splitlines()]
    assert beacon.run_status() == runs.RunStatus(**{**vars(status), "updated_at": None})
    # the end marker: the final status, seen only after the final beacon and status.json
    end = run.end()
    assert end is not None and end == status
    assert at_end, "the observer never saw the end marker"
    assert at_end["status"] == status and at_end["chunks"] == len(chunks)
    seen = at_end["beacon"]
    assert seen is not None and seen.status["state"] == runs.SUCCEEDED and seen.log_seq == len(chunks)
    assert run.folder.get_bytes(runs.heartbeat_key(run.iid)) is None


def test_a_long_log_keeps_the_newest_chunks_in_the_tail(
    store: Store, metadata: MetadataServer, tmp_path: Path
) -> None:
    """More output than ``TAIL_MAX``, in several chunks: the final beacon carries the newest chunks
    that fit, and what it carries reads back as those chunks' lines."""
    job = f'for b in 1 2 3 4 5 6; do for i in $(seq 250); do echo "batch $b line $i {"x" * 80}"; done; sleep 0.6; done'
    run = Run(store, metadata, tmp_path, command=job)
    try:
        status = run.start().wait()
    finally:
        run.kill()
    assert status.state == runs.SUCCEEDED, status
    chunks = run.chunks()
    assert sum(len(c.encode()) for c in chunks) > runs.TAIL_MAX
    beacon = run.beacon()
    assert beacon is not None and beacon.log_seq == len(chunks)
    assert 0 < beacon.tail_from <= beacon.log_seq
    assert len(beacon.tail.encode()) <= runs.TAIL_MAX
    assert beacon.lines_from(beacon.tail_from - 1) is None  # older: the reader reads chunks
    kept = chunks[beacon.tail_from :]
    assert beacon.tail == "".join(chunk + "\f" for chunk in kept)
    assert beacon.lines_from(beacon.tail_from) == [line for chunk in kept for line in chunk.splitlines()]
    if beacon.tail_from > 0:  # the chunk before did not fit with them
        dropped = len((chunks[beacon.tail_from - 1] + "\f").encode())
        assert dropped + len(beacon.tail.encode()) > runs.TAIL_MAX


def test_without_a_live_index_the_heartbeat_file_is_written(
    store: Store, metadata: MetadataServer, tmp_path: Path
) -> None:
    run = Run(store, metadata, tmp_path, live=False, command="echo hi; sleep 1")
    assert run.spec.live_uri is None
    try:
        status = run.start().wait()
    finally:
        run.kill()
    assert status.state == runs.SUCCEEDED, status
    beat = run.folder.get_text(runs.heartbeat_key(run.iid))
    assert beat is not None and abs(float(beat) - time.time()) < 120
    assert run.beacon() is None and run.end() is None
    assert "\nhi\n" in runs.strip_stamps("".join(run.chunks()))


class _Recording(RunFolder):
    """A run folder remembering every write (full URI, bytes) in order; the live index the agent opens
    from it (``RunFolder.at``) records into the same list."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.writes: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def put_bytes(self, key: str, data: bytes) -> None:
        super().put_bytes(key, data)
        with self.lock:
            self.writes.append((runs.join(self.uri, key), data))


def test_the_order_of_writes(
    store: Store, metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write of a whole run, in order, with a heartbeat beating fast: beacons never go back
    (state, log seq), none is final before the end, the final status follows the last chunk, the
    final beacon follows the final status, and the end marker is the last write of all."""
    run = Run(store, metadata, tmp_path, command="echo one; sleep 1; echo two", heartbeat_interval_s=0.05)
    folder = _Recording(run.uri)
    for name, value in run.env().items():
        monkeypatch.setenv(name, value)
    agent = Agent(run.uri, instance_id=run.iid, workdir=str(tmp_path / "work"), folder=folder)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    thread.join(180)
    assert not thread.is_alive(), "the agent did not finish"
    status = run.status()
    assert status.state == runs.SUCCEEDED, status
    writes = folder.writes
    status_uri = runs.join(run.uri, runs.status_key(run.iid))
    end_uri = runs.join(run.live_uri, runs.end_name(run.iid))
    log_uris = {runs.join(run.uri, k) for k in run.folder.list(runs.log_prefix(run.iid))}
    beacons = [
        (i, runs.Beacon.from_bytes(data)) for i, (uri, data) in enumerate(writes) if uri == run.beacon_uri
    ]
    assert writes[-1] == (end_uri, status.to_json().encode())  # last of all
    assert [uri for uri, _ in writes].count(end_uri) == 1
    final_beacon_at, final_beacon = beacons[-1]
    assert final_beacon_at == len(writes) - 2 and final_beacon.run_status().final
    assert final_beacon.log_seq == len(log_uris)
    final_status_at = max(i for i, (uri, _) in enumerate(writes) if uri == status_uri)
    assert final_status_at < final_beacon_at
    assert max(i for i, (uri, _) in enumerate(writes) if uri in log_uris) < final_status_at
    order = [runs.STARTING, runs.SETUP, runs.RUNNING, runs.SUCCEEDED]
    states = [order.index(b.status["state"]) for _, b in beacons]
    assert states == sorted(states) and states[0] == 0  # the first beacon: starting
    assert [b.run_status().final for _, b in beacons].count(True) == 1
    seqs = [b.log_seq for _, b in beacons]
    assert seqs == sorted(seqs)
    beat_uri = runs.join(run.live_uri, runs.beat_name(run.iid))
    assert [uri for uri, _ in writes].count(beat_uri) > 5  # heartbeats, each its own small write
    assert max(i for i, (uri, _) in enumerate(writes) if uri == beat_uri) < final_beacon_at
    assert not any(uri.endswith("/heartbeat") for uri, _ in writes)


class _Refusing(RunFolder):
    """A run folder whose writes fail (a store's 5xx) once ``refuse`` is set; the live index opened
    from it (another URI) still takes them. With ``slow_status``, a refused ``status.json`` write is
    answered only once ``slow_status(t)`` holds (t: when the write came), or after 120 s: a store
    that is slow as well, for as long as the test needs to see what the agent does meanwhile."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.run_uri = uri
        self.refuse = threading.Event()
        self.slow_status: Callable[[float], bool] | None = None

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.uri == self.run_uri and self.refuse.is_set():
            came, slow = time.time(), self.slow_status
            if slow is not None and key.endswith("status.json"):
                deadline = time.monotonic() + 120
                while not slow(came) and time.monotonic() < deadline:
                    time.sleep(0.05)
            raise ConnectionResetError(f"refused: {key}")  # transient: the agent retries it
        super().put_bytes(key, data)


def test_a_run_folder_that_refuses_the_final_writes_costs_one_budget_and_the_live_index_tells_the_end(
    store: Store, metadata: MetadataServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses every run-folder write from the job's start: the agent gives its finishing
    writes (last log chunk, final status) one shared retry budget, not one each; it keeps beating
    while it tries; and the final beacon and end marker in the live index still carry the outcome."""
    # the job ends only once the test refuses the writes (a fixed sleep could end it first on a busy machine)
    gate = tmp_path / "refusing"
    command = f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done"
    run = Run(store, metadata, tmp_path, command=command, heartbeat_interval_s=0.05)
    folder = _Refusing(run.uri)
    for name, value in run.env().items():
        monkeypatch.setenv(name, value)
    agent = Agent(
        run.uri, instance_id=run.iid, workdir=str(tmp_path / "work"), folder=folder, finish_budget_s=3.0
    )
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()

    def running() -> bool:
        beacon = run.beacon()
        return beacon is not None and beacon.run_status().state == runs.RUNNING

    wait_for(running, timeout=120, message="the job to run")

    def beaten_since(t: float) -> bool:  # the agent's clock and this one are the same machine's
        return float(run.live.get_text(runs.beat_name(run.iid)) or 0) > t

    # the final status's tries are answered once a beat came after them (a loaded machine may take
    # longer than the finishing budget to write one beat): beating goes on meanwhile, or the 120 s run out
    folder.slow_status = beaten_since
    folder.refuse.set()
    gate.touch()
    thread.join(300)
    assert not thread.is_alive(), "the agent did not finish"
    assert run.status().state == runs.RUNNING  # status.json never got its final write
    end = run.end()
    assert end is not None and end.state == runs.SUCCEEDED, end
    beacon = run.beacon()
    assert beacon is not None and beacon.run_status().state == runs.SUCCEEDED
    last_beat = float(run.live.get_text(runs.beat_name(run.iid)) or 0)
    assert end.ended_at is not None and last_beat > end.ended_at  # beating while the final status was tried

"""Big checkpoint files over the wire (``airflow_cloudtrain.transfer``): real boto3 against moto's S3
server and real google-cloud-storage against the emulated GCS, with small parts set through the
environment (``CLOUDTRAIN_TRANSFER_*``) so a 40 MiB file goes in 8 parts.

A user checks: the file comes back byte-exact; it really went in parts, in parallel ranges back; an
upload SIGKILLed halfway is finished by the next process sending only what was missing; and the
run folder's teardown leaves no incomplete multipart upload (S3 bills them) and no composite parts
(GCS). Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from airflow_cloudtrain import transfer
from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.storage import RunFolder, open_run_folder

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
SMALL = {
    "CLOUDTRAIN_TRANSFER_THRESHOLD": str(MiB),
    "CLOUDTRAIN_TRANSFER_PART_SIZE": str(5 * MiB),  # S3's smallest part
    "CLOUDTRAIN_TRANSFER_WORKERS": "3",
}
SIZE = 40 * MiB  # 8 parts


@pytest.fixture(params=["s3", "gs"])
def big(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    emu = request.getfixturevalue("emu")
    for name, value in SMALL.items():
        monkeypatch.setenv(name, value)
    uri = f"{request.param}://{DEFAULT_BUCKET}/runs/transfer/{uuid.uuid4().hex[:12]}/-1"
    local = tmp_path / "ckpt" / "ckpt-00007.pt"
    local.parent.mkdir()
    local.write_bytes(os.urandom(SIZE - 12345))  # the last part short
    return emu, open_run_folder(uri), local


def incomplete_uploads(folder: RunFolder) -> list[str]:
    """What the cloud still holds of unfinished uploads under the folder: S3 multipart uploads
    (ListMultipartUploads), GCS composite parts (objects under ``.uploads/``)."""
    if folder.scheme == "s3":
        client = folder._backend().client
        return transfer.s3_incomplete_uploads(client, folder.bucket, f"{folder.base}/")
    return folder.list(".uploads/")


def on_disk(emu: Any, folder: RunFolder, key: str) -> bool:
    """Whether the emulated store keeps the object in a file (a big checkpoint: not in memory)."""
    from airflow_cloudtrain.emulator.aws import bigkeys

    if folder.scheme == "s3":
        return bigkeys.on_disk(folder.bucket, folder._full(key))
    return bool(emu.gcs.on_disk(folder.bucket, folder._full(key)))


def part_requests(emu: Any, scheme: str) -> int:
    counts = emu.request_counts()
    return counts.get("UploadPart", 0) if scheme == "s3" else counts.get("objects.insert", 0)


def test_a_big_file_round_trips_in_parts(big: Any, tmp_path: Path) -> None:
    emu, folder, local = big
    before = part_requests(emu, folder.scheme)
    report = folder.send_file(local, "checkpoints/7/ckpt-00007.pt")
    assert report.in_parts and report.parts == 8 and report.parts_sent == 8 and not report.resumed
    assert report.bytes_sent == local.stat().st_size
    assert part_requests(emu, folder.scheme) - before >= 8  # one request per part at least
    if folder.scheme == "gs":
        assert emu.request_counts().get("objects.compose", 0) >= 1
    assert folder.list("checkpoints/") == ["checkpoints/7/ckpt-00007.pt"]
    assert on_disk(emu, folder, "checkpoints/7/ckpt-00007.pt")  # joined / composed on disk
    assert incomplete_uploads(folder) == []  # parts composed and deleted / upload completed
    assert [p.name for p in local.parent.iterdir()] == [local.name]  # the resume record is gone

    back = tmp_path / "back" / "ckpt-00007.pt"
    got = folder.fetch_file("checkpoints/7/ckpt-00007.pt", back)
    assert got.in_parts and got.parts == 8
    assert back.read_bytes() == local.read_bytes()
    folder.download(f"{folder.uri}/checkpoints/7/ckpt-00007.pt", tmp_path / "again.pt")  # by URI too
    assert (tmp_path / "again.pt").read_bytes() == local.read_bytes()

    # a small file keeps the one-request path
    small = tmp_path / "small.json"
    small.write_bytes(b"{}" * 1000)
    one = folder.send_file(small, "checkpoints/7/small.json")
    assert not one.in_parts and one.parts == 1
    folder.download("checkpoints/7/small.json", tmp_path / "small-back.json")
    assert (tmp_path / "small-back.json").read_bytes() == small.read_bytes()
    assert folder.delete_prefix("") == 2


def test_gcs_composes_more_than_32_parts_in_a_tree(emu: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """GCS composes at most 32 sources at once: 40 parts go through intermediate objects."""
    monkeypatch.setenv("CLOUDTRAIN_TRANSFER_THRESHOLD", str(MiB))
    monkeypatch.setenv("CLOUDTRAIN_TRANSFER_PART_SIZE", str(256 * 1024))
    folder = open_run_folder(f"gs://{DEFAULT_BUCKET}/runs/transfer/{uuid.uuid4().hex[:12]}/-1")
    local = tmp_path / "ckpt-00001.pt"
    local.write_bytes(os.urandom(10 * MiB))
    before = emu.request_counts().get("objects.compose", 0)
    report = folder.send_file(local, "checkpoints/1/ckpt-00001.pt")
    assert report.parts == 40 and report.parts_sent == 40
    assert emu.request_counts().get("objects.compose", 0) - before == 3  # 32 + 8, then the 2
    folder.download("checkpoints/1/ckpt-00001.pt", tmp_path / "back.pt")
    assert (tmp_path / "back.pt").read_bytes() == local.read_bytes()
    assert folder.list("") == ["checkpoints/1/ckpt-00001.pt"]  # no part, no intermediate left
    folder.delete_prefix("")


def test_the_emulated_s3_serves_ranges_as_s3_does(emu: Any, tmp_path: Path) -> None:
    """Ranged GETs (what a restore sends) are answered from the object's buffer by the emulator:
    the bytes of the range, S3's headers, If-Match honoured (412 when the object changed)."""
    from botocore.exceptions import ClientError

    folder = open_run_folder(f"s3://{DEFAULT_BUCKET}/runs/transfer/{uuid.uuid4().hex[:12]}/-1")
    data = os.urandom(3 * MiB + 17)
    folder.put_bytes("blob.bin", data)
    client, key = folder._backend().client, folder._full("blob.bin")
    etag = client.head_object(Bucket=folder.bucket, Key=key)["ETag"]
    got = client.get_object(Bucket=folder.bucket, Key=key, Range="bytes=1000-2000999", IfMatch=etag)
    assert (
        got["Body"].read() == data[1000:2001000] and got["ContentRange"] == f"bytes 1000-2000999/{len(data)}"
    )
    assert got["ETag"] == etag and got["ContentLength"] == 2_000_000
    tail = client.get_object(Bucket=folder.bucket, Key=key, Range=f"bytes={len(data) - 5}-{len(data) + 100}")
    assert tail["Body"].read() == data[-5:]
    rest = client.get_object(Bucket=folder.bucket, Key=key, Range=f"bytes={3 * MiB}-")  # s3transfer's last
    assert (
        rest["Body"].read() == data[3 * MiB :]
        and rest["ContentRange"] == f"bytes {3 * MiB}-{len(data) - 1}/{len(data)}"
    )
    with pytest.raises(ClientError) as err:
        client.get_object(Bucket=folder.bucket, Key=key, Range="bytes=0-9", IfMatch='"0000"')
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    folder.delete_prefix("")


# Uploads the file and blocks (forever) once three parts are up, after writing the marker: the test
# SIGKILLs it there, as an agent killed mid-upload.
KILLED = r"""
import sys, threading, time
from pathlib import Path
from airflow_cloudtrain.storage import open_run_folder

uri, local, key, marker = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
done, lock = [], threading.Lock()

def progress(part, size):
    with lock:
        done.append(part)
        if len(done) >= 3:
            marker.write_text(",".join(map(str, done)))
    if len(done) >= 3:
        time.sleep(3600)

open_run_folder(uri).send_file(local, key, progress=progress)
print("never here", flush=True)
"""


def kill_halfway(folder: RunFolder, local: Path, key: str, tmp: Path) -> None:
    marker = tmp / f"blocked-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argv = [sys.executable, "-c", KILLED, folder.uri, str(local), key, str(marker)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, message="three parts up")
        assert marker.exists(), proc.communicate()[1].decode()[-3000:]
    finally:
        proc.kill()  # SIGKILL: no cleanup at all
        out, _ = proc.communicate(timeout=60)
    assert b"never here" not in out


def test_an_upload_killed_halfway_is_resumed_by_the_next_process(big: Any, tmp_path: Path) -> None:
    emu, folder, local = big
    key = "checkpoints/7/ckpt-00007.pt"
    kill_halfway(folder, local, key, tmp_path)
    assert folder.list("checkpoints/") == []  # nothing visible: the object is not there yet
    assert incomplete_uploads(folder)  # but parts are held (and billed) by the cloud
    assert any(p.name.startswith(".ckpt-00007.pt.upload-") for p in local.parent.iterdir())

    before = part_requests(emu, folder.scheme)
    report = folder.send_file(local, key)
    assert report.resumed and report.in_parts, report
    assert 0 < report.parts_sent <= report.parts - 3 and report.bytes_sent < local.stat().st_size
    assert part_requests(emu, folder.scheme) - before == report.parts_sent
    back = tmp_path / "back.pt"
    folder.download(key, back)
    assert back.read_bytes() == local.read_bytes()
    assert incomplete_uploads(folder) == []
    assert [p.name for p in local.parent.iterdir()] == [local.name]
    folder.delete_prefix("")


def test_a_changed_file_starts_over(big: Any, tmp_path: Path) -> None:
    _, folder, local = big
    key = "checkpoints/7/ckpt-00007.pt"
    kill_halfway(folder, local, key, tmp_path)
    local.write_bytes(os.urandom(SIZE))  # the job saved again under the same name
    report = folder.send_file(local, key)
    assert not report.resumed and report.parts_sent == report.parts == 8, report
    assert any("changed" in note for note in report.notes), report.notes
    back = tmp_path / "back.pt"
    folder.download(key, back)
    assert back.read_bytes() == local.read_bytes()
    assert incomplete_uploads(folder) == []  # the old upload was aborted / its parts deleted
    folder.delete_prefix("")


def test_teardown_leaves_no_incomplete_upload(big: Any, tmp_path: Path) -> None:
    """The run is torn down while an upload is half done (the agent was killed): the folder's
    teardown must not leave parts behind, which the cloud would keep billing."""
    _, folder, local = big
    kill_halfway(folder, local, "checkpoints/7/ckpt-00007.pt", tmp_path)
    folder.put_text("status.json", "{}")
    assert incomplete_uploads(folder)
    folder.delete_prefix("")
    assert incomplete_uploads(folder) == []
    assert folder.list("") == []

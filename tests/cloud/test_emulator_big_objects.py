"""Big objects of the emulated S3 and GCS live on disk, not in memory, and come back byte-exact.

A few MB stand for many GB: moto spools a key to a file past ~5 MiB, the emulated GCS past its 4 MiB
``disk_threshold``. Real clients over the wire: boto3 (a multipart upload with a full-object checksum,
ranged and whole GETs, HEAD of a part), google-cloud-storage (a resumable upload in 1 MiB chunks, a
compose, a copy, ranged and whole GETs with md5 checked). Cheap: ~25 MB moved in all.
"""

from __future__ import annotations

import os
import pickle
import uuid
from typing import Any

from airflow_cloudtrain.emulator import DEFAULT_BUCKET
from airflow_cloudtrain.emulator.aws import bigkeys
from airflow_cloudtrain.storage import open_run_folder

MiB = 1024 * 1024


def test_a_completed_s3_multipart_upload_lives_on_disk(emu: Any) -> None:
    folder = open_run_folder(f"s3://{DEFAULT_BUCKET}/runs/big/{uuid.uuid4().hex[:12]}/-1")
    client, key = folder._backend().client, folder._full("ckpt.bin")
    data = os.urandom(11 * MiB + 5)
    up = client.create_multipart_upload(
        Bucket=folder.bucket, Key=key, ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT"
    )
    parts = []
    for n, start in enumerate(range(0, len(data), 5 * MiB), start=1):
        sent = client.upload_part(
            Bucket=folder.bucket,
            Key=key,
            UploadId=up["UploadId"],
            PartNumber=n,
            Body=data[start : start + 5 * MiB],
            ChecksumAlgorithm="SHA256",
        )
        parts.append({"PartNumber": n, "ETag": sent["ETag"]})
    client.complete_multipart_upload(
        Bucket=folder.bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    try:
        assert bigkeys.on_disk(folder.bucket, key)
        got = client.get_object(Bucket=folder.bucket, Key=key, Range=f"bytes={5 * MiB - 3}-{10 * MiB + 2}")
        assert got["Body"].read() == data[5 * MiB - 3 : 10 * MiB + 3]  # across two parts' bytes
        whole = client.get_object(Bucket=folder.bucket, Key=key, ChecksumMode="ENABLED")
        assert whole["Body"].read() == data and whole["ETag"].endswith('-3"')
        assert whole["ChecksumSHA256"]  # the full-object checksum, computed part by part
        assert client.head_object(Bucket=folder.bucket, Key=key, PartNumber=2)["ContentLength"] == 5 * MiB
    finally:
        folder.delete_prefix("")


def test_big_gcs_objects_live_on_disk_and_go_with_their_last_name(emu: Any) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="cloudtrain-emulated", credentials=AnonymousCredentials())
    bucket, base = client.bucket(DEFAULT_BUCKET), f"runs/big/{uuid.uuid4().hex[:12]}"
    data = os.urandom(9 * MiB + 7)
    resumable = bucket.blob(f"{base}/resumable.bin", chunk_size=MiB)  # 10 requests, appended in place
    resumable.upload_from_string(data)
    head, tail = bucket.blob(f"{base}/head.bin"), bucket.blob(f"{base}/tail.bin")
    head.upload_from_string(data[: 5 * MiB])
    tail.upload_from_string(data[5 * MiB :])
    composed = bucket.blob(f"{base}/composed.bin")
    composed.compose([head, tail])
    bucket.copy_blob(composed, bucket, f"{base}/copy.bin")
    head.delete()
    tail.delete()  # the composite keeps its bytes: its own links to the parts' files
    names = ("resumable.bin", "composed.bin", "copy.bin")
    try:
        assert all(emu.gcs.on_disk(DEFAULT_BUCKET, f"{base}/{name}") for name in names)
        assert not emu.gcs.on_disk(DEFAULT_BUCKET, f"{base}/small")  # never written: no entry
        for name in names:
            blob = bucket.get_blob(f"{base}/{name}")
            assert blob.size == len(data) and blob.crc32c == bucket.get_blob(f"{base}/resumable.bin").crc32c
            assert (
                blob.download_as_bytes(start=5 * MiB - 3, end=5 * MiB + 2) == data[5 * MiB - 3 : 5 * MiB + 3]
            )
            assert blob.download_as_bytes(checksum="md5") == data  # whole GET, streamed, md5 checked
        assert bucket.get_blob(f"{base}/composed.bin").md5_hash is None  # as GCS: composites have none
        assert not [n for n in emu.gcs._storage._store._files if n.startswith("_resumable/")]
    finally:
        for name in names:
            bucket.blob(f"{base}/{name}").delete()


def test_the_gcs_emulators_files_go_when_it_stops() -> None:
    from airflow_cloudtrain.emulator.gcp import GcsServer

    server = GcsServer(disk_threshold=MiB)
    server.start()
    try:
        server.create_bucket("big-objects")
        data = os.urandom(2 * MiB)
        server._storage.create_file("big-objects", "a.bin", data, {"name": "a.bin"})
        assert server.on_disk("big-objects", "a.bin")
        saved = pickle.dumps(server._storage._store._files["big-objects/a.bin"])  # emulator.state's way
        assert pickle.loads(saved) == data  # a saved state carries the bytes, not the file's path
        files = server._storage._store.dir
        assert len(os.listdir(files)) == 1
    finally:
        server.stop()
    assert not os.path.exists(files)

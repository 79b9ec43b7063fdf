"""Big files between a local disk and S3 / GCS: in parts, in parallel, with bounded memory, resumable.

A checkpoint of several GB must reach the bucket inside a spot notice (120 s on AWS, 30 s on GCE), so
``RunFolder.upload_file`` / ``download`` hand files of ``threshold`` bytes or more to this module:

* S3 upload: a multipart upload (CreateMultipartUpload, UploadPart x N in ``workers`` threads,
  CompleteMultipartUpload). GCS upload: a parallel composite upload: each part is a temporary object
  under the run folder's ``.uploads/`` (``parts_prefix``), composed into the target 32 at a time
  (GCS's limit per compose), then deleted.
* Download: ranged GETs (S3 ``Range`` with ``IfMatch`` on the ETag, GCS ``Range`` with
  ``ifGenerationMatch``) in ``workers`` threads, each written at its offset of the target file; a
  failed download removes the partial file.
* Memory: a part is read from the file only by the thread that sends it, so at most ``workers``
  parts are in memory on upload (``workers * part_size``, 8 x 16 MiB = 128 MiB by default); a
  download streams each range in 1 MiB pieces. The part size grows when a file would need more than
  S3's 10,000 parts (a 160 GB file at 16 MiB).

Resume (after the agent is killed or restarted, e.g. by a spot notice arriving mid-upload): when an
upload in parts starts, a small record is written next to the file (``.<name>.upload-<hash>.json``,
hidden, so checkpoint listings skip it): the target, the file's size, mtime and inode, the part size
and the S3 upload id / the GCS parts' tag. An upload of the same file (same size, mtime and inode) to
the same target finds it and sends only the parts the cloud does not have (S3 ListParts; GCS: the
part objects present with the right size); the record goes when the upload completes. A failed
upload keeps its record too, so the agent's retry of the file sends only the missing parts. What is not
resumed: a file that changed (or was replaced) since (the old S3 upload is aborted, the upload starts
over), an upload whose S3 upload id is gone or whose GCS parts were deleted (their parts are sent
again), and downloads (a restore starts over; it writes to a staging folder anyway).

Money: an S3 multipart upload never completed keeps its parts billed until aborted, and GCS parts are
ordinary objects: ``RunFolder.delete_prefix`` (run-folder teardown) aborts the incomplete multipart
uploads under the prefix and deletes ``.uploads/`` with the rest of the folder (``abort_uploads``).

Settings: ``TransferConfig`` (defaults below), overridable through the environment
(``CLOUDTRAIN_TRANSFER_THRESHOLD``, ``CLOUDTRAIN_TRANSFER_PART_SIZE`` in bytes,
``CLOUDTRAIN_TRANSFER_WORKERS``), which is how tests use small parts. Stdlib only at import: the
cloud clients are passed in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
S3_MAX_PARTS = 10_000
S3_MIN_PART = 5 * MiB  # every part but the last must be at least this big on S3
GCS_MAX_COMPOSE = 32
STREAM_CHUNK = MiB
ENV_PREFIX = "CLOUDTRAIN_TRANSFER_"


@dataclass(frozen=True)
class TransferConfig:
    """When and how a file goes in parts (see the module doc); ``from_env`` applies the overrides."""

    threshold: int = 64 * MiB  # files at least this big go in parts; smaller ones in one request
    part_size: int = 16 * MiB
    workers: int = 8  # parts in flight at once: memory on upload is about workers * part_size

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> TransferConfig:
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for name in ("threshold", "part_size", "workers"):
            raw = env.get(ENV_PREFIX + name.upper())
            if raw:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise ValueError(
                        f"{ENV_PREFIX}{name.upper()}={raw!r} is not an integer (bytes, or a thread count)"
                    ) from None
        config = cls(**values)
        if config.part_size < 1 or config.workers < 1 or config.threshold < 1:
            raise ValueError(f"transfer settings must be positive, got {config}")
        return config

    def part_size_for(self, size: int, min_part: int = 1) -> int:
        return max(self.part_size, min_part, math.ceil(size / S3_MAX_PARTS))


@dataclass
class TransferReport:
    """What one transfer did: parts in all, parts (and bytes) actually sent, resumed or not."""

    size: int
    parts: int = 1
    parts_sent: int = 1
    bytes_sent: int = 0
    resumed: bool = False
    in_parts: bool = False
    notes: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def sent(self, length: int) -> None:
        """One part is up (called from the sending threads)."""
        with self._lock:
            self.parts_sent += 1
            self.bytes_sent += length


Progress = Callable[[int, int], None]  # (part number, its size) once a part is up


def _ranges(size: int, part: int) -> list[tuple[int, int, int]]:
    """(part number from 1, offset, length) covering ``size`` bytes."""
    count = max(1, math.ceil(size / part))
    return [(n + 1, n * part, min(part, size - n * part)) for n in range(count)]


def _read(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as handle:
        return os.pread(handle.fileno(), length, offset)


def _parallel(jobs: Iterable[Callable[[], None]], workers: int) -> None:
    """Run the jobs ``workers`` at a time; the first failure cancels the rest and is raised."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cloudtrain-transfer") as pool:
        futures = [pool.submit(job) for job in jobs]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]


# ---- the resume record ---------------------------------------------------------------------------


def record_path(path: str, target: str) -> Path:
    """Where the resume record of uploading ``path`` to ``target`` lives: hidden, next to the file."""
    local = Path(path)
    tag = hashlib.sha256(target.encode()).hexdigest()[:12]
    return local.parent / f".{local.name}.upload-{tag}.json"


def _identity(path: str, target: str, part: int) -> dict[str, Any]:
    st = os.stat(path)
    return {
        "target": target,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "part": part,
    }


def _load_record(where: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(where.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _save_record(where: Path, data: dict[str, Any]) -> None:
    tmp = where.with_name(where.name + ".tmp")
    with contextlib.suppress(OSError):  # a read-only checkpoint dir: no resume, still an upload
        tmp.write_text(json.dumps(data))
        os.replace(tmp, where)


def _drop_record(where: Path) -> None:
    with contextlib.suppress(OSError):
        where.unlink()


# ---- S3 --------------------------------------------------------------------------------------------


def s3_upload(
    client: Any, bucket: str, key: str, path: str, config: TransferConfig, progress: Progress | None = None
) -> TransferReport:
    """Upload ``path`` to ``s3://bucket/key``: one PutObject below the threshold, else a resumable
    multipart upload (module doc)."""
    size = os.stat(path).st_size
    if size < config.threshold:
        with open(path, "rb") as handle:
            client.put_object(Bucket=bucket, Key=key, Body=handle)
        return TransferReport(size=size, bytes_sent=size)
    part = config.part_size_for(size, S3_MIN_PART)
    ranges = _ranges(size, part)
    target = f"s3://{bucket}/{key}"
    where = record_path(path, target)
    ident = _identity(path, target, part)
    report = TransferReport(size=size, parts=len(ranges), parts_sent=0, in_parts=True)
    upload_id, etags = _s3_resume(client, bucket, key, where, ident, ranges, report)
    if upload_id is None:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        _save_record(where, {**ident, "upload_id": upload_id})

    def send(number: int, offset: int, length: int) -> None:
        body = _read(path, offset, length)
        answer = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
        etags[number] = answer["ETag"]
        report.sent(length)
        if progress is not None:
            progress(number, length)

    todo = [r for r in ranges if r[0] not in etags]
    _parallel([lambda r=r: send(*r) for r in todo], config.workers)  # type: ignore[misc]
    parts = [{"PartNumber": n, "ETag": etags[n]} for n, _, _ in ranges]
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    _drop_record(where)
    return report


def _s3_resume(
    client: Any,
    bucket: str,
    key: str,
    where: Path,
    ident: dict[str, Any],
    ranges: list[tuple[int, int, int]],
    report: TransferReport,
) -> tuple[str | None, dict[int, str]]:
    """The upload id and the parts already up (number -> ETag) of an earlier try, or (None, {})."""
    from botocore.exceptions import ClientError

    record = _load_record(where)
    if not record or not record.get("upload_id"):
        return None, {}
    upload_id = str(record["upload_id"])
    if {k: record.get(k) for k in ident} != ident:  # another file now, or another part size
        with contextlib.suppress(ClientError):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        _drop_record(where)
        report.notes.append("the file changed since the interrupted upload: starting over")
        return None, {}
    sizes = {n: length for n, _, length in ranges}
    etags: dict[int, str] = {}
    try:
        for page in client.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
            for part in page.get("Parts", []):
                if sizes.get(part["PartNumber"]) == part["Size"]:
                    etags[part["PartNumber"]] = part["ETag"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") != "NoSuchUpload":
            raise
        _drop_record(where)
        report.notes.append("the interrupted upload is gone (aborted or expired): starting over")
        return None, {}
    report.resumed = True
    report.notes.append(f"resuming upload: {len(etags)} of {len(ranges)} parts already up")
    return upload_id, etags


def s3_download(client: Any, bucket: str, key: str, path: str, config: TransferConfig) -> TransferReport:
    """Download ``s3://bucket/key`` to ``path``: ranged GETs in parallel above the threshold."""
    head = client.head_object(Bucket=bucket, Key=key)
    size = int(head["ContentLength"])
    if size < config.threshold:
        client.download_file(bucket, key, path)
        return TransferReport(size=size, bytes_sent=size)
    etag = head["ETag"]

    def fetch(handle: Any, offset: int, length: int) -> None:
        body = client.get_object(
            Bucket=bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}", IfMatch=etag
        )["Body"]
        position = offset
        for chunk in body.iter_chunks(STREAM_CHUNK):
            os.pwrite(handle.fileno(), chunk, position)
            position += len(chunk)
        if position != offset + length:
            raise OSError(f"s3://{bucket}/{key}: range at {offset} ended after {position - offset} bytes")

    return _ranged_download(path, size, config, fetch)


def _ranged_download(
    path: str, size: int, config: TransferConfig, fetch: Callable[[Any, int, int], None]
) -> TransferReport:
    ranges = _ranges(size, config.part_size)
    try:
        with open(path, "wb") as handle:
            handle.truncate(size)
            _parallel([lambda r=r: fetch(handle, r[1], r[2]) for r in ranges], config.workers)  # type: ignore[misc]
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return TransferReport(
        size=size, parts=len(ranges), parts_sent=len(ranges), bytes_sent=size, in_parts=True
    )


def s3_abort_uploads(client: Any, bucket: str, prefix: str) -> int:
    """Abort every incomplete multipart upload under ``prefix``; returns how many."""
    aborted = 0
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for upload in page.get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            aborted += 1
    return aborted


def s3_incomplete_uploads(client: Any, bucket: str, prefix: str) -> list[str]:
    """The keys of the incomplete multipart uploads under ``prefix`` (what teardown must leave none of)."""
    keys: list[str] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(upload["Key"] for upload in page.get("Uploads", []))
    return keys


# ---- GCS -------------------------------------------------------------------------------------------


def gcs_upload(
    client: Any,
    bucket: str,
    key: str,
    path: str,
    config: TransferConfig,
    parts_prefix: str,
    progress: Progress | None = None,
) -> TransferReport:
    """Upload ``path`` to ``gs://bucket/key``: one request below the threshold, else a resumable
    parallel composite upload with its parts under ``parts_prefix`` (module doc)."""
    size = os.stat(path).st_size
    store = client.bucket(bucket)
    if size < config.threshold:
        store.blob(key).upload_from_filename(path)
        return TransferReport(size=size, bytes_sent=size)
    part = config.part_size_for(size)
    ranges = _ranges(size, part)
    target = f"gs://{bucket}/{key}"
    where = record_path(path, target)
    ident = _identity(path, target, part)
    report = TransferReport(size=size, parts=len(ranges), parts_sent=0, in_parts=True)
    record = _load_record(where)
    done: set[int] = set()
    if record and record.get("tag") and {k: record.get(k) for k in ident} == ident:
        tag = str(record["tag"])
        sizes = {n: length for n, _, length in ranges}
        for blob in client.list_blobs(bucket, prefix=f"{parts_prefix}/{tag}/"):
            name = blob.name.rsplit("/", 1)[-1]
            if name.isdigit() and sizes.get(int(name)) == blob.size:
                done.add(int(name))
        report.resumed = True
        report.notes.append(f"resuming upload: {len(done)} of {len(ranges)} parts already up")
    else:
        if record and record.get("tag"):
            _gcs_delete_prefix(client, bucket, f"{parts_prefix}/{record['tag']}/")
            report.notes.append("the file changed since the interrupted upload: starting over")
        tag = hashlib.sha256(f"{target}:{os.urandom(8).hex()}".encode()).hexdigest()[:16]
        _save_record(where, {**ident, "tag": tag})
    base = f"{parts_prefix}/{tag}"

    def send(number: int, offset: int, length: int) -> None:
        store.blob(f"{base}/{number:05d}").upload_from_string(_read(path, offset, length))
        report.sent(length)
        if progress is not None:
            progress(number, length)

    _parallel([lambda r=r: send(*r) for r in ranges if r[0] not in done], config.workers)  # type: ignore[misc]
    sources = [f"{base}/{n:05d}" for n, _, _ in ranges]
    level = 0
    while len(sources) > GCS_MAX_COMPOSE:  # a tree of composes: 32 sources each at most
        groups = [sources[i : i + GCS_MAX_COMPOSE] for i in range(0, len(sources), GCS_MAX_COMPOSE)]
        names = [f"{base}/c{level}-{i:05d}" for i in range(len(groups))]
        jobs = [
            lambda g=g, n=n: store.blob(n).compose([store.blob(s) for s in g])
            for g, n in zip(groups, names, strict=True)
        ]
        _parallel(jobs, config.workers)
        sources, level = names, level + 1
    store.blob(key).compose([store.blob(s) for s in sources])
    _drop_record(where)
    _gcs_delete_prefix(client, bucket, f"{base}/", config.workers)
    return report


def _gcs_delete_prefix(client: Any, bucket: str, prefix: str, workers: int = 8) -> None:
    from google.api_core.exceptions import NotFound

    store = client.bucket(bucket)

    def delete(name: str) -> None:
        with contextlib.suppress(NotFound):
            store.blob(name).delete()

    names = [blob.name for blob in client.list_blobs(bucket, prefix=prefix)]
    _parallel([lambda n=n: delete(n) for n in names], workers)  # type: ignore[misc]


def gcs_download(client: Any, bucket: str, key: str, path: str, config: TransferConfig) -> TransferReport:
    """Download ``gs://bucket/key`` to ``path``: ranged GETs in parallel above the threshold."""
    from google.api_core.exceptions import NotFound

    store = client.bucket(bucket)
    if not hasattr(store, "get_blob"):  # a client wrapper with blob up/downloads only: one request
        store.blob(key).download_to_filename(path)
        size = os.stat(path).st_size
        return TransferReport(size=size, bytes_sent=size)
    blob = store.get_blob(key)
    if blob is None:
        raise NotFound(f"gs://{bucket}/{key} does not exist")
    size = int(blob.size or 0)
    if size < config.threshold:
        blob.download_to_filename(path)
        return TransferReport(size=size, bytes_sent=size)
    generation = blob.generation

    class At:
        """A file object for one range: writes land at its offset, whatever the other threads do."""

        def __init__(self, fd: int, offset: int) -> None:
            self.fd, self.position = fd, offset

        def write(self, data: bytes) -> int:
            os.pwrite(self.fd, data, self.position)
            self.position += len(data)
            return len(data)

    def fetch(handle: Any, offset: int, length: int) -> None:
        sink = At(handle.fileno(), offset)
        part = client.bucket(bucket).blob(key, generation=generation)
        part.download_to_file(sink, start=offset, end=offset + length - 1, checksum=None)
        if sink.position != offset + length:
            raise OSError(
                f"gs://{bucket}/{key}: range at {offset} ended after {sink.position - offset} bytes"
            )

    return _ranged_download(path, size, config, fetch)

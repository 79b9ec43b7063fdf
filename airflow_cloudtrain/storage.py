"""Run-folder storage on S3 or GCS, shared by the agent (on the instance) and the operator (in Airflow).

Both sides talk only through the run folder, so both use this one small class. It stays
dependency-light on purpose: boto3 is imported only when an ``s3://`` folder is opened and
``google-cloud-storage`` only for ``gs://``, and there is no Airflow import, because the agent is
shipped to instances as a zipapp with nothing but boto3 / google-cloud-storage installed.

Endpoints are never configured here: boto3 honours ``AWS_ENDPOINT_URL`` and the GCS client honours
``STORAGE_EMULATOR_HOST`` by themselves, which is how the emulator redirects the same code to local
servers. The operator may pass clients built from its Airflow connection instead.

Transient errors: an S3 client built here (the agent's) retries throttling (``503 SlowDown``), 5xx
and dropped connections itself: up to 10 retries after the first try, in botocore's standard mode
(``S3_RETRIES``; clients passed in, e.g. the operator's, keep their own settings). On top
of that the agent wraps the calls it cannot afford to lose in ``agent.retry.retry`` (see there);
``upload_dir`` takes such a wrapper for each file, so one throttled file does not re-upload the rest.

``RunFolder.at(uri)`` opens another folder through the same clients (the agent's live index,
``RunSpec.live_uri``); ``modified_at(key)`` is an object's LastModified / ``updated``, which is how a
beacon's heartbeat is read without reading the beacon.

Big files (``TransferConfig.threshold``, 64 MiB by default) go through ``airflow_cloudtrain.transfer``:
in parts, in parallel, with bounded memory, an interrupted upload resumed by the next upload of the
same file (S3 multipart, GCS parallel composite with its parts under the folder's ``.uploads/``);
``delete_prefix`` also aborts the incomplete S3 multipart uploads under the prefix. ``folder.transfer``
holds the settings (from the environment, ``TransferConfig.from_env``).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import functools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_cloudtrain import transfer
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.transfer import Progress, TransferConfig, TransferReport

UPLOADS_DIR = ".uploads"  # the run folder's temporary GCS parts of composite uploads (transfer module)

# botocore's retry settings for the S3 client built here: standard mode retries throttling codes
# (SlowDown, Throttling, RequestLimitExceeded, ...), HTTP 500/502/503/504 and connection errors with
# exponential backoff; 10 retries (11 tries in all) ride out a bucket that throttles a good share.
S3_RETRIES = {"mode": "standard", "max_attempts": 10}


_LOADERS: dict[str | None, Any] = {}  # botocore data path -> this process's loader for it
_LOADERS_LOCK = threading.Lock()


def service_models(data_path: str | None = None) -> Any:
    """This process's one botocore loader for ``data_path`` (``AWS_DATA_PATH``; None: botocore's own).

    A boto3 session makes a loader of its own (the Amazon provider shares one only between its async
    sessions), so each client a new session makes parses its service's model again: EC2's is 4 MB
    of JSON, 0.1-0.3 s of CPU, most of a task's CPU against a fast endpoint, and the provider's hooks
    make a session per ``get_session``. The models are read-only data and the loader keeps what it
    loaded, so one parsed copy serves every session with the same data path; two threads' first
    loads of one model may both parse it, to the same result."""
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            from botocore.loaders import create_loader

            loader = create_loader(data_path)
            loader.file_loader = _plain_json_file_loader()
            _LOADERS[data_path] = loader
    return loader


def share_service_models(session: Any) -> Any:
    """Point a boto3 or aiobotocore session at this process's loader (``service_models``)."""
    core = getattr(session, "_session", session)  # boto3 wraps a botocore session; aiobotocore's is one
    core.register_component("data_loader", service_models(core.get_config_variable("data_path")))
    return session


def _plain_json_file_loader() -> Any:
    """botocore parses its models into OrderedDicts, through a callback per JSON object: EC2's model
    takes 144 ms instead of 51 ms, all of it holding the interpreter (a triggerer's event loop waits
    that long for the thread that builds a client), and none of them can leave the garbage
    collector's lists, as plain dicts of strings do. Plain dicts keep their order too."""
    from botocore.loaders import JSONFileLoader

    class PlainJsonFileLoader(JSONFileLoader):
        def _load_file(self, full_path: str, open_method: Any) -> Any:
            if not os.path.isfile(full_path):
                return None
            with open_method(full_path, "rb") as fp:
                return json.loads(fp.read().decode("utf-8"))

    return PlainJsonFileLoader()


def aws_client(service: str, **kwargs: Any) -> Any:
    """``boto3.client(service, **kwargs)`` (the default session: default credentials and endpoint)
    with this process's shared service models: an agent makes clients for S3, SQS and its secrets."""
    import boto3

    share_service_models(boto3._get_default_session())
    return boto3.client(service, **kwargs)


def s3_client() -> Any:
    """The agent's S3 client: default credentials and endpoint, ``S3_RETRIES``."""
    from botocore.config import Config

    return aws_client("s3", config=Config(retries=dict(S3_RETRIES)))


# (service, operation) of ``delete`` per provider, as the permission documents name them: a work-queue
# operator's retry deletes its earlier try's failed items' outcomes (``lifecycle/fleet/run.py``), a
# call a recording run makes only when an earlier try left a failed item (``permissions.retry_calls``)
DELETE_CALLS = {"aws": (("s3", "DeleteObjects"),), "gcp": (("storage", "objects.delete"),)}
# ... and of ``RunFolder.delete_prefix``, which an agent calls before each checkpoint version's upload
# (``agent/checkpoints.py``: the leftovers of an agent killed mid-upload); S3's incomplete multipart
# uploads are listed and aborted first
DELETE_PREFIX_CALLS = {
    "aws": (
        ("s3", "ListMultipartUploads"),
        ("s3", "AbortMultipartUpload"),
        ("s3", "ListObjectsV2"),
        ("s3", "DeleteObjects"),
    ),
    "gcp": (("storage", "objects.list"), ("storage", "objects.delete")),
}


class _S3:
    """The few S3 calls we need, over a boto3 client."""

    def __init__(self, client: Any = None) -> None:
        if client is None:
            client = s3_client()
        elif hasattr(client, "client") and not hasattr(client, "put_object"):
            client = client.client("s3")  # a boto3 Session
        self.client = client

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, bucket: str, key: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def modified_at(self, bucket: str, key: str) -> float | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=bucket, Key=key)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        return float(head["LastModified"].timestamp())

    def list(self, bucket: str, prefix: str) -> builtins.list[str]:
        return [obj["Key"] for obj in self._objects(bucket, prefix)]

    def list_modified(self, bucket: str, prefix: str) -> dict[str, float]:
        return {obj["Key"]: float(obj["LastModified"].timestamp()) for obj in self._objects(bucket, prefix)}

    def _objects(self, bucket: str, prefix: str) -> builtins.list[dict[str, Any]]:
        found: builtins.list[dict[str, Any]] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found.extend(page.get("Contents", []))
        return found

    def upload_file(
        self, bucket: str, key: str, path: str, config: TransferConfig, parts: str, progress: Progress | None
    ) -> TransferReport:
        return transfer.s3_upload(self.client, bucket, key, path, config, progress)

    def download_file(self, bucket: str, key: str, path: str, config: TransferConfig) -> TransferReport:
        return transfer.s3_download(self.client, bucket, key, path, config)

    def abort_uploads(self, bucket: str, prefix: str) -> int:
        return transfer.s3_abort_uploads(self.client, bucket, prefix)

    def delete(self, bucket: str, keys: builtins.list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            self.client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})


def without_bucket_lookups(client: Any) -> Any:
    """A ``google.cloud.storage.Client`` that does not look its buckets up behind our back.

    google-cloud-storage (3.17) reads each bucket's metadata (``storage.buckets.get``) in a background
    thread the first time a client touches the bucket, only to label OpenTelemetry spans. For a run
    that is one more request and thread per client and bucket, and a permission
    (``storage.buckets.get``) that nothing else of ours needs. The library's own switch
    (``DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA``) is process-wide, which a provider must not set
    in a user's Airflow; the client's own cache set to None turns it off for this client alone (the
    library checks it before every lookup). Without that attribute (older or newer releases) nothing
    changes."""
    if getattr(client, "_bucket_metadata_cache", None) is not None:
        client._bucket_metadata_cache = None
    return client


class _GCS:
    """The same calls over ``google.cloud.storage``; anonymous when ``STORAGE_EMULATOR_HOST`` is set."""

    def __init__(self, client: Any = None) -> None:
        if client is None:
            from google.cloud import storage

            if os.environ.get("STORAGE_EMULATOR_HOST"):
                from google.auth.credentials import AnonymousCredentials

                project = os.environ.get("GOOGLE_CLOUD_PROJECT", "cloudtrain-emulated")
                client = storage.Client(project=project, credentials=AnonymousCredentials())
            else:
                client = storage.Client()
        self.client = without_bucket_lookups(client)

    def _blob(self, bucket: str, key: str) -> Any:
        return self.client.bucket(bucket).blob(key)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._blob(bucket, key).upload_from_string(data)

    def get(self, bucket: str, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._blob(bucket, key).download_as_bytes()
        except NotFound:
            return None

    def modified_at(self, bucket: str, key: str) -> float | None:
        blob = self.client.bucket(bucket).get_blob(key)  # None when it does not exist
        updated = getattr(blob, "updated", None)
        return None if updated is None else float(updated.timestamp())

    def list(self, bucket: str, prefix: str) -> builtins.list[str]:
        return [blob.name for blob in self.client.list_blobs(bucket, prefix=prefix)]

    def list_modified(self, bucket: str, prefix: str) -> dict[str, float]:
        return {
            blob.name: float(blob.updated.timestamp()) if blob.updated is not None else 0.0
            for blob in self.client.list_blobs(bucket, prefix=prefix)
        }

    def upload_file(
        self, bucket: str, key: str, path: str, config: TransferConfig, parts: str, progress: Progress | None
    ) -> TransferReport:
        return transfer.gcs_upload(self.client, bucket, key, path, config, parts, progress)

    def download_file(self, bucket: str, key: str, path: str, config: TransferConfig) -> TransferReport:
        return transfer.gcs_download(self.client, bucket, key, path, config)

    def abort_uploads(self, bucket: str, prefix: str) -> int:
        return 0  # GCS parts are objects under the folder's .uploads/: delete_prefix deletes them

    def delete(self, bucket: str, keys: builtins.list[str]) -> None:
        for key in keys:
            self._blob(bucket, key).delete()


class RunFolder:
    """One run folder (``s3://bucket/prefix`` or ``gs://bucket/prefix``); keys are relative to it.

    ``list`` and ``delete_prefix`` work on key prefixes like S3 does, except that
    ``delete_prefix`` treats a non-empty prefix as a folder (``"results"`` never deletes
    ``"results-old/..."``), because deleting is the one call where a loose match costs data.
    """

    def __init__(self, uri: str, s3_client: Any = None, gcs_client: Any = None) -> None:
        self.scheme, self.bucket, self.base = runs.split_uri(uri)
        self.uri = f"{self.scheme}://{self.bucket}" + (f"/{self.base}" if self.base else "")
        self._clients = {"s3": s3_client, "gs": gcs_client}
        self._backends: dict[str, _S3 | _GCS] = {}
        self.transfer = TransferConfig.from_env()

    def __repr__(self) -> str:
        return f"RunFolder({self.uri!r})"

    def at(self, uri: str) -> RunFolder:
        """The folder at ``uri`` (e.g. the bucket's live index, ``RunSpec.live_uri``) through this
        folder's clients: same credentials, endpoint and retry settings, one connection pool."""
        other = copy.copy(self)  # shares the client and backend dicts (a subclass stays one)
        other.scheme, other.bucket, other.base = runs.split_uri(uri)
        other.uri = f"{other.scheme}://{other.bucket}" + (f"/{other.base}" if other.base else "")
        return other

    def _backend(self, scheme: str | None = None) -> _S3 | _GCS:
        scheme = scheme or self.scheme
        if scheme not in self._backends:
            factory = _S3 if scheme == "s3" else _GCS
            self._backends[scheme] = factory(self._clients[scheme])
        return self._backends[scheme]

    def _full(self, key: str) -> str:
        key = key.lstrip("/")
        return f"{self.base}/{key}" if self.base else key

    def put_bytes(self, key: str, data: bytes) -> None:
        self._backend().put(self.bucket, self._full(key), data)

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode("utf-8"))

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when it does not exist (a normal case for status / spec polls)."""
        return self._backend().get(self.bucket, self._full(key))

    def get_text(self, key: str) -> str | None:
        data = self.get_bytes(key)
        return None if data is None else data.decode("utf-8")

    def modified_at(self, key: str) -> float | None:
        """When the object was last written (S3 ``LastModified``, GCS ``updated``) as unix time, or None
        when it does not exist. S3 gives whole seconds; GCS microseconds."""
        return self._backend().modified_at(self.bucket, self._full(key))

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Keys under ``prefix`` (a raw key prefix), relative to the run folder, sorted."""
        root = f"{self.base}/" if self.base else ""
        keys = self._backend().list(self.bucket, root + prefix.lstrip("/"))
        return sorted(k[len(root) :] for k in keys if k.startswith(root))

    def list_modified(self, prefix: str = "") -> dict[str, float]:
        """Keys under ``prefix`` with when each was last written (as ``modified_at``), from the one
        listing: what a job wrote and when, without a request per object."""
        root = f"{self.base}/" if self.base else ""
        found = self._backend().list_modified(self.bucket, root + prefix.lstrip("/"))
        return {k[len(root) :]: t for k, t in sorted(found.items()) if k.startswith(root)}

    def upload_file(self, local_path: str | os.PathLike[str], key: str) -> None:
        """Upload one file; big ones in parts (``send_file``)."""
        self.send_file(local_path, key)

    def send_file(
        self, local_path: str | os.PathLike[str], key: str, progress: Progress | None = None
    ) -> TransferReport:
        """``upload_file`` that says what it did: big files in parts, in parallel, resuming an
        interrupted upload of the same file (``airflow_cloudtrain.transfer``); ``progress(part, size)``
        is called as each part is up."""
        return self._backend().upload_file(
            self.bucket,
            self._full(key),
            os.fspath(local_path),
            self.transfer,
            self._full(UPLOADS_DIR),
            progress,
        )

    def upload_dir(
        self,
        local_dir: str | os.PathLike[str],
        prefix: str,
        call: Callable[[Callable[[], None]], object] | None = None,
    ) -> builtins.list[str]:
        """Upload every file below ``local_dir`` to ``prefix/<relative path>``; returns the keys written.

        ``call`` wraps each file's upload (the agent passes a retry), so a failure re-does one file.
        """
        root = Path(local_dir)
        written: builtins.list[str] = []
        if not root.is_dir():
            return written
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = runs.join(prefix, path.relative_to(root).as_posix())
            upload = functools.partial(self.upload_file, path, key)
            if call is None:
                upload()
            else:
                call(upload)
            written.append(key)
        return written

    def download(self, key_or_uri: str, local_path: str | os.PathLike[str]) -> None:
        """Download a key of this folder, or any ``s3://`` / ``gs://`` object (e.g. a code tarball)."""
        self.fetch_file(key_or_uri, local_path)

    def fetch_file(self, key_or_uri: str, local_path: str | os.PathLike[str]) -> TransferReport:
        """``download`` that says what it did: big objects in parallel ranges (``transfer``)."""
        if key_or_uri.startswith(("s3://", "gs://")):
            scheme, bucket, key = runs.split_uri(key_or_uri)
        else:
            scheme, bucket, key = self.scheme, self.bucket, self._full(key_or_uri)
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        return self._backend(scheme).download_file(bucket, key, os.fspath(local_path), self.transfer)

    def delete_key(self, key: str) -> None:
        """Delete one object of this folder (no error when it is not there)."""
        backend = self._backend()
        full = self._full(key)
        if isinstance(backend, _GCS):
            from google.api_core.exceptions import NotFound

            with contextlib.suppress(NotFound):
                backend.delete(self.bucket, [full])
        else:
            backend.delete(self.bucket, [full])

    def delete_prefix(self, prefix: str = "") -> int:
        """Delete the folder ``prefix`` (the whole run folder when empty); returns how many keys went.

        Incomplete S3 multipart uploads under it are aborted first (their parts are billed until then);
        GCS composite parts are objects of the folder's ``.uploads/`` and go with the rest."""
        prefix = prefix.strip("/")
        if not prefix and not self.base:
            raise ValueError(f"refusing to delete a whole bucket ({self.uri}); name a prefix")
        root = f"{self.base}/" if self.base else ""
        self._backend().abort_uploads(self.bucket, root + (f"{prefix}/" if prefix else ""))
        keys = [self._full(k) for k in self.list(f"{prefix}/" if prefix else "")]
        if keys:
            self._backend().delete(self.bucket, keys)
        return len(keys)


def open_run_folder(run_uri: str, s3_client: Any = None, gcs_client: Any = None) -> RunFolder:
    """Open the run folder at ``run_uri``; ``s3_client`` may be a boto3 S3 client or Session."""
    return RunFolder(run_uri, s3_client=s3_client, gcs_client=gcs_client)

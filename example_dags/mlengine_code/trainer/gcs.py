"""Tiny gs:// helpers for the example trainer (google-cloud-storage, present on Vertex's training images)."""

from __future__ import annotations

import json
import re
from typing import Any


def _split(uri: str) -> tuple[str, str]:
    m = re.fullmatch(r"gs://([^/]+)/?(.*)", uri)
    if not m:
        raise ValueError(f"{uri!r} is not a gs:// URI")
    return m.group(1), m.group(2)


def _bucket(uri: str) -> tuple[Any, str]:
    from google.cloud import storage

    name, prefix = _split(uri)
    return storage.Client().bucket(name), prefix


def write_json(uri: str, value: Any) -> None:
    bucket, key = _bucket(uri)
    bucket.blob(key).upload_from_string(json.dumps(value), content_type="application/json")


def read_json(uri: str) -> Any:
    bucket, key = _bucket(uri)
    blob = bucket.blob(key)
    return json.loads(blob.download_as_bytes()) if blob.exists() else None


def list_names(prefix_uri: str) -> list[str]:
    bucket, prefix = _bucket(prefix_uri)
    return sorted(b.name[len(prefix) :] for b in bucket.client.list_blobs(bucket, prefix=prefix))

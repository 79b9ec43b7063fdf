"""Ranged S3 GetObject served from the object's buffer: what moto does in O(object), done in O(range).

moto answers ``GET /bucket/key`` with ``Range: bytes=a-b`` by reading the whole object (its
``FakeKey.value``: a full read and a copy of the spooled file) and slicing it. A restore that fetches a
4 GB checkpoint in 16 MiB ranges would then read 1 TB. Real S3 serves a range in the range's time, so
the emulator's middleware (``server.FaultsAndCounts``) hands simple ranged GETs here: one
range of an existing object (``bytes=a-b``, or ``bytes=a-`` to the end, as s3transfer asks for a
download's last piece), no query (no version, no part number), no SSE-C; ``If-Match`` honoured.
Everything else (and any object this cannot read) goes on to moto, which answers as before.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from airflow_cloudtrain.emulator.aws import wire

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def ranged_get(environ: dict[str, Any]) -> wire.Reply | None:
    """The 206 answer to a simple ranged GetObject, or None to let moto answer it."""
    found = _RANGE.fullmatch(environ.get("HTTP_RANGE", "").strip())
    if (
        not found
        or environ.get("QUERY_STRING")
        or environ.get("HTTP_X_AMZ_SERVER_SIDE_ENCRYPTION_CUSTOMER_KEY")
    ):
        return None
    bucket, _, name = environ.get("PATH_INFO", "/").lstrip("/").partition("/")
    if not bucket or not name:
        return None
    try:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, urllib.parse.unquote(name))
    except Exception:  # no such bucket or key, another account: moto's own answer
        return None
    buffer = getattr(key, "_value_buffer", None)
    if key is None or buffer is None:
        return None
    start = int(found.group(1))
    with key.lock:
        size, etag = key.size, key.etag
        end = int(found.group(2)) if found.group(2) else size - 1
        if start > end or start >= size:
            return None  # moto's 416 / whole-object answer
        wanted = environ.get("HTTP_IF_MATCH")
        if wanted and wanted.strip() not in (etag, "*"):
            return None  # moto's 412
        end = min(end, size - 1)
        buffer.seek(start)
        body = buffer.read(end - start + 1)
    headers = [
        (
            "Content-Type",
            str((getattr(key, "metadata", None) or {}).get("Content-Type") or "binary/octet-stream"),
        ),
        ("Content-Length", str(len(body))),
        ("Content-Range", f"bytes {start}-{end}/{size}"),
        ("Accept-Ranges", "bytes"),
        ("ETag", etag),
        ("Last-Modified", key.last_modified_RFC1123),
    ]
    return "206 Partial Content", headers, body

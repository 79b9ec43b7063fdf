"""The emulators' big-object code at unit level: moto's multipart complete done on disk gives moto's
own answer (same bytes, ETag, checksum) for each checksum kind; the patch refuses a moto whose code
changed; a composite's crc32c combined from its sources' is the crc32c of its bytes."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from airflow_cloudtrain.emulator.aws import bigkeys
from airflow_cloudtrain.emulator.gcp.gcs_disk import composed_crc32c

MiB = 1024 * 1024


def _upload(metadata: dict[str, str]) -> tuple[Any, list[tuple[int, str]], bytes]:
    from moto.s3.models import FakeMultipart
    from requests.structures import CaseInsensitiveDict

    upload = FakeMultipart("ckpt.bin", CaseInsensitiveDict(metadata), "123456789012", "us-east-1")
    pieces = [os.urandom(5 * MiB), os.urandom(5 * MiB + 3), os.urandom(1000)]
    body = [(n + 1, upload.set_part(n + 1, piece).etag) for n, piece in enumerate(pieces)]
    return upload, body, b"".join(pieces)


@pytest.mark.parametrize(
    "metadata",
    [
        {},  # boto3's default: CRC64NVME, FULL_OBJECT
        {"x-amz-checksum-algorithm": "CRC32"},  # COMPOSITE
        {"x-amz-checksum-algorithm": "SHA256", "x-amz-checksum-type": "FULL_OBJECT"},
        {"x-amz-checksum-algorithm": "CRC32C", "x-amz-checksum-type": "FULL_OBJECT"},
    ],
)
def test_complete_on_disk_answers_as_moto_does(metadata: dict[str, str]) -> None:
    bigkeys.install()
    upload, body, data = _upload(metadata)
    theirs = bigkeys.moto_complete(upload, iter(body))
    joined, etag, checksum = bigkeys.complete(upload, iter(body))
    assert (etag, checksum) == theirs[1:]
    joined.buffer.seek(0)
    assert joined.buffer.read() == theirs[0] == data and len(joined) == len(data)
    assert joined.buffer._rolled  # past moto's ~5 MiB key buffer: a file, not memory


def test_complete_rejects_what_moto_rejects() -> None:
    from moto.s3.exceptions import InvalidPart

    bigkeys.install()
    upload, body, _ = _upload({})
    with pytest.raises(InvalidPart):
        bigkeys.complete(upload, iter([(1, body[0][1]), (2, '"0000"')]))


def test_a_changed_moto_stops_the_emulator_with_the_function_named() -> None:
    found = dict(bigkeys._EXPECTED, **{"FakeMultipart.complete": "something else"})
    with pytest.raises(bigkeys.MotoChanged, match=r"FakeMultipart\.complete changed"):
        bigkeys._check(found)
    bigkeys._check(dict(bigkeys._EXPECTED))  # the installed moto is the one it was written against


def test_a_composite_crc32c_is_combined_from_its_sources() -> None:
    import google_crc32c

    def crc(data: bytes) -> str:
        return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()

    pieces = [os.urandom(n) for n in (1, 1000, 5 * MiB + 3, 0, 77)]
    assert composed_crc32c([(crc(p), len(p)) for p in pieces]) == crc(b"".join(pieces))

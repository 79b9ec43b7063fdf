"""Big S3 objects on disk in moto: a completed multipart upload streamed into its key's spooled file.

moto keeps each object in a ``tempfile.SpooledTemporaryFile`` (``FakeKey._value_buffer``; in memory up
to ``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE``, ~5 MiB, on disk past it), so a 16 MiB part already spills to
disk. But ``FakeMultipart.complete`` joins every part's bytes into one ``bytearray``, copies it to
``bytes``, and (for a ``FULL_OBJECT`` checksum, boto3's default CRC64NVME) keeps a second whole copy
for the checksum: a 4 GB upload took moto past 11 GB, a 16 GB one cannot complete on a 24 GB machine.
(moto then disposes of the parts' files itself, when it drops the upload.)

``install()`` (called when the emulator's moto server starts) changes two things, nothing else:

* ``FakeMultipart.complete`` validates the parts and builds the ETag and the checksum exactly as
  moto does, but copies the parts 16 MiB at a time into one new spooled file (``JoinedParts``) and
  computes the checksum in the same pass (``_RunningChecksum``: moto's ``compute_checksum``, same
  algorithms and fallbacks, fed piece by piece).
* ``FakeKey.value``'s setter, given a ``JoinedParts``, adopts that file as the key's buffer (any
  other value: moto's own setter).

Ranged GETs are already O(range) (``ranges``). The patch relies on moto's code as of the version it
was written against: ``install`` compares the source of each function it replaces or leans on
with a digest taken from that version and refuses to start on a mismatch (``MotoChanged``) rather
than emulate an S3 that silently differs.
"""

from __future__ import annotations

import binascii
import codecs
import hashlib
import inspect
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CHUNK = 16 * 1024 * 1024
# sha256 of inspect.getsource(...) of the moto 5.2.5 code this module replaces or copies (see install)
_EXPECTED = {
    "FakeMultipart.complete": "a5cd01f2f2f28c9b2173f99751e579d94e23cb6646b609f036aa3564b286f961",
    "FakeKey.value.fset": "519ac4d9ad6adcd8296e44db5f195550d06c81897d5d7de2e0c76b7632527ba5",
    "MultipartChecksumBuilder": "cc821d54f56479890472f8f73a5bfcbaead249e770d7a56c8dc042e6b2aad401",
    "utils.compute_checksum": "30a7569e3106abf86e21ed6b6166e41068c61c38d2ec533832c78a686d4fdf43",
    "S3Backend.complete_multipart_upload": "f16c9a08e5db3f4fddba3a9dcb82f0ed5889e482cff8106c47d7cc7c04309748",
}
_installed = False
moto_complete: Any = None  # moto's own FakeMultipart.complete, kept by install() (tests compare)


class MotoChanged(RuntimeError):
    """moto's internals that ``bigkeys`` relies on are not the ones it was written against."""


@dataclass
class JoinedParts:
    """A completed multipart upload's bytes: the parts copied, in order, into one spooled file."""

    buffer: Any  # tempfile.SpooledTemporaryFile, on disk past moto's key buffer size
    size: int

    def __len__(self) -> int:
        return self.size


class _RunningChecksum:
    """moto's ``compute_checksum`` fed piece by piece: same algorithms, same fallbacks, same bytes."""

    def __init__(self, algorithm: str) -> None:
        from moto.core.compat import HAS_CRC32C, HAS_CRT

        self.algorithm = algorithm
        self.value = 0
        self.hash: Any = None
        if algorithm in ("SHA1", "CRC32", "CRC32C", "CRC64NVME"):
            self.kind = {"SHA1": "sha1", "CRC32": "crc32"}.get(algorithm, "crc32")
            if algorithm == "CRC32C" and HAS_CRC32C:
                self.kind = "crc32c"
            if algorithm == "CRC64NVME" and HAS_CRT:
                self.kind = "crc64nvme"
        else:
            self.kind = "sha256"
        if self.kind in ("sha1", "sha256"):
            self.hash = hashlib.new(self.kind, usedforsecurity=False)

    def update(self, data: bytes) -> None:
        if self.hash is not None:
            self.hash.update(data)
        elif self.kind == "crc32c":
            import crc32c

            self.value = crc32c.crc32c(data, self.value)
        elif self.kind == "crc64nvme":
            from awscrt import checksums

            self.value = checksums.crc64nvme(data, self.value)
        else:
            self.value = binascii.crc32(data, self.value)

    def digest(self) -> bytes:
        if self.hash is not None:
            return bytes(self.hash.digest())
        return self.value.to_bytes(8 if self.kind == "crc64nvme" else 4, "big")


def _chunks(key: Any) -> Iterator[bytes]:
    """A key's bytes from its spooled file, ``CHUNK`` at a time (under the key's lock)."""
    with key.lock:
        key._value_buffer.seek(0)
        while block := key._value_buffer.read(CHUNK):
            yield block


def complete(self: Any, body: Iterator[tuple[int, str]]) -> tuple[JoinedParts, str, tuple[str, str, int]]:
    """``FakeMultipart.complete`` with the parts copied into a spooled file, not joined in memory
    (moto's checks, ETag and checksum, the checksum computed in the same pass)."""
    import base64

    from moto.s3.exceptions import EntityTooSmall, InvalidPart, MalformedXML
    from moto.s3.models import S3_UPLOAD_PART_MIN_SIZE
    from moto.s3.utils import compute_checksum
    from moto.settings import get_s3_default_key_buffer_size
    from moto.utilities.utils import md5_hash

    algorithm: str = self.metadata.get("x-amz-checksum-algorithm") or "CRC64NVME"
    kind: str = self.metadata.get("x-amz-checksum-type") or (
        "FULL_OBJECT" if algorithm == "CRC64NVME" else "COMPOSITE"
    )
    decode_hex = codecs.getdecoder("hex_codec")
    md5s, composite, running = bytearray(), bytearray(), _RunningChecksum(algorithm)
    parts: list[Any] = []
    joined = tempfile.SpooledTemporaryFile(get_s3_default_key_buffer_size())  # noqa: SIM115 (the key keeps it)
    for pn, etag in body:
        part = self.parts.get(pn)
        part_etag = None
        if part is not None:
            part_etag = part.etag.replace('"', "")
            etag = etag.replace('"', "")
        if part is None or part_etag != etag:
            raise InvalidPart()
        if parts and parts[-1].contentsize < S3_UPLOAD_PART_MIN_SIZE:
            raise EntityTooSmall()
        md5s.extend(decode_hex(part_etag)[0])  # type: ignore[arg-type]
        part_sum = _RunningChecksum(algorithm)
        for block in _chunks(part):
            joined.write(block)
            (part_sum if kind == "COMPOSITE" else running).update(block)
        if kind == "COMPOSITE":
            composite.extend(part_sum.digest())
        parts.append(part)
    if not parts:
        raise MalformedXML
    full_etag = md5_hash()
    full_etag.update(bytes(md5s))
    if kind == "COMPOSITE":
        checksum = (kind, compute_checksum(bytes(composite), algorithm).decode(), len(parts))
    else:
        checksum = (kind, base64.b64encode(running.digest()).decode(), 1)
    size = sum(p.contentsize for p in parts)
    return JoinedParts(joined, size), f"{full_etag.hexdigest()}-{len(parts)}", checksum


def source_digest(obj: Any) -> str:
    """sha256 of a piece of moto's source: the emulator changes moto's code only where it matches the
    version checked (here, ``server._tags_by_resource_id``, ``sqs_receive``)."""
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


def _check(found: dict[str, str]) -> None:
    """Raise ``MotoChanged`` naming each piece of moto whose source is not the expected one."""
    import moto

    changed = [name for name, digest in _EXPECTED.items() if found.get(name) != digest]
    if changed:
        raise MotoChanged(
            f"moto {moto.__version__}: {', '.join(changed)} changed since the version "
            "airflow_cloudtrain.emulator.aws.bigkeys was written against (moto 5.2.5); re-check the "
            "patch against the new code and update its digests"
        )


def install() -> None:
    """Patch moto's S3 models as the module doc says (once per process); ``MotoChanged`` if its code
    is not the code this was written against."""
    global _installed, moto_complete
    if _installed:
        return
    from moto.s3 import models, utils

    value: Any = vars(models.FakeKey)["value"]  # the property object itself
    _check(
        {
            "FakeMultipart.complete": source_digest(models.FakeMultipart.complete),
            "FakeKey.value.fset": source_digest(value.fset),
            "MultipartChecksumBuilder": source_digest(models.MultipartChecksumBuilder),
            "utils.compute_checksum": source_digest(utils.compute_checksum),
            "S3Backend.complete_multipart_upload": source_digest(models.S3Backend.complete_multipart_upload),
        }
    )
    plain_setter = value.fset

    def set_value(self: Any, new_value: Any) -> None:
        if not isinstance(new_value, JoinedParts):
            plain_setter(self, new_value)
            return
        self._value_buffer.close()
        self._value_buffer = new_value.buffer  # the joined file becomes the key's own
        self.contentsize = new_value.size

    moto_complete = models.FakeMultipart.complete
    setattr(models.FakeMultipart, "complete", complete)  # noqa: B010 (typed as moto's own method)
    setattr(models.FakeKey, "value", property(value.fget, set_value))  # noqa: B010
    _installed = True


def on_disk(bucket: str, key: str) -> bool:
    """Whether moto keeps ``s3://bucket/key`` in a file (its spooled buffer rolled over), not in memory."""
    from moto.s3.models import s3_backends

    from airflow_cloudtrain.emulator.aws.backend import ACCOUNT_ID

    found = s3_backends[ACCOUNT_ID]["aws"].get_object(bucket, key)
    return bool(found is not None and getattr(found._value_buffer, "_rolled", False))

"""Big objects of the emulated GCS on disk: files in a temp dir of the server, read by range.

``gcp-storage-emulator`` in memory keeps every object as ``bytes`` in one dict (its ``_FileStore``),
appends to a resumable upload with ``bytes +=`` (the whole upload copied on every chunk), and answers
a ranged GET by slicing the whole object: a 4 or 16 GB checkpoint (its composite parts, the
intermediate composes, and the final object) cannot be held on a 24 GB machine. Here:

* ``DiskStore`` (the package's store in memory mode, subclassed) keeps an object larger than
  ``threshold`` as a ``DiskBlob``: a list of files (extents) under the server's temp dir. Storing a
  blob under a new name (a copy, a rewrite, a compose, a soft delete, the end of a resumable upload)
  hard-links its files instead of copying them, so a compose costs what it costs on GCS (no bytes
  moved) and each object owns its own links: removing one never breaks another.
* ``DiskBlob`` answers what the package's handlers ask of ``bytes``: ``len``, a slice (a ranged GET:
  only that range is read, by ``os.pread``), and a whole download streamed in pieces
  (``StreamingWriter``); md5 and crc32c, where not known already, are computed in one streaming pass
  and kept with the blob.
* ``append`` grows a resumable upload's file in place, its md5 and crc32c with it. It is the only
  write into an existing file, and a session's file is linked to nothing until the upload ends.
* A big compose gets its crc32c from its sources' (``crc32c_combine``) and no md5Hash, as on GCS;
  a whole-object GET of it is sent the md5 its hash header names (``Md5OnWholeReads``).

Small objects stay ``bytes`` in memory, as before. Nothing here is kept past the server: its temp dir
is removed at ``GcsServer.stop``; a saved emulator state (``emulator.state``) pickles a blob as its bytes.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

THRESHOLD = 4 * 1024 * 1024  # below S3's smallest multipart part, as moto's ~5 MiB key buffer
CHUNK = 16 * 1024 * 1024


class DiskBlob:
    """An object's bytes in files: ``extents`` ``[(path, length)]`` in order; ``temp`` names the
    extents that belong to no object yet (written for a compose) and go once it is stored."""

    def __init__(self, extents: list[tuple[str, int]], temp: frozenset[str] = frozenset()) -> None:
        self.extents = extents
        self.temp = temp
        self.size = sum(length for _, length in extents)
        self.sums: dict[str, str] = {}  # "md5", "crc32c" (base64), filled by checksum()
        self.running: Any = None  # (md5, crc32c) hash objects of an upload appended to (``append``)

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __getitem__(self, where: slice) -> bytes:
        start, stop, step = where.indices(self.size)
        if step != 1:
            raise ValueError("DiskBlob slices have no step")
        return b"".join(self.pieces(start, stop))

    def pieces(self, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
        """The bytes from ``start`` to ``stop``, ``CHUNK`` at most at a time, read from the files."""
        stop = self.size if stop is None else min(stop, self.size)
        offset = 0
        for path, length in self.extents:
            lo, hi = max(start, offset), min(stop, offset + length)
            if lo < hi:
                fd = os.open(path, os.O_RDONLY)
                try:
                    at = lo - offset
                    while at < hi - offset:
                        block = os.pread(fd, min(CHUNK, hi - offset - at), at)
                        if not block:
                            raise OSError(f"{path}: ends before {length} bytes")
                        yield block
                        at += len(block)
                finally:
                    os.close(fd)
            offset += length

    def checksum(self, kind: str) -> str:
        """``"md5"`` or ``"crc32c"`` (base64, as GCS writes them): both in one pass over the files
        when one is missing, kept (a compose knows its crc32c without reading: ``crc32c_combine``)."""
        if kind not in self.sums:
            import google_crc32c

            md5, crc = hashlib.md5(usedforsecurity=False), google_crc32c.Checksum()
            for block in self.pieces():
                md5.update(block)
                crc.update(block)
            found = {"md5": md5.digest(), "crc32c": crc.digest()}
            for name, digest in found.items():
                self.sums.setdefault(name, base64.b64encode(digest).decode("ascii"))
        return self.sums[kind]

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return bytes, (self[:],)  # a saved state carries the bytes, not paths that will be gone


class StreamingWriter:
    """A request handler's ``wfile`` that writes a ``DiskBlob`` piece by piece (bytes as they are)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, data: Any) -> int:
        if not isinstance(data, DiskBlob):
            return int(self.raw.write(data))
        for block in data.pieces():
            self.raw.write(block)
        return data.size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


_CASTAGNOLI = 0x82F63B78  # CRC-32C, reflected


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def crc32c_combine(first: int, second: int, second_length: int) -> int:
    """The CRC-32C of A+B from CRC(A), CRC(B) and len(B) (zlib's ``crc32_combine``, Castagnoli's
    polynomial): how GCS knows a composite object's crc32c without reading it."""
    if second_length <= 0:
        return first
    matrix = [_CASTAGNOLI] + [1 << n for n in range(31)]  # appending one zero bit
    for _ in range(3):
        matrix = _gf2_square(matrix)  # two, four, eight zero bits: one zero byte
    while second_length:  # append len(B) zero bytes to A's CRC, a power of two at a time
        if second_length & 1:
            first = _gf2_times(matrix, first)
        second_length >>= 1
        matrix = _gf2_square(matrix)
    return first ^ second


def composed_crc32c(sources: list[tuple[str, int]]) -> str:
    """The base64 crc32c of the concatenation of ``sources`` ``[(base64 crc32c, length)]``."""
    crc = 0
    for encoded, length in sources:
        crc = crc32c_combine(crc, int.from_bytes(base64.b64decode(encoded), "big"), length)
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


class Md5OnWholeReads:
    """The package's storage, as its download handler sees it: a composite's missing ``md5Hash``
    (GCS gives composites none) computed for a whole-object GET, whose hash header names it."""

    def __init__(self, storage: Any, whole: bool) -> None:
        self._storage, self._whole = storage, whole

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    def get_file_obj(self, bucket: str, name: str) -> Any:
        obj = self._storage.get_file_obj(bucket, name)
        if obj.get("md5Hash") or not self._whole:
            return obj
        data = self._storage.get_file(bucket, name)
        md5 = data.checksum("md5") if isinstance(data, DiskBlob) else None
        return {**obj, "md5Hash": md5} if md5 else obj


def checksum_patches(objects: Any) -> None:
    """Make the package's ``_crc32c`` / ``_md5`` (what its ``_checksums`` calls) stream a blob."""
    if getattr(objects._md5, "streams_blobs", False):
        return
    plain = {"crc32c": objects._crc32c, "md5": objects._md5}

    def wrap(kind: str) -> Any:
        def checksum(content: Any) -> str:
            if isinstance(content, DiskBlob):
                return content.checksum(kind)
            return str(plain[kind](content))

        checksum.streams_blobs = True  # type: ignore[attr-defined]
        return checksum

    objects._crc32c, objects._md5 = wrap("crc32c"), wrap("md5")


def disk_store(base: type, threshold: int) -> Any:
    """A ``DiskStore``: the package's ``_FileStore`` class ``base`` (in memory), big objects on disk."""

    class DiskStore(base):
        def __init__(self) -> None:
            super().__init__(use_memory=True)
            self.threshold = threshold
            self.dir = tempfile.mkdtemp(prefix="cloudtrain-gcs-objects-")
            self._names = itertools.count()

        def _new_path(self) -> str:
            return os.path.join(self.dir, f"{next(self._names):012d}")

        def _file(self, content: bytes) -> str:
            path = self._new_path()
            with open(path, "wb") as handle:
                handle.write(content)
            return path

        def _adopt(self, blob: DiskBlob) -> DiskBlob:
            """The same bytes under links of their own (hard links: nothing is copied)."""
            extents = []
            for path, length in blob.extents:
                own = self._new_path()
                os.link(path, own)
                extents.append((own, length))
            for path in blob.temp:
                os.unlink(path)
            adopted = DiskBlob(extents)
            adopted.sums = blob.sums
            return adopted

        @staticmethod
        def _release(entry: Any) -> None:
            if isinstance(entry, DiskBlob):
                for path, _ in entry.extents:
                    os.unlink(path)

        def write_bytes(self, rel: str, content: Any) -> None:
            if isinstance(content, DiskBlob):
                content = self._adopt(content) if len(content) > self.threshold else content[:]
            elif len(content) > self.threshold:
                content = DiskBlob([(self._file(content), len(content))])
            old = self._files.get(self._norm(rel))
            super().write_bytes(rel, content)
            self._release(old)

        def remove_file(self, rel: str) -> None:
            old = self._files.get(self._norm(rel))
            super().remove_file(rel)
            self._release(old)

        def remove_tree(self, rel: str) -> None:
            before = dict(self._files)
            super().remove_tree(rel)
            for name, entry in before.items():
                if name not in self._files:
                    self._release(entry)

        def append(self, rel: str, content: bytes) -> DiskBlob:
            """Grow the file at ``rel`` (a resumable upload's, on disk from its first byte), its md5
            and crc32c kept up to date, so the upload's end reads nothing back."""
            import google_crc32c

            rel = self._norm(rel)
            entry = self._files.get(rel)
            if not isinstance(entry, DiskBlob):
                entry = DiskBlob([(self._file(entry or b""), len(entry or b""))])
            running = entry.running
            if running is None:
                running = (hashlib.md5(usedforsecurity=False), google_crc32c.Checksum())
                for block in entry.pieces():
                    running[0].update(block)
                    running[1].update(block)
            path, length = entry.extents[0]
            with open(path, "ab") as handle:
                handle.write(content)
            running[0].update(content)
            running[1].update(content)
            grown = DiskBlob([(path, length + len(content))])
            grown.running = running
            grown.sums = {
                "md5": base64.b64encode(running[0].digest()).decode("ascii"),
                "crc32c": base64.b64encode(running[1].digest()).decode("ascii"),
            }
            super().write_bytes(rel, grown)
            return grown

        def truncate(self, rel: str, size: int) -> DiskBlob:
            """Cut the appended file at ``rel`` to ``size`` bytes (a client sent more than its total)."""
            rel = self._norm(rel)
            path, _ = self._files[rel].extents[0]
            os.truncate(path, size)
            cut = DiskBlob([(path, size)])
            super().write_bytes(rel, cut)
            return cut

        def concat(self, pieces: list[Any]) -> DiskBlob:
            """One blob of ``pieces`` (blobs and bytes) in order; bytes go to new files, which the
            object it is stored as takes over (``_adopt``)."""
            extents: list[tuple[str, int]] = []
            temp: set[str] = set()
            for piece in pieces:
                if isinstance(piece, DiskBlob):
                    extents.extend(piece.extents)
                elif piece:
                    path = self._file(piece)
                    temp.add(path)
                    extents.append((path, len(piece)))
            return DiskBlob(extents, frozenset(temp))

        def close(self) -> None:
            shutil.rmtree(self.dir, ignore_errors=True)

    return DiskStore()

"""The agent's checkpoint sync: upload the job's newest complete checkpoint, restore it on a new instance.

Upload (``CheckpointSync.sync``; a chore every ``spec.checkpoint_interval_s``, then once more when the
job has ended, also after an interruption notice or the agent's SIGTERM stopped it): the newest
complete checkpoint of the job's checkpoint directory (``airflow_cloudtrain.contract.checkpoint.candidates``:
never ``.tmp`` / dot names, never an incomplete step directory) goes to ``checkpoints/<step>/...``,
and that step's ``MANIFEST.json`` (``runs.Manifest``: each file's path, size and sha256) is written
LAST, so a step without a manifest is an upload that never finished. Only the newest step is sent
(older ones are superseded), and only its files that are new or changed since the last round (kept:
size, mtime, inode and sha256 of what was sent). A step sent before whose files changed loses its
manifest first and gets it back after the files. A step this agent has not sent yet has its folder
cleared first (the leftovers of an agent killed mid-upload). A file replaced while it was uploading
makes the round skip the manifest; the next round sends it again. Uploads go through
``agent.retry.retry``. The manifest's ``saved_at`` is the newest mtime of the step's files (when the
job saved it). After each manifest written, ``last_manifest`` and ``last_round_s`` (how long that
round took: the agent's estimate of the final sync on a notice) are set and ``on_uploaded(manifest)``
is called; the runner reports it as ``RunStatus.checkpoint``.

Restore (``CheckpointSync.restore``, before the setup commands): the steps of ``checkpoints/`` that
have a manifest, highest first; a step's files are downloaded into a hidden staging folder of the
checkpoint directory and verified (size and sha256) before they move into place; a step whose
manifest is unreadable, whose files are missing or whose hashes do not match is skipped (noted in the
job log) and the next lower one tried. Restored step directories get their ``.complete`` marker.
Only steps newer than a complete checkpoint already in the directory (a persistent volume) are
restored.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_cloudtrain.contract import checkpoint, runs
from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")

STAGING_PREFIX = ".cloudtrain-restore-"


class CheckpointInvalid(Exception):
    """A checkpoint step of the run folder that cannot be restored (no manifest, bad hash, ...)."""


@dataclass(frozen=True)
class Sent:
    """What was uploaded for one local file: enough to tell a changed file without hashing it."""

    step: int
    size: int
    mtime_ns: int
    inode: int
    sha256: str


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_files(root: Path, entry: Path) -> list[Path]:
    """The files of one checkpoint (itself, or a step directory's files), skipped names left out."""
    if entry.is_file():
        return [entry]
    files = []
    for path in sorted(entry.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(checkpoint.skipped(part) for part in rel.parts):
            files.append(path)
    return files


def _safe_rel(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts and "\\" not in path


class CheckpointSync:
    """Checkpoint upload / restore between one local checkpoint directory and the run folder."""

    def __init__(
        self,
        folder: RunFolder,
        local_dir: str | os.PathLike[str],
        instance_id: str,
        note: Callable[[str], None] | None = None,
        call: Callable[[Callable[[], object], str], object] | None = None,
        on_uploaded: Callable[[runs.Manifest], None] | None = None,
    ) -> None:
        self.folder = folder
        self.local_dir = Path(local_dir)
        self.instance_id = instance_id
        self.note = note or (lambda message: log.info("%s", message))
        self.call = call or (lambda fn, what: retry(fn, what=what))
        self.sent: dict[str, Sent] = {}  # relative path -> what the run folder has of it
        self.sent_steps: set[int] = set()  # steps whose folder this agent (or its restore) wrote
        self.manifests: dict[int, str] = {}  # step -> the manifest text in the run folder
        self.uploads = 0  # files uploaded, for tests and notes
        self.on_uploaded = on_uploaded
        self.last_manifest: runs.Manifest | None = None  # the newest manifest this agent wrote
        self.last_round_s: float | None = None  # how long the round that wrote it took
        self._lock = threading.Lock()

    def uri(self, step: int) -> str:
        return runs.join(self.folder.uri, runs.checkpoint_prefix(step))

    # -- upload ----------------------------------------------------------------------------------
    def sync(self) -> int | None:
        """Upload the newest complete checkpoint if it is new or changed; returns its step, or None
        when there was nothing to send (or the checkpoint went away under us: the next round)."""
        with self._lock:
            try:
                return self._sync()
            except FileNotFoundError as err:  # the job pruned or replaced it meanwhile
                log.info("checkpoint sync: %s went away; next round", err.filename)
                return None

    def _sync(self) -> int | None:
        began = time.monotonic()
        found = checkpoint.candidates(self.local_dir)
        if not found:
            return None
        step, entry = found[-1]
        entries: list[dict[str, object]] = []
        changed: list[tuple[Path, str, os.stat_result, str]] = []
        saved_at: float | None = None
        for path in checkpoint_files(self.local_dir, entry):
            rel = path.relative_to(self.local_dir).as_posix()
            stat = path.stat()
            saved_at = stat.st_mtime if saved_at is None else max(saved_at, stat.st_mtime)
            prev = self.sent.get(rel)
            same = (
                prev is not None
                and prev.step == step
                and (prev.size, prev.mtime_ns, prev.inode) == (stat.st_size, stat.st_mtime_ns, stat.st_ino)
            )
            sha = prev.sha256 if same and prev is not None else sha256_file(path)
            if prev is None or prev.step != step or prev.sha256 != sha or prev.size != stat.st_size:
                changed.append((path, rel, stat, sha))
            elif not same:  # same bytes, new mtime: nothing to send, remember the new stat
                self.sent[rel] = Sent(step, stat.st_size, stat.st_mtime_ns, stat.st_ino, sha)
            entries.append({"path": rel, "size": stat.st_size, "sha256": sha})
        if not entries:
            return None
        entries.sort(key=lambda e: str(e["path"]))
        current = self.manifests.get(step)
        if not changed and current is not None and runs.Manifest.from_json(current).files == entries:
            return None  # the run folder has exactly this
        if step in self.sent_steps:
            self.call(lambda: self.folder.delete_key(runs.manifest_key(step)), "checkpoint manifest delete")
            self.manifests.pop(step, None)
        else:  # leftovers of an agent killed mid-upload would mix into this step
            self.call(
                lambda: self.folder.delete_prefix(runs.checkpoint_prefix(step)), "checkpoint folder clear"
            )
            self.sent_steps.add(step)
        for path, rel, _, _ in changed:
            key = runs.join(runs.checkpoint_prefix(step), rel)
            self.call(functools.partial(self.folder.upload_file, path, key), "checkpoint upload")
            self.uploads += 1
        for path, rel, stat, sha in changed:
            after = path.stat()
            if (after.st_size, after.st_mtime_ns, after.st_ino) != (
                stat.st_size,
                stat.st_mtime_ns,
                stat.st_ino,
            ):
                log.info("checkpoint %s changed while uploading; next round", rel)
                self.sent.pop(rel, None)
                return None
            self.sent[rel] = Sent(step, stat.st_size, stat.st_mtime_ns, stat.st_ino, sha)
        manifest = runs.Manifest(
            step=step,
            files=entries,
            created_at=time.time(),
            instance_id=self.instance_id,
            saved_at=saved_at,
        )
        text = manifest.to_json()
        self.call(lambda: self.folder.put_text(runs.manifest_key(step), text), "checkpoint manifest")
        self.manifests[step] = text
        self.last_manifest, self.last_round_s = manifest, time.monotonic() - began
        size = sum(int(str(e["size"])) for e in entries)
        self.note(
            f"checkpoint step {step} uploaded to {self.uri(step)} "
            f"({len(changed)} of {len(entries)} file(s) sent, {size} bytes)"
        )
        if self.on_uploaded is not None:
            try:
                self.on_uploaded(manifest)
            except Exception as err:  # reporting it must not make the upload look failed
                log.warning("checkpoint on_uploaded failed: %s: %s", type(err).__name__, err)
        return step

    # -- restore ---------------------------------------------------------------------------------
    def restore(self) -> int | None:
        """Put the newest verified checkpoint of the run folder into the local directory; its step."""
        self.local_dir.mkdir(parents=True, exist_ok=True)
        keys: Any = self.call(lambda: self.folder.list(runs.CHECKPOINTS_PREFIX + "/"), "checkpoint list")
        steps = sorted(
            {
                step
                for key in keys
                if (step := runs.checkpoint_step(key)) is not None and key == runs.manifest_key(step)
            },
            reverse=True,
        )
        local = checkpoint.candidates(self.local_dir)
        local_step = local[-1][0] if local else None
        for step in steps:
            if local_step is not None and step <= local_step:
                self.note(f"checkpoint step {local_step} already in {self.local_dir}; not restoring older")
                break
            try:
                self._restore(step)
            except CheckpointInvalid as err:
                self.note(f"skipping checkpoint step {step}: {err}")
                continue
            except Exception as err:
                self.note(f"skipping checkpoint step {step}: {type(err).__name__}: {err}")
                continue
            self.note(f"restored checkpoint step {step} from {self.uri(step)}")
            return step
        return None

    def _restore(self, step: int) -> None:
        text = self.call(lambda: self.folder.get_text(runs.manifest_key(step)), "checkpoint manifest read")
        if text is None:
            raise CheckpointInvalid("no manifest")
        try:
            manifest = runs.Manifest.from_json(str(text))
        except (ValueError, TypeError) as err:
            raise CheckpointInvalid(f"unreadable manifest ({err})") from err
        if manifest.step != step:
            raise CheckpointInvalid(f"its manifest says step {manifest.step}")
        if not manifest.files:
            raise CheckpointInvalid("its manifest lists no files")
        staging = self.local_dir / f"{STAGING_PREFIX}{step}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for entry in manifest.files:
                rel = entry["path"]
                if not _safe_rel(rel) or any(checkpoint.skipped(part) for part in Path(rel).parts):
                    raise CheckpointInvalid(f"unsafe path {rel!r} in its manifest")
                local = staging / rel
                key = runs.join(runs.checkpoint_prefix(step), rel)
                self.call(functools.partial(self.folder.download, key, local), "checkpoint download")
                size = local.stat().st_size
                if size != entry["size"]:
                    raise CheckpointInvalid(f"{rel} is {size} bytes, its manifest says {entry['size']}")
                if sha256_file(local) != entry["sha256"]:
                    raise CheckpointInvalid(f"{rel} does not match its sha256 in the manifest")
            tops = sorted({Path(entry["path"]).parts[0] for entry in manifest.files})
            for top in tops:
                dest = self.local_dir / top
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                elif dest.exists() or dest.is_symlink():
                    dest.unlink()
                os.replace(staging / top, dest)
                if dest.is_dir():
                    checkpoint.mark_complete(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for entry in manifest.files:  # what the run folder already has: not sent again
            path = self.local_dir / entry["path"]
            with contextlib.suppress(OSError):
                stat = path.stat()
                self.sent[entry["path"]] = Sent(
                    step, stat.st_size, stat.st_mtime_ns, stat.st_ino, entry["sha256"]
                )
        self.sent_steps.add(step)
        self.manifests[step] = str(text)

"""The agent's checkpoint sync: keep what the job saved in the run folder, put it back on a new instance.

Upload (``CheckpointSync.sync``; a chore every ``spec.checkpoint_interval_s``, then once more when the
job has ended, also after an interruption notice or the agent's SIGTERM stopped it):

1. **Look.** The checkpoint directory is listed (size, mtime, inode of every file) and compared
   with the previous round's look; when a file written in place changed since, it is listed twice
   more, ``settle_s`` apart. A file is *stable* when two looks agree and no process has it open for
   writing (``/proc``); a layout complete by its names (a rename, a marker, a state file written
   last) needs only to be closed, so it goes up without waiting. After the
   job was killed (a signal, not its own exit) a file it had open for writing when last seen alive
   is taken as torn, and so is a file written in place that it changed after that look: nothing
   tells whether such a write finished (a layout complete by its names, a rename or a state file
   written last, is not; a step-named file is, since its name cannot tell a rename from
   ``torch.save`` to the final name); the version the run folder has stays. The looks at a live
   job: one when it starts, each round's, ``job_stopping``'s right before the agent's SIGTERM, and
   one with the job frozen (SIGSTOP) right before the agent's SIGKILL, which is therefore exact. A
   kill from outside (the kernel's OOM killer, a crash) is judged by the last round's look: a save
   finished after it is given up for the version before, never guessed whole.
2. **Plan** (``contract.checkpoint_layouts.plan``): the newest complete checkpoint of each framework
   layout (TensorFlow, Lightning, Orbax, Hugging Face, our step names) and, with snapshots on, every
   other stable file.
3. **Upload a version.** Files whose bytes the previous version already has are not sent again (the
   manifest points at the old object); the rest go to ``checkpoints/<version>/``, read through hard
   links to the files the plan judged (``.cloudtrain-upload-<version>/``, removed after the round), so
   the job may prune them or save over their names meanwhile; the manifest is written LAST. A file
   written in place while it was uploading makes the round skip the manifest; the next round tries
   again. Then versions older than the two newest are deleted (``KEEP_VERSIONS``), except
   objects a kept manifest still points at. What was left out goes to ``checkpoints/LEFT_OUT.json``.

Restore (``CheckpointSync.restore``, before the setup commands): versions with a manifest, newest
first; every file is downloaded into a hidden staging folder, verified (size and sha256), then moved
into place; a version that fails is skipped (noted in the job log) and the next older one tried. The
framework's directories are restored as the framework wrote them (no marker files added), except
our own convention's step directories, which get the ``.complete`` marker that made them complete.
When nothing is restored, ``restore_note`` says why (and what the previous attempt left out).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
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
from airflow_cloudtrain.contract.checkpoint_layouts import STEPS, Look, Plan, plan
from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")

STAGING_PREFIX = ".cloudtrain-restore-"
UPLOAD_PREFIX = ".cloudtrain-upload-"  # the hard links a round uploads from (see ``_pin``)
OURS = (STAGING_PREFIX, UPLOAD_PREFIX)  # our own folders in the checkpoint directory: never looked at
SETTLE_S = 1.0  # between the two looks of a round
KEEP_VERSIONS = 2  # complete versions kept in the run folder: the newest, and one to fall back to
# a gang whose every rank keeps its own (``checkpoint_ranks="all"``): more, so that a rank whose
# uploads lag a few saves behind the others still shares a step with them (``agent.gang.common_steps``)
KEEP_VERSIONS_ALL_RANKS = 5
FORMAT = 2  # Manifest.version written by this agent


class CheckpointInvalid(Exception):
    """A checkpoint version of the run folder that cannot be restored (no manifest, bad hash, ...)."""


@dataclass(frozen=True)
class Restored:
    """What ``restore`` put into the checkpoint directory."""

    version: int
    step: int | None
    layout: str
    saved_at: float | None

    def record(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "step": self.step,
            "layout": self.layout,
            "saved_at": self.saved_at,
            "source": "manifest",
        }


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def look_of(stat: os.stat_result) -> Look:
    """What of a file's stat tells that it changed (size, mtime, inode)."""
    return Look(stat.st_size, stat.st_mtime_ns, stat.st_ino)


def look(root: Path) -> dict[str, Look]:
    """Every file below ``root`` (symlinks followed: Lightning's ``save_last="link"``) by its posix
    path relative to ``root``, with what tells a changed file; the restore's staging folder left out."""
    found: dict[str, Look] = {}
    if not root.is_dir():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(OURS)]
        for name in filenames:
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):  # gone between the listing and the stat
                found[path.relative_to(root).as_posix()] = look_of(path.stat())
    return found


def open_for_writing(root: Path) -> set[str]:
    """Files below ``root`` some process has open for writing (Linux ``/proc``; empty elsewhere or
    for processes we may not inspect)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return set()
    prefix = str(root.resolve()) + os.sep
    found: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(proc / pid / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(proc / pid / "fd" / fd)
                    if not target.startswith(prefix):
                        continue
                    flags = (proc / pid / "fdinfo" / fd).read_text().split("flags:", 1)[1].split()[0]
                    if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
                        found.add(target[len(prefix) :].replace(os.sep, "/"))
    return found


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie not yet reaped does not); True where ``/proc`` cannot tell."""
    stat = Path("/proc") / str(pid) / "stat"
    if not Path("/proc/self").is_dir():
        return True
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _safe_rel(path: str) -> bool:
    parts = Path(path).parts
    return bool(parts) and not Path(path).is_absolute() and ".." not in parts and "\\" not in path


def _read(root: Path) -> Callable[[str], bytes | None]:
    def read(rel: str) -> bytes | None:
        try:
            return (root / rel).read_bytes()
        except OSError:
            return None

    return read


class CheckpointSync:
    """Checkpoint upload / restore between one local checkpoint directory and the run folder."""

    def __init__(
        self,
        folder: RunFolder,
        local_dir: str | os.PathLike[str],
        instance_id: str,
        note: Callable[[str], None] | None = None,
        call: Callable[[Callable[[], object], str], object] | None = None,
        on_uploaded: Callable[[int, runs.Manifest], None] | None = None,
        snapshots: bool = True,
        settle_s: float = SETTLE_S,
        dcp_shards: bool = False,
        keep_versions: int = KEEP_VERSIONS,
    ) -> None:
        self.folder = folder
        self.keep_versions = keep_versions
        self.dcp_shards = dcp_shards  # a gang node other than DCP's coordinator (``checkpoint_layouts``)
        self._merged: set[str] = set()  # files ``merge`` added from other ranks: never uploaded here
        self.local_dir = Path(local_dir)
        self.instance_id = instance_id
        self.note = note or (lambda message: log.info("%s", message))
        self.call = call or (lambda fn, what: retry(fn, what=what))
        self.on_uploaded = on_uploaded
        self.snapshots = snapshots
        self.settle_s = settle_s
        self.uploads = 0  # files uploaded, for tests and notes
        self.last_manifest: runs.Manifest | None = None  # the newest manifest this agent wrote
        self.last_round_s: float | None = None  # how long the round that wrote it took
        self.restored: Restored | None = None
        self.restore_note: str | None = None  # why nothing was restored (a relaunch's warning)
        self._versions: dict[int, runs.Manifest] = {}  # complete versions in the run folder we know
        self._next: int | None = None  # the version the next upload writes
        self._hashes: dict[str, tuple[Look, str]] = {}  # rel -> (look, sha256) already computed
        self._previous_look: dict[str, Look] | None = None
        self._job_look: dict[str, Look] = {}  # the last look while the job was alive
        self._job_writing: set[str] = set()  # what it had open for writing then
        self._job_look_at = float("-inf")  # when that look began (monotonic)
        self._alive_lock = threading.Lock()  # never the round's lock: a stop must not wait for an upload
        self._ended: tuple[float, bool] | None = None  # (when the job ended, whether it was killed)
        self._job_pid: int | None = None  # the job's process, while it runs
        self._unreported_end = False  # this round looked after the job died, before ``job_ended``
        self._left_out_text: str | None = None
        self._warned_ignored = False
        self._lock = threading.Lock()

    def uri(self, version: int) -> str:
        return runs.join(self.folder.uri, runs.checkpoint_prefix(version))

    def job_started(self, pid: int) -> None:
        """The job's process: a look is trusted only if the job was still alive after it. The first
        look at the live job is taken now: what the restore put there, or an earlier job left, is not
        the killed job's write."""
        self._job_pid = pid
        self._look_alive()

    def job_stopping(self) -> None:
        """The agent is about to signal the job (a notice, a stop, max runtime; again with the job
        frozen before the SIGKILL): a last look at it alive. What it has open for writing at this
        moment is what a kill may tear; a write it finished after the last round's look (Hugging
        Face's ``trainer_state.json`` of the step just saved) is complete."""
        self._look_alive()

    def _look_alive(self) -> None:
        """Look now, and keep the look if the job was still alive after it."""
        taken = time.monotonic()
        seen, writing = look(self.local_dir), open_for_writing(self.local_dir)
        if self._job_pid is None or process_alive(self._job_pid):
            self._remember_alive(taken, seen, writing)

    def _remember_alive(self, taken: float, seen: dict[str, Look], writing: set[str]) -> None:
        with self._alive_lock:  # the newer look wins, whichever thread finishes first
            if taken >= self._job_look_at:
                self._job_look_at, self._job_look, self._job_writing = taken, seen, writing

    def job_ended(self, at: float, killed: bool) -> None:
        """The job is gone: ``killed`` when a signal ended it (not its own exit), which may have left
        a file half-written."""
        self._ended = (at, killed)

    # -- looking -----------------------------------------------------------------------------------
    def _stable(
        self, settle: bool
    ) -> tuple[dict[str, Look], Callable[[str], bool], Callable[[str], bool], Callable[[str], bool]]:
        """A look; what is stable (it agrees with the one before, not open for writing, not torn),
        what is closed (not open for writing, not torn open) and what the killed job changed after it
        was last seen alive. ``settle``: the look before is taken ``settle_s`` earlier (else it is the
        previous round's, which is all a layout complete by its names needs: no wait)."""
        taken = time.monotonic()
        if settle:
            first = look(self.local_dir)
            writing = open_for_writing(self.local_dir)
            time.sleep(self.settle_s)
            second = look(self.local_dir)
            writing |= open_for_writing(self.local_dir)
        else:
            first = self._previous_look or {}
            second = look(self.local_dir)
            writing = open_for_writing(self.local_dir)
        if self._ended is None and self._job_pid is not None and not process_alive(self._job_pid):
            # The job died after the look before (or during this one) and ``job_ended`` has not come
            # yet: a file it was writing is no longer open and may look stable, torn. This round
            # uploads nothing; the sync after ``job_ended`` judges with what the job had open.
            self._unreported_end = True
            self._previous_look = second
            return second, lambda rel: False, lambda rel: False, lambda rel: False
        if self._ended is None:
            self._remember_alive(taken, second, writing)
        self._previous_look = second
        torn_open: set[str] = set()  # open for writing the last time the killed job was seen alive
        torn_unseen: set[str] = set()  # changed by the killed job after that: a write maybe unfinished
        if self._ended is not None and self._ended[1]:
            for rel, seen in second.items():
                if rel in self._job_writing:
                    torn_open.add(rel)
                elif self._job_look.get(rel) != seen:
                    torn_unseen.add(rel)

        def closed(rel: str) -> bool:  # enough for a layout complete by its names (rename, state file)
            return rel not in writing and rel not in torn_open

        def stable(rel: str) -> bool:  # what a file written in place needs
            return first.get(rel) == second.get(rel) and closed(rel) and rel not in torn_unseen

        return second, stable, closed, torn_unseen.__contains__

    # -- upload ------------------------------------------------------------------------------------
    def sync(self) -> int | None:
        """Upload a new version when the directory holds a newer stable checkpoint; returns the step it
        holds (None also for a snapshot without a step: see ``last_manifest``), None when nothing new
        was sent (or a file went away under us: the next round)."""
        with self._lock:
            try:
                manifest = self._sync()
            except FileNotFoundError as err:  # the job pruned or replaced it meanwhile
                log.info("checkpoint sync: %s went away; next round", err.filename)
                return None
            return None if manifest is None else manifest.step

    def _known_versions(self) -> None:
        if self._next is not None:
            return
        keys: Any = self.call(lambda: self.folder.list(runs.CHECKPOINTS_PREFIX + "/"), "checkpoint list")
        versions = [v for key in keys if (v := runs.checkpoint_version(key)) is not None]
        self._next = max(versions, default=0) + 1

    def _plan(self, settle: bool, before: dict[str, Any]) -> tuple[dict[str, Look], Plan]:
        seen, stable, closed, torn = self._stable(settle)
        found = plan(
            [rel for rel in seen if rel not in self._merged],  # other ranks' files: theirs to upload
            stable,
            _read(self.local_dir),
            self.snapshots,
            kept=lambda rel: rel in before,
            closed=closed,
            torn=torn,
            mtime=lambda rel: seen[rel].mtime_ns if rel in seen else None,
            dcp_shards=self.dcp_shards,
        )
        return seen, found

    def _sync(self) -> runs.Manifest | None:
        began = time.monotonic()
        previous = self._newest()
        before = {str(e["path"]): e for e in previous[1].files} if previous else {}
        # Against the previous round's look first: files moved into place (or named complete by a
        # state file) need no wait; only a file written in place that changed since is looked at
        # again ``settle_s`` later.
        self._unreported_end = False
        seen, found = self._plan(False, before)
        if any("being written" in why for _, why in found.pending) and not self._unreported_end:
            seen, found = self._plan(True, before)
        if self._unreported_end:
            log.info("checkpoint sync: the job just ended; the sync after it judges its files")
            return None
        self._report_left_out(found, seen)
        if found.empty:
            return None
        self._known_versions()
        assert self._next is not None
        pinned = self.local_dir / f"{UPLOAD_PREFIX}{self._next}"
        for left in self.local_dir.glob(f"{UPLOAD_PREFIX}*"):  # an agent killed mid-round left them:
            shutil.rmtree(left, ignore_errors=True)  # on a persistent volume they would hold the space
        try:
            return self._upload(began, previous, before, seen, found, pinned)
        finally:
            shutil.rmtree(pinned, ignore_errors=True)

    def _pin(self, pinned: Path, rel: str, seen: Look | None) -> tuple[Path, os.stat_result] | None:
        """A hard link to the version of ``rel`` the plan judged complete, which the round hashes and
        uploads from: the job may then prune that checkpoint or move a newer one over its name while it
        goes up (a Trainer with ``save_total_limit=1`` whose saves come faster than one upload would
        otherwise never get one up). The file itself where no link can be made (another filesystem);
        with its stat. None when ``rel`` is gone or is no longer the file the plan saw: the next round."""
        path = self.local_dir / rel
        link = pinned / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, link)
        except FileNotFoundError:
            return None
        except OSError:  # EXDEV, EPERM, a filesystem without links: upload from the file itself
            link = path
        stat = link.stat()
        if seen is not None and look_of(stat) != seen:
            log.info("checkpoint sync: %s changed since it was judged complete; next round", rel)
            return None
        return link, stat

    def _upload(
        self,
        began: float,
        previous: tuple[int, runs.Manifest] | None,
        before: dict[str, Any],
        seen: dict[str, Look],
        found: Plan,
        pinned: Path,
    ) -> runs.Manifest | None:
        """Upload ``found`` as the next version (files pinned under ``pinned``); its manifest last."""
        assert self._next is not None
        version = self._next
        entries: list[dict[str, Any]] = []
        sends: list[tuple[str, Callable[[], None], Look | None]] = []
        saved_at: float | None = None
        sources: dict[str, Path] = {}
        for rel in found.files:
            pin = self._pin(pinned, rel, seen.get(rel))
            if pin is None:
                return None
            path, stat = pin
            sources[rel] = path
            now = look_of(stat)
            saved_at = max(saved_at or 0.0, stat.st_mtime)
            cached = self._hashes.get(rel)
            sha = cached[1] if cached and cached[0] == now else sha256_file(path)
            self._hashes[rel] = (now, sha)
            entry: dict[str, Any] = {"path": rel, "size": now.size, "sha256": sha}
            old = before.get(rel)
            if old is not None and old["sha256"] == sha and old["size"] == now.size:
                entry["key"] = self._key_of(previous, old)
            else:
                key = runs.join(runs.checkpoint_prefix(version), rel)
                sends.append((rel, functools.partial(self.folder.upload_file, path, key), now))
            entries.append(entry)
        for rel in found.keep:
            old = dict(before[rel])
            old["key"] = self._key_of(previous, before[rel])
            entries.append(old)
        for rel, data in sorted(found.generated.items()):
            sha = hashlib.sha256(data).hexdigest()
            entry = {"path": rel, "size": len(data), "sha256": sha}
            old = before.get(rel)
            if old is not None and old["sha256"] == sha:
                entry["key"] = self._key_of(previous, old)
            else:
                key = runs.join(runs.checkpoint_prefix(version), rel)
                sends.append((rel, functools.partial(self.folder.put_bytes, key, data), None))
            entries.append(entry)
        entries.sort(key=lambda e: str(e["path"]))
        units = [{"layout": u.layout, "step": u.step, "name": u.name} for u in found.units]
        if previous and _same(previous[1], entries, found.step):
            return None  # the run folder has exactly this
        self.call(
            lambda: self.folder.delete_prefix(runs.checkpoint_prefix(version)), "checkpoint folder clear"
        )  # leftovers of an agent killed while uploading this version
        for _rel, send, _ in sends:
            self.call(send, "checkpoint upload")
            self.uploads += 1
        for rel, _, sent in sends:
            if sent is None:
                continue
            if look_of(sources[rel].stat()) != sent:  # a link: only a write in place changes it
                log.info("checkpoint %s changed while uploading; next round", rel)
                self._hashes.pop(rel, None)
                return None
        for entry in entries:  # the default place needs no key
            if entry.get("key") == runs.join(runs.checkpoint_prefix(version), entry["path"]):
                del entry["key"]
        manifest = runs.Manifest(
            step=found.step,
            files=entries,
            created_at=time.time(),
            instance_id=self.instance_id,
            saved_at=saved_at,
            version=FORMAT,
            layout=found.layout,
            units=units,
        )
        text = manifest.to_json()
        self.call(lambda: self.folder.put_text(runs.manifest_key(version), text), "checkpoint manifest")
        self._versions[version] = manifest
        self._next = version + 1
        self.last_manifest, self.last_round_s = manifest, time.monotonic() - began
        if self.on_uploaded is not None:  # first: a checkpoint the log names is in the status too
            try:
                self.on_uploaded(version, manifest)
            except Exception as err:  # reporting it must not make the upload look failed
                log.warning("checkpoint on_uploaded failed: %s: %s", type(err).__name__, err)
        size = sum(int(e["size"]) for e in entries)
        what = f"step {found.step}" if found.step is not None else "snapshot"
        self.note(
            f"checkpoint {what} uploaded to {self.uri(version)} "
            f"({found.layout}: {len(sends)} of {len(entries)} file(s) sent, {size} bytes)"
        )
        self._prune()
        return manifest

    def _newest(self) -> tuple[int, runs.Manifest] | None:
        if not self._versions:
            return None
        version = max(self._versions)
        return version, self._versions[version]

    @staticmethod
    def _key_of(previous: tuple[int, runs.Manifest] | None, entry: dict[str, Any]) -> str:
        if entry.get("key"):
            return str(entry["key"])
        assert previous is not None
        return runs.join(runs.checkpoint_prefix(previous[0]), str(entry["path"]))

    def _prune(self) -> None:
        """Delete versions older than the ``keep_versions`` newest complete ones, except the objects
        a kept manifest points at. Failures only leave more behind for the run folder's teardown."""
        kept = sorted(self._versions)[-self.keep_versions :]
        oldest = kept[0]
        wanted = {
            str(e.get("key") or runs.join(runs.checkpoint_prefix(v), str(e["path"])))
            for v in kept
            for e in self._versions[v].files
        } | {runs.manifest_key(v) for v in kept}
        try:
            keys: Any = self.folder.list(runs.CHECKPOINTS_PREFIX + "/")
            stale = [
                k
                for k in keys
                if (v := runs.checkpoint_version(k)) is not None and v < oldest and k not in wanted
            ]
            manifests = [k for k in stale if k.endswith("/" + runs.MANIFEST_NAME)]
            for key in manifests + [k for k in stale if k not in manifests]:  # manifests first
                self.folder.delete_key(key)
        except Exception as err:
            log.info("checkpoint prune: %s: %s", type(err).__name__, err)
        for version in [v for v in self._versions if v < oldest]:
            del self._versions[version]

    def _report_left_out(self, found: Plan, seen: dict[str, Look]) -> None:
        """``LEFT_OUT.json`` when the directory holds something not kept (for the next attempt), and
        one warning when snapshots are off and files match no layout."""
        if not self.snapshots and not self._warned_ignored:
            loose = [what for what, why in found.ignored if "snapshots are off" in why]
            if loose:
                self._warned_ignored = True
                self.note(
                    f"WARNING: {len(loose)} file(s) in the checkpoint directory match no checkpoint "
                    f"layout and are not kept (checkpoint_snapshots is off): {', '.join(loose[:5])}"
                )
        record = {
            "instance_id": self.instance_id,
            "files": sorted(seen)[:50],
            "pending": [list(p) for p in found.pending[:20]],
            "ignored": [list(p) for p in found.ignored[:20]],
        }
        off = [p for p in found.ignored if "snapshots are off" in p[1]]
        if not found.pending and not off and (not found.empty or not seen):
            record = {}  # everything there is kept (temporary names aside), or there is nothing
        text = json.dumps(record, sort_keys=True) if record else ""
        if text == (self._left_out_text or ""):
            return
        try:
            if text:
                self.folder.put_text(runs.LEFT_OUT_KEY, json.dumps({**record, "at": time.time()}))
            else:
                self.folder.delete_key(runs.LEFT_OUT_KEY)
            self._left_out_text = text
        except Exception as err:
            log.info("checkpoint left-out record: %s: %s", type(err).__name__, err)

    # -- restore -----------------------------------------------------------------------------------
    def restore(self, steps: set[int] | None = None) -> Restored | None:
        """Put the newest verified checkpoint version of the run folder into the local directory;
        with ``steps``, the newest of those steps (a gang's ranks agreeing on one, ``agent.gang``)."""
        self.local_dir.mkdir(parents=True, exist_ok=True)
        keys: Any = self.call(lambda: self.folder.list(runs.CHECKPOINTS_PREFIX + "/"), "checkpoint list")
        all_versions = [v for key in keys if (v := runs.checkpoint_version(key)) is not None]
        self._next = max(all_versions, default=0) + 1
        versions = sorted(runs.manifest_versions(list(keys)), reverse=True)
        failed: list[str] = []
        for version in versions:
            try:
                manifest, text = self._read_manifest(version)
                if steps is not None and manifest.step not in steps:
                    continue  # a step some other rank lacks
                if self._local_is_newer(manifest):
                    self.note(
                        f"the checkpoint directory {self.local_dir} already holds a checkpoint as new as "
                        f"version {version}; not restoring"
                    )
                    self.restore_note = "the checkpoint directory already held a newer checkpoint"
                    return None
                self._restore(version, manifest)
            except CheckpointInvalid as err:
                self.note(f"skipping checkpoint version {version}: {err}")
                failed.append(f"version {version}: {err}")
                continue
            except Exception as err:
                self.note(f"skipping checkpoint version {version}: {type(err).__name__}: {err}")
                failed.append(f"version {version}: {type(err).__name__}")
                continue
            self._versions[version] = manifest
            self.restored = Restored(version, manifest.step, manifest.layout, manifest.saved_at)
            what = f"step {manifest.step}" if manifest.step is not None else "snapshot"
            self.note(f"restored checkpoint {what} from {self.uri(version)} ({manifest.layout})")
            return self.restored
        self.restore_note = self._nothing_restored(failed)
        return None

    def _nothing_restored(self, failed: list[str]) -> str:
        """Why nothing was restored, naming what the previous attempt left out when it said."""
        if failed:
            return "no checkpoint version could be verified (" + "; ".join(failed[:3]) + ")"
        text = None
        with contextlib.suppress(Exception):
            text = self.folder.get_text(runs.LEFT_OUT_KEY)
        try:
            record = json.loads(text) if text else {}
        except ValueError:
            record = {}
        if record:
            files = ", ".join(record.get("files") or []) or "nothing"
            why = "; ".join(f"{what}: {reason}" for what, reason in (record.get("pending") or [])[:3])
            why = why or "; ".join(f"{what}: {reason}" for what, reason in (record.get("ignored") or [])[:3])
            return f"the previous attempt's checkpoint directory held {files}, none of it kept ({why})"
        return "no checkpoint was ever uploaded: the job wrote nothing into $CLOUDTRAIN_CHECKPOINT_DIR"

    def _read_manifest(self, version: int) -> tuple[runs.Manifest, str]:
        text = self.call(lambda: self.folder.get_text(runs.manifest_key(version)), "checkpoint manifest read")
        if text is None:
            raise CheckpointInvalid("no manifest")
        try:
            manifest = runs.Manifest.from_json(str(text))
        except (ValueError, TypeError) as err:
            raise CheckpointInvalid(f"unreadable manifest ({err})") from err
        if manifest.version < FORMAT and manifest.step != version:
            raise CheckpointInvalid(f"its manifest says step {manifest.step}")
        if not manifest.files:
            raise CheckpointInvalid("its manifest lists no files")
        return manifest, str(text)

    def _local_is_newer(self, manifest: runs.Manifest) -> bool:
        """A persistent checkpoint directory that already holds what the version has, or newer."""
        local = look(self.local_dir)
        if not local:
            return False
        found = plan(local, lambda rel: True, _read(self.local_dir), self.snapshots)
        if manifest.step is not None:  # loose files alone (a tokenizer) are no step checkpoint
            return found.step is not None and found.step >= manifest.step
        newest = max(seen.mtime_ns for seen in local.values()) / 1e9
        return manifest.saved_at is not None and newest >= manifest.saved_at

    def _restore(self, version: int, manifest: runs.Manifest) -> None:
        staging = self.local_dir / f"{STAGING_PREFIX}{version}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            for entry in manifest.files:
                self._fetch(self.folder, version, entry, staging)
            ours = {
                str(u.get("name", "")).rstrip("/")
                for u in manifest.units or [{"layout": STEPS, "name": "*"}]
                if u.get("layout") == STEPS
            }
            tops = sorted({Path(entry["path"]).parts[0] for entry in manifest.files})
            for top in tops:
                dest = self.local_dir / top
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                elif dest.exists() or dest.is_symlink():
                    dest.unlink()
                os.replace(staging / top, dest)
                ours_dir = (
                    dest.is_dir() and (top in ours or "*" in ours) and checkpoint.step_of(top) is not None
                )
                if ours_dir and not (dest / checkpoint.COMPLETE_MARKER).exists():
                    checkpoint.mark_complete(dest)  # our convention's step directory
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        # one time for every restored file: the order they were downloaded in is not the order the
        # framework wrote them in (a step file newer than ``last.ckpt`` reads as not yet in it)
        restored_ns = time.time_ns()
        for entry in manifest.files:  # what the run folder already has: not hashed or sent again
            with contextlib.suppress(OSError):
                os.utime(self.local_dir / entry["path"], ns=(restored_ns, restored_ns))
                seen = look_of((self.local_dir / entry["path"]).stat())
                self._hashes[entry["path"]] = (seen, entry["sha256"])

    def _fetch(self, folder: RunFolder, version: int, entry: dict[str, Any], staging: Path) -> None:
        """One file of a version into ``staging``, its path checked and its bytes verified."""
        rel = entry["path"]
        top = Path(rel).parts[0] if _safe_rel(rel) else ""
        # a temporary name is never uploaded as a top-level entry; inside a framework's
        # directory a hidden name can be the framework's (Orbax's zarr ``.zarray``)
        if not top or checkpoint.skipped(top) or any(part.startswith(OURS) for part in Path(rel).parts):
            raise CheckpointInvalid(f"unsafe path {rel!r} in its manifest")
        local = staging / rel
        key = entry.get("key") or runs.join(runs.checkpoint_prefix(version), rel)
        if runs.checkpoint_version(key) is None or not _safe_rel(key):
            raise CheckpointInvalid(f"{rel} points outside the checkpoints folder")
        self.call(functools.partial(folder.download, key, local), "checkpoint download")
        size = local.stat().st_size
        if size != entry["size"]:
            raise CheckpointInvalid(f"{rel} is {size} bytes, its manifest says {entry['size']}")
        if sha256_file(local) != entry["sha256"]:
            raise CheckpointInvalid(f"{rel} does not match its sha256 in the manifest")

    def merge(self, folder: RunFolder, step: int, layout: str) -> list[str]:
        """Add to the local directory the files of ``layout`` that another rank's version of ``step``
        (in ``folder``) has and this directory lacks, each verified: a gang's sharded DCP step needs
        every rank's shard and the coordinator's ``.metadata`` on every node. Returns what was added
        (nothing when that rank has no complete version of the step)."""
        keys: Any = self.call(lambda: folder.list(runs.CHECKPOINTS_PREFIX + "/"), "checkpoint list")
        for version in sorted(runs.manifest_versions(list(keys)), reverse=True):
            text = self.call(
                functools.partial(folder.get_text, runs.manifest_key(version)), "checkpoint manifest"
            )
            manifest = runs.Manifest.from_json(str(text)) if text else None
            if manifest is None or manifest.step != step:
                continue
            units = [str(u.get("name", "")) for u in manifest.units or [] if u.get("layout") == layout]
            wanted = [
                e
                for e in manifest.files
                if any(str(e["path"]).startswith(u) for u in units)
                and not (self.local_dir / str(e["path"])).exists()
            ]
            staging = self.local_dir / f"{STAGING_PREFIX}merge-{version}"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                for entry in wanted:
                    self._fetch(folder, version, entry, staging)
                for entry in wanted:
                    dest = self.local_dir / str(entry["path"])
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / str(entry["path"]), dest)
                    self._merged.add(str(entry["path"]))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return [str(e["path"]) for e in wanted]
        return []


def _same(manifest: runs.Manifest, entries: list[dict[str, Any]], step: int | None) -> bool:
    """Whether a new version would hold exactly what ``manifest`` holds."""

    def shape(files: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
        # a step directory's ``.complete`` marker: restore adds it where an old release left it out
        return sorted(
            (str(e["path"]), int(e["size"]), str(e["sha256"]))
            for e in files
            if Path(str(e["path"])).name != checkpoint.COMPLETE_MARKER
        )

    return manifest.step == step and shape(manifest.files) == shape(entries)

"""Which files of a checkpoint directory make the checkpoint to keep: the training frameworks' layouts.

The agent looks at ``$CLOUDTRAIN_CHECKPOINT_DIR`` (a listing of its files with size, mtime and inode)
and ``plan`` says what one upload round takes. Pure functions over that listing (stdlib only, shipped
in the agent zip), so every rule is testable without a cloud. The rules, each the framework's own
notion of "complete" (docs/checkpoints.md has them with the framework's restore call):

- **Temporary names are never taken**: hidden names, ``*.tmp`` (``checkpoint.save``), TensorFlow's
  ``*.tmp<hex>`` / ``*_temp*`` / ``*.tempstate<N>``, Orbax's ``<step>.orbax-checkpoint-tmp[-<ts>]``,
  Hugging Face's ``tmp-checkpoint-<N>``. They do not count as steps either. Inside an Orbax step
  directory under its final name every file is Orbax's (zarr's ``.zarray`` too).
- **TensorFlow** (``tf.train.CheckpointManager`` / ``Checkpoint.save``): ``<prefix>-N.index`` with
  every ``<prefix>-N.data-0000k-of-0000n`` shard is one checkpoint of step N; the newest complete one
  is taken with a ``checkpoint`` state file that names it, so ``tf.train.latest_checkpoint`` finds it.
- **PyTorch Lightning** (``ModelCheckpoint(save_last=True)``): ``last.ckpt`` plus the newest
  ``*step=N*.ckpt``; the step is that file's N.
- **Orbax** (``CheckpointManager``): step directories ``N/`` (or ``<prefix>_N/``) exist under their
  final name only once Orbax renamed them from the temporary name, so a final-named, stable one is
  complete.
- **Hugging Face** ``Trainer``: ``checkpoint-N/`` is complete once it holds ``trainer_state.json``
  and its files are stable; the step is the state's ``global_step``.
- **PyTorch DCP** (``torch.distributed.checkpoint.save`` to a step directory): ``<dir>/*.distcp``
  data files, then ``.metadata`` (through ``.metadata.tmp`` and a rename), which makes the directory
  complete; ``.metadata`` is DCP's, so it is taken although its name is hidden. DCP's coordinator
  (global rank 0) alone writes ``.metadata``: on a gang's other nodes (``dcp_shards``) a step
  directory holds only that node's ``__<rank>_<n>.distcp`` files, and is taken once a later step's
  directory exists (the save returned), the newest once its files are stable (two looks agree, none
  open for writing); whether the step finished on every rank is told by the head's ``.metadata`` (the
  restore takes only a step the head has).
- **Our convention** (``contract.checkpoint``): a top-level file whose name carries its step, or a
  step directory with its ``.complete`` marker or a later step directory beside it.
- **Everything else** (``checkpoint.pt`` overwritten every epoch, ``state.json``, tokenizer files):
  with snapshots on (the default) every such file is taken at its newest *stable* version: unchanged
  since the agent's previous look and not open for writing. A file that is being written keeps the
  version the run folder already has (``keep``), or is left for the next round if it has none.

Of each family only the newest complete checkpoint is taken (older ones are superseded; every
unit of that step: ``model_500.pt`` with ``optimizer_500.pt``); newer
pieces that are not complete yet are listed in ``pending`` with the reason, which is what the agent
says when nothing could be kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from airflow_cloudtrain.contract.checkpoint import COMPLETE_MARKER, skipped, step_of

STEPS = "steps"
TENSORFLOW = "tensorflow"
LIGHTNING = "lightning"
ORBAX = "orbax"
HUGGINGFACE = "huggingface"
DCP = "dcp"
FILES = "files"  # the snapshot of files that match no layout

TF_STATE = "checkpoint"
HF_STATE = "trainer_state.json"
ORBAX_FINISHED = ("_CHECKPOINT_METADATA", "commit_success.txt")
# Orbax's temporary directory suffix; orbax-checkpoint 0.12 adds no ``-<timestamp>`` (docs/gpu_checks.md)
ORBAX_TMP = ".orbax-checkpoint-tmp"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's, written last (a rename)

_TF_INDEX = re.compile(r"^(?P<prefix>.+)\.index$")
_TF_SHARD = re.compile(r"^(?P<prefix>.+)\.data-(?P<k>\d{5})-of-(?P<n>\d{5})$")
_LIGHTNING_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
_LIGHTNING_STEP = re.compile(r"step=(\d+)")
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_ORBAX_DIR = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_.-]*_)?(\d+)$")  # ``CheckpointManager(step_prefix=...)``


def temporary(name: str) -> bool:
    """Whether one path component is a name frameworks (or ``checkpoint.save``) write before the
    final rename: never taken, never a step (``contract.checkpoint.skipped``, and Orbax's
    ``<step>.orbax-checkpoint-tmp`` without the timestamp older releases added)."""
    return skipped(name) or name.endswith(ORBAX_TMP)


@dataclass(frozen=True)
class Look:
    """What the agent saw of one file: enough to tell whether it changed since."""

    size: int
    mtime_ns: int
    inode: int


@dataclass(frozen=True)
class Unit:
    """One complete checkpoint of a layout: its files (paths relative to the checkpoint directory)."""

    layout: str
    step: int | None
    files: tuple[str, ...]
    name: str  # what a person calls it: "ckpt-5", "checkpoint-500/", "last.ckpt"


@dataclass
class Plan:
    """What one upload round takes. ``files``: taken as they are now; ``keep``: loose files being
    written whose previous version (already in the run folder) stays in the snapshot; ``generated``:
    files the agent writes itself (the TensorFlow state file naming the checkpoint taken)."""

    step: int | None
    layouts: list[str]
    files: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    generated: dict[str, bytes] = field(default_factory=dict)
    units: list[Unit] = field(default_factory=list)
    pending: list[tuple[str, str]] = field(default_factory=list)  # (what, why not taken yet)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (what, why never taken)

    @property
    def layout(self) -> str:
        return "+".join(self.layouts) if self.layouts else FILES

    @property
    def empty(self) -> bool:
        return not (self.files or self.keep or self.generated)


def _group(listing: Iterable[str]) -> dict[str, list[str]]:
    """Files by their top-level entry: ``{"ckpt-5.index": ["ckpt-5.index"], "checkpoint-500":
    ["checkpoint-500/model.bin", ...]}``; files under a temporary component anywhere are dropped."""
    tops: dict[str, list[str]] = {}
    for rel in listing:
        tops.setdefault(rel.split("/", 1)[0], []).append(rel)
    return tops


def _inner(files: list[str]) -> list[str]:
    """A directory's files without the temporary ones (a ``.complete`` marker is kept: the job's)."""
    out = []
    for rel in files:
        parts = rel.split("/")[1:]
        if parts and parts[-1] == COMPLETE_MARKER and len(parts) == 1 or not any(temporary(p) for p in parts):
            out.append(rel)
    return sorted(out)


def tf_state(prefix: str) -> bytes:
    """The ``checkpoint`` state file TensorFlow writes, naming one checkpoint (relative path)."""
    return f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n'.encode()


def state_names(text: bytes | None) -> str | None:
    """The checkpoint a TensorFlow ``checkpoint`` state file names (``model_checkpoint_path``)."""
    found = re.search(rb'^model_checkpoint_path: "([^"]+)"', text or b"", re.M)
    return found.group(1).decode(errors="replace") if found else None


def hf_step(text: bytes | None) -> int | None:
    """``global_step`` of a Hugging Face ``trainer_state.json``; None when unreadable."""
    try:
        value = json.loads(text or b"").get("global_step")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Families:
    """The complete and pending units of each layout, found in one pass over the top-level entries."""

    def __init__(
        self,
        tops: dict[str, list[str]],
        settled: Callable[[str], bool],
        closed: Callable[[str], bool],
        read: Reader,
        torn: Callable[[str], bool] = lambda rel: False,
        mtime: Callable[[str], int | None] = lambda rel: None,
        dcp_shards: bool = False,
    ) -> None:
        self.tops, self.settled, self.closed, self.read, self.torn = tops, settled, closed, read, torn
        self.mtime = mtime
        self.dcp_shards = dcp_shards
        self.complete: dict[str, list[Unit]] = {}
        self.pending: list[tuple[int, str, str, str]] = []  # (step, layout, what, why)
        self.ignored: list[tuple[str, str]] = []
        self.claimed: set[str] = set()

    def done(self, layout: str, step: int | None, files: list[str], name: str) -> None:
        self.complete.setdefault(layout, []).append(Unit(layout, step, tuple(sorted(files)), name))

    def wait(self, layout: str, step: int, what: str, why: str) -> None:
        self.pending.append((step, layout, what, why))

    def unsettled(self, files: list[str]) -> list[str]:
        """Files written in place that may still change (two looks disagree, or open for writing)."""
        return [rel for rel in files if not self.settled(rel)]

    def open(self, files: list[str]) -> list[str]:
        """Files of a layout that is complete by its names (rename, marker, state file) still open
        for writing, or torn by a killed job."""
        return [rel for rel in files if not self.closed(rel)]

    def find(self) -> None:
        for name in sorted(self.tops):
            if temporary(name):
                self.claimed.add(name)
                self.ignored.append((name, "a temporary name (being written)"))
        self._tensorflow()
        self._huggingface()
        self._dcp()
        self._lightning()
        self._orbax()
        self._steps()

    def _tensorflow(self) -> None:
        files = {name for name, rels in self.tops.items() if rels == [name]}
        prefixes = {m["prefix"] for name in files if (m := _TF_INDEX.match(name))}
        shards: dict[str, list[re.Match[str]]] = {}
        for name in files:
            if (m := _TF_SHARD.match(name)) and not temporary(name):
                shards.setdefault(m["prefix"], []).append(m)
        if not prefixes and not (TF_STATE in files and shards):
            return
        if TF_STATE in files:
            self.claimed.add(TF_STATE)
        for prefix in sorted(prefixes | set(shards)):
            group = [f"{prefix}.index"] if prefix in prefixes else []
            group += [m.group(0) for m in shards.get(prefix, [])]
            self.claimed.update(group)
            step = step_of(prefix)
            sort_step = -1 if step is None else step
            counts = {int(m["n"]) for m in shards.get(prefix, [])}
            if prefix not in prefixes:
                self.wait(TENSORFLOW, sort_step, f"{prefix}.data-*", f"no {prefix}.index yet")
                continue
            if len(counts) != 1:
                self.wait(TENSORFLOW, sort_step, f"{prefix}.index", "its data shards are missing")
                continue
            total = counts.pop()
            have = {int(m["k"]) for m in shards[prefix]}
            missing = [k for k in range(total) if k not in have]
            named = state_names(self.read(TF_STATE)) == prefix
            if missing:
                shard = f"{prefix}.data-{missing[0]:05d}-of-{total:05d}"
                self.wait(TENSORFLOW, sort_step, f"{prefix}.index", f"{shard} is missing")
            elif moving := (self.open(group) if named else self.unsettled(group)):
                self.wait(TENSORFLOW, sort_step, moving[0], "still being written")
            else:
                self.done(TENSORFLOW, step, group, prefix)

    def _huggingface(self) -> None:
        for name, rels in self.tops.items():
            m = _HF_DIR.match(name)
            if m is None or rels == [name] or name in self.claimed:
                continue
            self.claimed.add(name)
            files = _inner(rels)
            n = int(m.group(1))
            state = f"{name}/{HF_STATE}"
            step = hf_step(self.read(state)) if state in files else None
            if step is None:
                self.wait(HUGGINGFACE, n, f"{name}/", f"no {HF_STATE} yet (the Trainer writes it last)")
            elif moving := self.open(files):
                self.wait(HUGGINGFACE, n, moving[0], "still being written")
            else:
                self.done(HUGGINGFACE, step, files, f"{name}/")

    def _dcp(self) -> None:
        steps = [
            step
            for name, rels in self.tops.items()
            if (step := step_of(name)) is not None and any(r.endswith(".distcp") for r in rels)
        ]
        newest = max(steps, default=None)
        for name, rels in self.tops.items():
            if rels == [name] or name in self.claimed or not any(r.endswith(".distcp") for r in rels):
                continue
            self.claimed.add(name)
            step = step_of(name)
            sort_step = -1 if step is None else step
            metadata = f"{name}/{DCP_METADATA}"
            # DCP's hidden ``.metadata`` is its own; anything else temporary (``.metadata.tmp``) is not
            files = sorted({*_inner(rels), *([metadata] if metadata in rels else [])})
            if metadata not in files and self.dcp_shards:
                # a later step's directory: DCP's save of this one returned (its files are final);
                # the newest: once its files are stable
                later = step is not None and newest is not None and step < newest
                if moving := (self.open(files) if later else self.unsettled(files)) + [
                    rel for rel in files if self.torn(rel)
                ]:
                    self.wait(DCP, sort_step, moving[0], "this node's shard is still being written")
                else:
                    self.done(DCP, step, files, f"{name}/")
            elif metadata not in files:
                self.wait(DCP, sort_step, f"{name}/", f"no {DCP_METADATA} yet (DCP writes it last)")
            elif moving := self.open(files):
                self.wait(DCP, sort_step, moving[0], "still being written")
            else:
                self.done(DCP, step, files, f"{name}/")

    def _lightning(self) -> None:
        names = [
            n for n, rels in self.tops.items() if rels == [n] and n.endswith(".ckpt") and not temporary(n)
        ]
        last = [n for n in names if _LIGHTNING_LAST.match(n)]
        if not last:
            return  # step-named .ckpt files alone follow our convention
        stepped: list[tuple[int, str]] = []
        for name in names:
            if name not in last and (m := _LIGHTNING_STEP.search(name)):
                stepped.append((int(m.group(1)), name))
        self.claimed.update(last)
        self.claimed.update(name for _, name in stepped)
        stable_last = [n for n in last if self.settled(n)]
        if not stable_last:
            self.wait(LIGHTNING, 1 << 62, last[0], "still being written")
            return
        stable_steps = sorted((s, n) for s, n in stepped if self.settled(n))
        for step, name in stepped:
            if (step, name) not in stable_steps:
                self.wait(LIGHTNING, step, name, "still being written")
        # ModelCheckpoint saves the step-named file first, then ``last.ckpt``: a step file newer than
        # ``last.ckpt`` is one ``last.ckpt`` does not hold yet, so the version's step is the newest
        # step file saved before it (``ckpt_path="last"`` resumes from that one)
        last_at = self.mtime(stable_last[0])
        ahead = [(s, n) for s, n in stable_steps if last_at is not None and (self.mtime(n) or 0) > last_at]
        for step, name in ahead:
            self.wait(LIGHTNING, step, name, f"saved after {stable_last[0]}, which is not rewritten yet")
        stable_steps = [unit for unit in stable_steps if unit not in ahead]
        newest = stable_steps[-1] if stable_steps else None
        files = stable_last + ([newest[1]] if newest else [])
        self.done(LIGHTNING, newest[0] if newest else None, files, stable_last[0])

    def _orbax(self) -> None:
        orbax_tmp = any(ORBAX_TMP in name for name in self.tops)
        for name, rels in self.tops.items():
            m = _ORBAX_DIR.match(name)
            if m is None or rels == [name] or name in self.claimed:
                continue
            # final-named by Orbax's rename: every file in it is Orbax's (zarr's ``.zarray`` too)
            files = sorted(rel for rel in rels if ORBAX_TMP not in rel)
            finished = any(f"{name}/{marker}" in files for marker in ORBAX_FINISHED)
            if not (finished or orbax_tmp):
                continue  # a plain step directory: our convention's rules
            self.claimed.add(name)
            step = int(m.group(1))
            if moving := self.open(files):
                self.wait(ORBAX, step, moving[0], "still being written")
            else:
                self.done(ORBAX, step, files, f"{name}/")

    def _steps(self) -> None:
        dirs: list[tuple[int, str, list[str]]] = []
        for name, rels in self.tops.items():
            if name in self.claimed or (step := step_of(name)) is None:
                continue
            if rels == [name]:
                self.claimed.add(name)
                # moved into place (``checkpoint.save``): complete once closed; but the name cannot
                # tell it from ``torch.save`` to the final name, so a killed job's last write is torn
                if self.closed(name) and not self.torn(name):
                    self.done(STEPS, step, [name], name)
                else:
                    self.wait(STEPS, step, name, "still being written")
            else:
                dirs.append((step, name, _inner(rels)))
        newest_dir = max((step for step, _, _ in dirs), default=None)
        for step, name, files in dirs:
            self.claimed.add(name)
            marked = f"{name}/{COMPLETE_MARKER}" in files
            if not marked and (newest_dir is None or step >= newest_dir):
                self.wait(STEPS, step, f"{name}/", f"no {COMPLETE_MARKER} marker and no later step directory")
            elif moving := self.open(files):
                self.wait(STEPS, step, moving[0], "still being written")
            else:
                self.done(STEPS, step, files, f"{name}/")


Reader = Callable[[str], "bytes | None"]


def plan(
    listing: Iterable[str],
    settled: Callable[[str], bool],
    read: Reader,
    snapshots: bool = True,
    kept: Callable[[str], bool] = lambda rel: False,
    closed: Callable[[str], bool] | None = None,
    torn: Callable[[str], bool] = lambda rel: False,
    mtime: Callable[[str], int | None] = lambda rel: None,
    dcp_shards: bool = False,
) -> Plan:
    """What to upload from a checkpoint directory whose files (relative posix paths) are ``listing``.

    ``settled(rel)``: the file is stable (two looks agree, not open for writing): what a file written
    in place needs; ``closed(rel)``: not open for writing and not torn (default: ``settled``): enough
    for a layout whose names say it is complete (a rename, a marker, a state file); ``torn(rel)``: a
    killed job changed it in its last moments (a step-named file may have been written in place);
    ``read(rel)``: its bytes (for state files); ``mtime(rel)``: when it was last written (None:
    unknown), which orders files a framework writes one after the other; ``kept(rel)``: the run folder already has a version
    of this file (a loose file being written then keeps that version); ``snapshots``: take files that
    match no layout (else they are listed in ``ignored``); ``dcp_shards``: this directory is a gang
    node's that is not DCP's coordinator, whose DCP step directories hold no ``.metadata``.
    """
    families = _Families(_group(listing), settled, closed or settled, read, torn, mtime, dcp_shards)
    families.find()
    result = Plan(step=None, layouts=[], ignored=families.ignored)
    for layout, units in families.complete.items():
        newest = max(units, key=lambda u: -1 if u.step is None else u.step)
        if layout == TENSORFLOW:
            result.generated[TF_STATE] = tf_state(newest.name)
        # every unit of that step: ``model_500.pt`` + ``optimizer_500.pt`` are one checkpoint
        same = [newest] if layout == TENSORFLOW else [u for u in units if u.step == newest.step]
        for unit in same:
            result.units.append(unit)
            result.files.extend(unit.files)
    result.units.sort(key=lambda u: (-1 if u.step is None else u.step, u.layout, u.name))
    result.layouts = list(dict.fromkeys(u.layout for u in result.units))
    steps = [u.step for u in result.units if u.step is not None]
    result.step = max(steps) if steps else None
    taken = {u.layout: -1 if u.step is None else u.step for u in result.units}
    for step, layout, what, why in sorted(families.pending):
        if step > taken.get(layout, -2):
            result.pending.append((what, why))
    loose = sorted(
        rel
        for name, rels in families.tops.items()
        if name not in families.claimed
        for rel in rels
        if not any(temporary(part) for part in rel.split("/"))
    )
    if loose and not snapshots:
        result.ignored.extend((rel, "matches no checkpoint layout and snapshots are off") for rel in loose)
        return result
    for rel in loose:
        if settled(rel):
            result.files.append(rel)
        elif kept(rel):
            result.keep.append(rel)
            result.pending.append((rel, "being written: its previous version is kept"))
        else:
            result.pending.append((rel, "being written: taken once it is stable"))
    if loose and FILES not in result.layouts and any(r in result.files or r in result.keep for r in loose):
        result.layouts.append(FILES)
    result.files.sort()
    return result

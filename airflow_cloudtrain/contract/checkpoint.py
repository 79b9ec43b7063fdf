"""Checkpoints that are never half-written: the job's side of checkpoint-resume (stdlib only).

The training job writes checkpoints into ``$CLOUDTRAIN_CHECKPOINT_DIR``; the agent on the instance
uploads the newest complete one to the run folder every ``checkpoint_interval_s`` (and once more
when the job ends or is interrupted), and restores the newest verified one into that directory
before the job starts again on a new instance. This module ships in the agent zip, which the agent
puts on the job's ``PYTHONPATH``, so a job can always ``from airflow_cloudtrain.contract import checkpoint``.

The convention (what the agent treats as complete):

- A checkpoint is a top-level entry of the checkpoint directory whose name carries its step: the
  last run of digits of the name without its extensions, e.g. ``ckpt-00042.pt`` (a file),
  ``model-7.tar.gz`` or ``step-00042/`` (a directory). Other entries are not checkpoints.
- A file moved into place atomically is complete. ``save(path, write_fn)`` does exactly that: it
  writes ``.<name>.tmp`` in the same directory, then ``os.replace``-s it onto ``path``.
- Names ending in ``.tmp`` or starting with ``.`` are never complete and never uploaded (also
  inside a step directory).
- A directory per step (``step-00042/``) is complete once it holds a ``.complete`` marker file
  (``mark_complete``) or once a later step directory appears next to it.

``latest(directory)`` is the newest complete checkpoint (highest step) and ``step_of(name)`` the
step a name carries. A job resumes with::

    from airflow_cloudtrain.contract import checkpoint

    found = checkpoint.latest(os.environ["CLOUDTRAIN_CHECKPOINT_DIR"])
    if found is not None:
        state = torch.load(found)                       # step = checkpoint.step_of(found.name)
    ...
    checkpoint.save(f"{ckpt_dir}/ckpt-{step:05d}.pt", lambda tmp: torch.save(state, tmp))
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".complete"
TMP_SUFFIX = ".tmp"

_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,15}$")  # ".pt", ".gz", ".safetensors"
_TRAILING_DIGITS = re.compile(r"(\d+)$")


# Names written before the final rename: hidden names, ``*.tmp`` (``save``), TensorFlow's ``*.tmp<hex>``
# / ``*_temp*`` / ``*.tempstate<N>``, Orbax's ``<step>.orbax-checkpoint-tmp-<ts>``, Hugging Face's
# ``tmp-checkpoint-<N>``, ``*.part`` and editor backups ``*~``.
_TEMPORARY = re.compile(
    r"(^\.|\.tmp$|\.tmp[0-9a-f]{8,}$|_temp(_[0-9a-f]{8,})?$|\.tempstate\d+$|\.orbax-checkpoint-tmp-|"
    r"^tmp-checkpoint-\d+$|\.part$|~$)"
)

# The file the job writes (``report_resumed``) to say which step it really resumed from.
RESUME_REPORT_ENV = "CLOUDTRAIN_RESUME_REPORT"


def skipped(name: str) -> bool:
    """Whether a file or directory name is a temporary one (see ``_TEMPORARY``): never complete, never
    a step, never uploaded."""
    return bool(_TEMPORARY.search(name))


def step_of(name: str | os.PathLike[str]) -> int | None:
    """The step a checkpoint name carries, None when it carries none or is a skipped name.

    ``ckpt-00042.pt`` -> 42, ``step-00042`` -> 42, ``model-7.tar.gz`` -> 7, ``.ckpt-5.pt.tmp`` -> None.
    """
    name = Path(name).name
    if not name or skipped(name):
        return None
    stem = name
    while (match := _EXTENSION.search(stem)) and match.start() > 0:
        stem = stem[: match.start()]
    found = _TRAILING_DIGITS.search(stem)
    return int(found.group(1)) if found else None


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform / filesystem allows it
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(path: str | os.PathLike[str], write_fn: Callable[[Path], object]) -> Path:
    """Write a checkpoint file atomically: ``write_fn(tmp)`` writes ``.<name>.tmp``, which then
    replaces ``path``. If ``write_fn`` raises, the temp file is removed and ``path`` is untouched;
    if the process dies inside it, only the temp file (never uploaded, never ``latest``) is left."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}{TMP_SUFFIX}")
    try:
        write_fn(tmp)
        if not tmp.is_file():
            raise FileNotFoundError(f"write_fn did not write the checkpoint file {tmp}")
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(target.parent)
    return target


def mark_complete(step_dir: str | os.PathLike[str]) -> Path:
    """Mark a step directory (``step-00042/``) complete: writes its ``.complete`` marker."""
    marker = Path(step_dir) / COMPLETE_MARKER
    marker.write_text("")
    _fsync_dir(Path(step_dir))
    return marker


def candidates(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints in ``directory`` as (step, path), oldest first (see the module rules)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    files: list[tuple[int, Path]] = []
    dirs: list[tuple[int, Path]] = []
    for entry in root.iterdir():
        step = step_of(entry.name)
        if step is None:
            continue
        if entry.is_dir():
            dirs.append((step, entry))
        elif entry.is_file():
            files.append((step, entry))
    newest_dir = max((step for step, _ in dirs), default=None)
    complete_dirs = [
        (step, path)
        for step, path in dirs
        if (path / COMPLETE_MARKER).is_file() or (newest_dir is not None and step < newest_dir)
    ]
    return sorted(files + complete_dirs, key=lambda item: (item[0], item[1].name))


def latest(directory: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint (highest step) in ``directory``, None when there is none."""
    found = candidates(directory)
    return found[-1][1] if found else None


def report_resumed(step: int) -> None:
    """Tell the agent the step the job actually resumed from (what it loaded, e.g. the framework's
    ``global_step`` after restore). The run's ledger then records this step instead of the one the
    agent read from the checkpoint's name or state file. Does nothing outside a cloudtrain run."""
    target = os.environ.get(RESUME_REPORT_ENV)
    if not target or isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_SUFFIX}")
    tmp.write_text(str(step))
    os.replace(tmp, path)

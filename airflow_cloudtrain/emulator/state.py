"""The emulated clouds' state on disk: what ``cloudtrain up`` (and ``cloudtrain emulator --state-dir``)
keeps across a stop, so a run still deferred then finishes after the next start instead of failing
as lost.

    save_and_stop(emu, state_dir)   # the agents stop (their instances stay running), state saved
    saved = load(state_dir)         # before emu.start(): unpickled while no server thread imports
    restore(emu, saved)             # after emu.start(): the clouds as they were; agents start again

Kept: every moto backend (EC2 instances, launch templates, Auto Scaling groups, S3 buckets and their
objects: the run folders, IAM, SSM, ...), Compute Engine's projects (VMs, operations, groups), the
GCS buckets and objects, Pub/Sub topics and subscriptions with their messages, and Secret Manager's
secrets. A machine's processes cannot be frozen: at the stop every instance's agent and job end as
on a power cut, and after the restore the runner starts the agent of each instance still running
(its agent resumes the run from the run folder, or runs the job again), on the same instance id.
Vertex AI jobs are not kept (their replicas are processes, and a job's state belongs to them): a job
running at the stop is gone after it (the README says so).

The objects are pickled with their locks replaced by new ones (a lock's state means nothing in
another process). The file is the emulator's own, for the same package versions, in a directory of
the user's (mode 600: it holds the emulated secrets too); one that does not load (other versions) is
skipped with a warning, and the clouds start empty.
"""

from __future__ import annotations

import copy
import io
import logging
import pickle
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
STATE_FILE = "clouds.pickle"
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


class _Fresh:
    """A picklable stand-in for a ``defaultdict``'s lambda factory: a copy of what it made."""

    def __init__(self, sample: Any) -> None:
        self.sample = sample

    def __call__(self) -> Any:
        return copy.deepcopy(self.sample)


def _pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _load_key(pem: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(pem, password=None)


def _new_defaultdict(cls: type, factory: Any) -> Any:
    made: Any = defaultdict.__new__(cls)
    defaultdict.__init__(made, factory)
    return made


class _Pickler(pickle.Pickler):
    """Locks and conditions become new ones (a condition keeps the lock it shares with its owner);
    a ``defaultdict`` made with a lambda (moto's SSM tags) gets a factory that pickles."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj).__module__.startswith("cryptography.") and hasattr(obj, "private_bytes"):
            return _load_key, (_pem(obj),)  # moto's KMS keys: the key itself, as PEM
        if isinstance(obj, defaultdict):  # a subclass's __init__ may take other arguments (moto's SSM)
            factory = obj.default_factory
            if factory is not None and getattr(factory, "__name__", "") == "<lambda>":
                factory = _Fresh(factory())
            state = vars(obj) if type(obj) is not defaultdict else None
            return _new_defaultdict, (type(obj), factory), state, None, iter(obj.items())
        if isinstance(obj, _LOCK_TYPES):
            return (threading.RLock if "RLock" in type(obj).__name__ else threading.Lock), ()
        if isinstance(obj, threading.Condition):
            return threading.Condition, (obj._lock,)  # type: ignore[attr-defined]
        if isinstance(obj, threading.Event):
            return threading.Event, ()
        return NotImplemented


def _dumps(value: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buf.getvalue()


def _moto_backends() -> dict[tuple[str, str], Any]:
    """Every moto ``BackendDict`` loaded in this process, by (module, attribute)."""
    from moto.core.base_backend import BackendDict

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("moto.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, BackendDict) and len(value):
                found[(name, attr)] = value
    return found


def _gcs_fields(emu: Any) -> tuple[Any, list[tuple[Any, str]]]:
    storage = emu.gcs._storage
    names = ("buckets", "objects", "resumable", "bucket_iam_policies", "soft_deleted")
    return storage, [(storage, n) for n in names] + [(storage._store, "_files"), (storage._store, "_dirs")]


def _parts(emu: Any) -> dict[str, tuple[Any, list[tuple[Any, str]]]]:
    """Each kept cloud: (the lock to hold, [(object, attribute)])."""
    storage, gcs = _gcs_fields(emu)
    return {
        "gce": (emu.gce._lock, [(emu.gce, "_projects")]),
        "gcs": (emu.gcs._lock, gcs),
        "pubsub": (emu.pubsub._lock, [(emu.pubsub, n) for n in ("_topics", "_subs", "_acks")]),
        "secretmanager": (emu.secretmanager._lock, [(emu.secretmanager, "_secrets")]),
    }


def save_and_stop(emu: Any, state_dir: Path) -> list[str]:
    """Stop the instances' processes (their records stay as they are: running), write the clouds'
    state to ``state_dir``, then stop the emulator. Returns what was kept."""
    state_dir.mkdir(parents=True, exist_ok=True)
    kept: list[str] = []
    try:
        if hasattr(emu, "runner"):
            emu.runner.stop()  # agents and jobs end; nothing is told to the clouds
        doc: dict[str, Any] = {"version": 1}
        doc["moto"] = {}
        for key, value in _moto_backends().items():
            try:  # one that does not pickle is left out (it starts empty), the others are kept
                _dumps(dict(value))
            except Exception as err:
                log.warning("emulator: moto's %s is not kept across a restart: %s", key[1], err)
                continue
            doc["moto"][key] = dict(value)
        for name, (lock, fields) in _parts(emu).items():
            with lock:
                doc[name] = [getattr(obj, attr) for obj, attr in fields]
        data = _dumps(doc)  # under no lock: the servers are idle once Airflow has stopped
        tmp = state_dir / f".{STATE_FILE}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.touch(mode=0o600)
        tmp.write_bytes(data)
        tmp.replace(state_dir / STATE_FILE)
        kept = ["aws", *_parts(emu)]
    except Exception as err:  # the stop must go on: the next start is then empty
        log.warning("emulator: could not save the clouds' state in %s: %s", state_dir, err)
        print(f"warning: the emulated clouds' state was not saved ({err})", file=sys.stderr)
    finally:
        emu.stop()
    return kept


def load(state_dir: Path) -> dict[str, Any] | None:
    """What ``save_and_stop`` wrote, read before the emulator starts (None when there is no file, or
    one that does not load). Before, not after: unpickling imports moto's modules, and once the
    emulator's server threads run they import others in another order, which Python's import lock
    can report as a deadlock (met: "deadlock detected by _ModuleLock('moto.elbv2.exceptions')")."""
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        doc: dict[str, Any] = pickle.loads(path.read_bytes())
    except Exception as err:
        print(
            f"warning: the emulated clouds' saved state in {path} does not load ({err}); starting empty",
            file=sys.stderr,
        )
        return None
    return doc


def restore(emu: Any, saved: dict[str, Any] | None) -> list[str]:
    """Put what ``load`` read into the started emulator; returns the clouds restored (none when
    nothing was saved). The runner then sees the instances that were running and starts their
    agents."""
    if saved is None:
        return []
    import importlib

    from moto.core.base_backend import BackendDict

    restored = []
    for (module, attr), backends in saved.get("moto", {}).items():
        target = getattr(importlib.import_module(module), attr, None)
        if isinstance(target, BackendDict):
            target.clear()
            target.update(backends)
    restored.append("aws")
    for name, (lock, fields) in _parts(emu).items():
        values = saved.get(name)
        if values is None or len(values) != len(fields):
            continue
        with lock:
            for (obj, attr), value in zip(fields, values, strict=True):
                setattr(obj, attr, value)
        restored.append(name)
    return restored

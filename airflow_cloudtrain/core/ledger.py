"""The write-ahead resource ledger: every cloud resource a run creates is torn down by one mechanism.

Before a create call the ledger records ``(kind, id or None, location)`` in ``task_state_store``; after
it, the id the cloud gave. Teardown (``release``) walks the entries in reverse creation order and
hands each kind's entries to that kind's deleter, which treats "not found" as done. Entries whose id
never came back (the worker died inside the create call) and resources the store never heard of (a
crashed worker, a cleared task, a triggerer's ``on_kill``, which has no store) are found by the run
key tag every resource carries: ``sweep`` rebuilds the ledger from tags.

Resource kinds register a ``ResourceKind`` (how to find by run key, how to delete, and when to go:
``release_order``); instances are registered here, and the group/queue/template/job kinds of later
operators register theirs the same way. Every teardown path of every operator goes through
``release``; every find-or-create of a named resource goes through ``ensure``.

The stored form (``{"run_key": ..., "entries": [{kind, id, location, token}]}``) is the one earlier
releases wrote: a run folder's ledger written by them is released by this code.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from airflow_cloudtrain.contract.records import load_known
from airflow_cloudtrain.core.retry import call_with_retry

if TYPE_CHECKING:
    from airflow_cloudtrain.core.cloud import Cloud

log = logging.getLogger(__name__)
T = TypeVar("T")
B = TypeVar("B")  # the backend a kind's resources are found and deleted through

STORE_KEY = "cloudtrain_ledger"
# When a kind is released, relative to the others (same order: newest first)
RELEASE_FIRST = -1  # a group: deleting its members (or its template) before it would only replace them
RELEASE_IN_ORDER = 0
RELEASE_LAST = 1  # a GCE firewall rule that keeps the run's VMs unreachable goes once they are gone


class LedgerBackend(Protocol):
    """What a run's resources are found and deleted through: its ``RunBackend``, or a Vertex AI job
    backend (``clouds.gcp.vertex.VertexJobs``). Each ``ResourceKind[B]`` says which it takes; the
    ledger itself reads only ``sweep_kinds`` (when there is one)."""

    @property
    def region(self) -> str | None: ...


@dataclass
class Resource:
    """One cloud resource of a run. ``id`` is None while its create call is in flight."""

    kind: str
    id: str | None
    location: str | None = None  # region (EC2) or zone (GCE): where the deleter must look
    token: str = ""  # the create call's client token / request id

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ResourceKind(Generic[B]):
    """How to find a kind of resource by run key (any state), how to delete some of them, and when.

    ``release_order`` is the kind's place in every teardown, whatever the order of creation (or of a
    sweep's finds): ``RELEASE_FIRST`` kinds go before all others and must be gone before the others
    go (a group that would replace members deleted before it); ``RELEASE_LAST`` after all others (a
    firewall rule that keeps the run's VMs unreachable); the rest newest first.
    ``release_last=True`` is the older spelling of ``release_order=RELEASE_LAST``."""

    name: str
    find: Callable[[B, str], list[Resource]]  # (backend, run key digest) -> resources
    delete: Callable[[B, list[Resource]], None]  # (backend, resources with ids); NotFound is done
    release_last: bool = False
    release_order: int = RELEASE_IN_ORDER

    def __post_init__(self) -> None:
        if self.release_last:
            object.__setattr__(self, "release_order", RELEASE_LAST)


# every kind, whatever its backend's type (each kind is handed the backend of the run it belongs to)
KINDS: dict[str, ResourceKind[Any]] = {}


def register_kind(kind: ResourceKind[B]) -> ResourceKind[B]:
    """Make a resource kind known to every ledger (later operators add groups, queues, jobs...)."""
    KINDS[kind.name] = kind
    return kind


class InstanceBackend(Protocol):
    """The part of a ``core.backend.RunBackend`` the "instance" kind needs (named here, not imported:
    the backend protocol names the ledger, so the ledger may not name it back)."""

    @property
    def cloud(self) -> Cloud: ...

    def location(self, zone: str | None) -> str | None: ...

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None: ...


def _find_instances(backend: InstanceBackend, digest: str) -> list[Resource]:
    return [
        Resource("instance", i.id, backend.location(i.zone)) for i in backend.cloud.find(digest, ended=True)
    ]


def _delete_instances(backend: InstanceBackend, resources: list[Resource]) -> None:
    backend.terminate_instances([(r.id, r.location) for r in resources if r.id])


INSTANCE = register_kind(ResourceKind("instance", _find_instances, _delete_instances))


class ResourceLedger:
    """The resources of one run (one run key), persisted write-ahead in ``task_state_store``."""

    def __init__(
        self,
        run_key: str,
        store: Any = None,
        entries: list[Resource] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.run_key = run_key
        self.store = store
        self.entries: list[Resource] = list(entries or [])
        self.log = logger or log
        # a gang's create calls run in threads (``core.launcher.launch_nodes``): each change and its
        # save are one step, so a save never writes an older copy over a newer one
        self._lock = threading.RLock()
        # Without a logger (a trigger's on_kill) the caller says what went, in its task's log: the
        # module logger's line would repeat it, and from a worker thread may reach another task's log.
        self._say_released = self.log.info if logger is not None else self.log.debug

    # --- persistence ---------------------------------------------------------------------------

    @classmethod
    def load(cls, run_key: str, store: Any, logger: logging.Logger | None = None) -> ResourceLedger:
        """The ledger an earlier try (or this one) wrote; empty if none, or if it was another run's."""
        data = store_get(store, STORE_KEY)
        entries = []
        if data and data.get("run_key") == run_key:
            entries = [load_known(Resource, e) for e in data.get("entries", [])]
        return cls(run_key, store, entries, logger)

    def _save(self) -> None:
        store_set(
            self.store, STORE_KEY, {"run_key": self.run_key, "entries": [e.to_dict() for e in self.entries]}
        )

    # --- recording -----------------------------------------------------------------------------

    def intend(self, kind: str, location: str | None, id: str | None = None, token: str = "") -> Resource:
        """Record a resource before the call that creates it (write-ahead)."""
        if kind not in KINDS:
            raise ValueError(f"unknown resource kind {kind!r}: register it with register_kind()")
        entry = Resource(kind, id, location, token)
        with self._lock:
            self.entries.append(entry)
            self._save()
        return entry

    def created(self, entry: Resource, id: str, location: str | None = None) -> None:
        """The create call returned: remember the id the cloud gave (and where it landed).

        A teardown that ran meanwhile (``on_kill`` during the call) may have dropped the entry; it
        comes back, so the next release deletes what the call made."""
        with self._lock:
            entry.id = id
            entry.location = location or entry.location
            if entry not in self.entries:
                self.entries.append(entry)
            self._save()

    def discard(self, entry: Resource) -> None:
        """The create call was refused: nothing exists to release."""
        with self._lock:
            if entry in self.entries:
                self.entries.remove(entry)
            self._save()

    def add(self, kind: str, id: str, location: str | None) -> Resource:
        """Record a resource found alive (adopted, or rebuilt by a sweep)."""
        with self._lock:
            entry = self._remember(kind, id, location)
            self._save()
        return entry

    def _remember(self, kind: str, id: str, location: str | None) -> Resource:
        for entry in self.entries:
            if (entry.kind, entry.id) == (kind, id):
                return entry
        entry = Resource(kind, id, location)
        self.entries.append(entry)
        return entry

    def ensure(
        self,
        kind: str,
        location: str | None,
        name: str,
        *,
        find: Callable[[], T | None],
        create: Callable[[], T],
        before_create: Callable[[], None] = lambda: None,
        record: str | None = None,
    ) -> tuple[T, bool]:
        """The one find-or-create of a named resource: ``(it, made now?)``.

        ``find`` looks for it by the name the run key gives it (a retried task re-attaches); if it is
        missing, ``before_create`` may still refuse (a killed task raises there), the ledger records
        the intent (write-ahead, ``name`` as the token), ``create`` makes it, and the ledger records
        its id. The id is ``record`` when given (a resource deleted by name), else what
        ``find`` / ``create`` returned (a queue URL, a topic path). Cloud calls retry transient
        errors; ``create`` must be idempotent for a retried call (client token, 409 as done)."""
        found = call_with_retry(find)
        if found:
            self.add(kind, record or str(found), location)
            return found, False
        before_create()
        entry = self.intend(kind, location, token=name)
        made = call_with_retry(create)
        self.created(entry, record or str(made))
        return made, True

    def of_kind(self, kind: str) -> list[Resource]:
        return [e for e in self.entries if e.kind == kind and e.id]

    # --- teardown ------------------------------------------------------------------------------

    def sweep(self, backend: LedgerBackend, kinds: list[str] | None = None) -> list[Resource]:
        """Resources carrying this run key, found by tag (any state), added to the ledger."""
        found: list[Resource] = []
        for name in kinds or list(KINDS):
            for resource in KINDS[name].find(backend, self.run_key):
                found.append(self._remember(resource.kind, resource.id or "", resource.location))
        if found:
            self._save()
        return found

    def release(
        self, backend: LedgerBackend, sweep: bool = True, only: list[Resource] | None = None
    ) -> list[Resource]:
        """Delete every resource of the run (or ``only`` these), newest first; returns what went.

        With ``sweep`` (the default) the tags are searched too, so an entry whose create call never
        returned, or a resource an earlier try made without telling the store, goes as well. Every
        kind is attempted even when one fails; the first error is raised at the end.
        """
        error: BaseException | None = None
        swept = False
        if only is None and (sweep or any(e.id is None for e in self.entries)):
            try:
                self.sweep(backend, sorted({e.kind for e in self.entries} | set(_sweep_kinds(backend))))
                swept = True
            except Exception as err:  # the known deletes still go; the error is raised at the end
                self.log.error("Searching the run's resources by tag failed: %s", err)
                error = err
        released: list[Resource] = []
        for kind in _reverse_kinds(self.entries):
            if (
                error is not None
                and _order(kind) > RELEASE_FIRST
                and any(
                    _order(e.kind) == RELEASE_FIRST
                    for e in self.entries
                    if e.id and e not in released and (only is None or e in only)
                )
            ):
                break  # a group that could not go would replace what goes after it: try again later
            batch = [
                e for e in reversed(self.entries) if e.kind == kind and e.id and (only is None or e in only)
            ]
            if not batch:
                continue
            try:
                KINDS[kind].delete(backend, batch)
            except Exception as err:  # keep going: the other kinds must still go
                self.log.error("Deleting %s %s failed: %s", kind, [e.id for e in batch], err)
                error = error or err
                continue
            released.extend(batch)
            self._say_released("Released %s %s", kind, ", ".join(e.id or "" for e in batch))
        # an entry whose create call never returned is kept until a sweep has looked for it
        self.entries = [e for e in self.entries if e not in released and (e.id is not None or not swept)]
        self._save()
        if error is not None:
            raise error
        return released


def _sweep_kinds(backend: LedgerBackend) -> tuple[str, ...]:
    """What a tag sweep always looks for on this backend: instances, unless it says otherwise (a
    Vertex backend has jobs and no instances)."""
    return tuple(getattr(backend, "sweep_kinds", ("instance",)))


def _order(kind: str) -> int:
    return KINDS[kind].release_order if kind in KINDS else RELEASE_IN_ORDER


def _reverse_kinds(entries: list[Resource]) -> list[str]:
    """Kinds in reverse order of their first creation (a template after the queue made before it),
    within each kind's ``release_order`` (groups first, firewall rules last)."""
    order: list[str] = []
    for entry in entries:
        if entry.kind not in order:
            order.append(entry.kind)
    order.reverse()
    return sorted(order, key=_order)


def store_get(store: Any, key: str) -> dict[str, Any] | None:
    """A dict from ``task_state_store`` (None when absent, unreadable or not a dict)."""
    if store is None:
        return None
    try:
        value = store.get(key)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def store_set(store: Any, key: str, value: dict[str, Any]) -> None:
    """Best-effort write to ``task_state_store``: the tag sweep covers a store that failed."""
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(key, value)

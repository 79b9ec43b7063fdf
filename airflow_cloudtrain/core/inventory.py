"""Every resource the provider left on a cloud, whatever run made it: what ``cloudtrain gc`` lists.

A ledger kind's finder (``core.ledger.ResourceKind.find``) answers for ONE run key; ``cloudtrain gc``
must see every run's resources at once, without knowing the run keys. So each cloud module registers,
next to its kind's finder, a *lister* here: one call (or one per zone) that returns every resource of
that kind carrying the provider's run tag, label or name (``ct-<digest>...``), as ``Tagged`` records
with what the listing shows: the run key digest, the run folder (when the resource carries
``TAG_RUN_URI``), its age, state and hourly price (instances: ``TAG_PRICE``).

Listers are keyed by provider (``aws``, ``gcp``, ``vertex``: a Vertex AI job is found through a
``VertexJobs`` backend, the others through the provider's ``RunBackend``) and by ledger kind name, so
a leftover is deleted through that kind's own deleter (``core.ledger.KINDS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

DIGEST = re.compile(r"^ct-([0-9a-f]{20})(?:-|$)")  # names made from a run key digest: ct-<digest>[-...]


@dataclass
class Tagged:
    """One resource of the provider, found by its run tag/label/name."""

    kind: str  # the ledger kind (``core.ledger.KINDS``): how it is deleted
    id: str  # what the kind's deleter takes (instance id/name, queue URL, parameter name, ...)
    location: str | None  # region, zone or project: the ledger entry's location
    digest: str | None  # the run key digest (None: ours by name, but the digest is unreadable)
    run_uri: str | None = None  # the run folder, when the resource carries TAG_RUN_URI
    created_at: float | None = None  # unix time; None when the API does not say
    state: str = ""
    hourly_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Lister = Callable[[Any], list[Tagged]]
LISTERS: dict[str, dict[str, Lister]] = {}  # provider -> kind -> lister


def register_lister(provider: str, kind: str, lister: Lister) -> Lister:
    """Make ``cloudtrain gc`` list every resource of ``kind`` on ``provider`` with ``lister(backend)``."""
    LISTERS.setdefault(provider, {})[kind] = lister
    return lister


def listers(provider: str) -> dict[str, Lister]:
    return dict(LISTERS.get(provider, {}))


def digest_in_name(name: str) -> str | None:
    """The run key digest of a name made from it (``ct-<digest>``, ``ct-<digest>-items``, ...)."""
    match = DIGEST.match(name.rsplit("/", 1)[-1])
    return match.group(1) if match else None


def timestamp(value: Any) -> float | None:
    """Unix time of what an API gives as a creation time: a datetime, an RFC 3339 string, epoch
    seconds or milliseconds (as a number or a string); None when absent or unreadable."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.timestamp() if value.year > 1970 else None
    if hasattr(value, "timestamp") and callable(value.timestamp):  # protobuf Timestamp / DatetimeWithNanos
        try:
            stamp = float(value.timestamp())
        except Exception:
            return None
        return stamp if stamp > 0 else None
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return number / 1000.0 if number > 1e11 else number  # milliseconds (SQS, our Pub/Sub label)


def price_of(tags: dict[str, str], key: str) -> float | None:
    """The hourly price in USD from a micro-USD tag value (``TAG_PRICE``)."""
    try:
        return int(tags[key]) / 1e6
    except (KeyError, ValueError, TypeError):
        return None

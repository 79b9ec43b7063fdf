"""The tolerant record loader every JSON record of the contract uses (stdlib only).

Records cross releases: a run folder written by the previous release is read by this one (a retry
after an upgrade adopts its run), and an agent of one version reads what an operator of another
wrote. So a record is built from the keys its dataclass knows, and keys it does not know (a newer
writer's) are ignored; missing ones take their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def load_known(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls(**data)`` for the fields ``cls`` (a dataclass) has; other keys are ignored."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})

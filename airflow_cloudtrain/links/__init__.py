"""Operator extra links: buttons on a task's page that open what the task made in the cloud console.

The classes are imported on first use (PEP 562): an operator module imports the one module of its
links, not all of them (DAG parsing stays cheap).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "CloudInstanceLink": "run",
    "RunFolderLink": "run",
    "WorkerGroupLink": "run",
    "VertexJobLink": "vertex",
}
__all__ = ["CloudInstanceLink", "RunFolderLink", "VertexJobLink", "WorkerGroupLink"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)

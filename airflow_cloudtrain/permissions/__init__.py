"""Least-privilege permissions for each operator, cloud provider and side, generated from the API calls
the test suite's runs make against the emulated clouds (``tests/data/api_calls.json``).

The documents live in ``permissions/data``, one per operator x provider x side:
``<Operator>.aws.airflow.json`` (an IAM policy for the role behind the ``aws_default`` connection),
``<Operator>.aws.instance.json`` (the instance profile's role), ``<Operator>.gcp.airflow.json`` (a custom
role for the ``google_cloud_default`` connection's service account) and ``<Operator>.gcp.instance.json``
(the VM's / Vertex AI job's service account). ``generate`` writes them; nothing edits them by hand
(``tests/unit/test_permissions.py``), and every test that runs an operator checks its calls against them
(``tests/api_calls_hook.py``). Stdlib only: the CLI and the tests read them without Airflow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
# The operators the documents are for, base classes last: a subclass is charged to the first it is.
OPERATORS: tuple[str, ...] = (
    "CheckpointResumeOperator",
    "CloudTrainOperator",
    "SpotFleetOperator",
    "PreemptibleGroupOperator",
    "MLEngineTrainOperator",
    "CloudTrainGcOperator",
)
SIDES: tuple[str, ...] = ("airflow", "instance")
PROVIDERS: tuple[str, ...] = ("aws", "gcp")


def operator_classes() -> list[type]:
    """The operator classes, imported on demand (Airflow)."""
    from airflow_cloudtrain import operators

    return [getattr(operators, name) for name in OPERATORS]


def operator_name(cls: type) -> str:
    """The documents' operator for an operator class (or a user's subclass of one)."""
    for klass in cls.__mro__:
        if klass.__name__ in OPERATORS:
            return klass.__name__
    raise ValueError(f"{cls.__name__} is none of {', '.join(OPERATORS)}")


def path(operator: str, provider: str, side: str) -> Path:
    return DATA / f"{operator}.{provider}.{side}.json"


@cache
def document(operator: str, provider: str, side: str) -> dict[str, Any] | None:
    """The generated document (IAM policy or custom role), or None when nothing is called there."""
    file = path(operator, provider, side)
    return json.loads(file.read_text()) if file.exists() else None


def granted(doc: Mapping[str, Any] | None) -> set[str]:
    """The IAM actions of a policy or the permissions of a custom role."""
    if doc is None:
        return set()
    if "includedPermissions" in doc:
        return set(doc["includedPermissions"])
    out: set[str] = set()
    for statement in doc.get("Statement", []):
        actions = statement["Action"]
        out.update([actions] if isinstance(actions, str) else actions)
    return out


def granted_anywhere(provider: str, side: str) -> set[str]:
    """Everything any operator's document grants on that provider and side."""
    out: set[str] = set()
    for operator in OPERATORS:
        out |= granted(document(operator, provider, side))
    return out


def missing(rows: Iterable[Mapping[str, str]], anywhere: bool = False) -> list[str]:
    """Calls (``operator, provider, side, service, operation``) whose permissions the documents lack:
    the calling operator's own document, or with ``anywhere`` every operator's of that provider and side
    (a permission no document grants at all)."""
    from airflow_cloudtrain.permissions.actions import permissions_for

    out = []
    for row in rows:
        need = permissions_for(row["provider"], row["service"], row["operation"])
        if anywhere:
            have = granted_anywhere(row["provider"], row["side"])
        else:
            have = granted(document(row["operator"], row["provider"], row["side"]))
        lacking = sorted(set(need) - have)
        if lacking:
            out.append(
                f"{row['operator']} ({row['provider']}, {row['side']} side) calls {row['service']} "
                f"{row['operation']}: needs {', '.join(lacking)}"
            )
    return sorted(set(out))

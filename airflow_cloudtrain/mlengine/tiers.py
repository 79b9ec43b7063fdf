"""Scale tiers and replica pools: ML Engine's cluster vocabulary as Vertex AI worker pools.

ML Engine described a cluster as a *scale tier* (a fixed cluster) or ``CUSTOM`` plus a master,
workers, parameter servers and evaluators. Vertex AI describes it as up to four ``workerPoolSpecs``
whose *position* is the role (0 chief, 1 workers, 2 parameter servers, 3 evaluators). This module
turns the first into the second and refuses, at DAG parse time, every combination ML Engine refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.mlengine.accelerators import parse_accelerator, parse_count
from airflow_cloudtrain.mlengine.machines import (
    LEGACY_MACHINES,
    TPU_MACHINE,
    MachineSpec,
    kind_of,
    machine_spec,
)

ROLES: tuple[str, ...] = ("chief", "worker", "parameter_server", "evaluator")

# ML Engine's scale tiers, as its documentation defines them: tier -> role -> (machine name, count).
# A tier fixes the whole cluster, which is why ML Engine refused master/worker/parameter-server/
# evaluator settings with any tier but CUSTOM (empty here: its cluster is whatever those say).
# BASIC_TPU's TPU v2 is only offered in a few regions (us-central1 among them; Vertex AI's locations
# page lists them), so a BASIC_TPU job elsewhere fails at submission, not here.
SCALE_TIERS: dict[str, dict[str, tuple[str, int]]] = {
    "BASIC": {"chief": ("standard", 1)},
    "STANDARD_1": {
        "chief": ("complex_model_s", 1),
        "worker": ("complex_model_s", 4),
        "parameter_server": ("standard", 3),
    },
    "PREMIUM_1": {
        "chief": ("complex_model_l", 1),
        "worker": ("complex_model_m", 19),
        "parameter_server": ("large_model", 11),
    },
    "BASIC_GPU": {"chief": ("standard_gpu", 1)},
    "BASIC_TPU": {"chief": ("standard", 1), "worker": (TPU_MACHINE, 1)},
    "CUSTOM": {},
}

# Per role: (machine field, count field or None for the chief's fixed 1, accelerator field, plural).
_FIELDS: dict[str, tuple[str, str | None, str, str]] = {
    "chief": ("master_type", None, "master_accelerator", "master"),
    "worker": ("worker_type", "worker_count", "worker_accelerator", "workers"),
    "parameter_server": (
        "parameter_server_type",
        "parameter_server_count",
        "parameter_server_accelerator",
        "parameter servers",
    ),
    "evaluator": ("evaluator_type", "evaluator_count", "evaluator_accelerator", "evaluators"),
}


@dataclass(frozen=True)
class ReplicaPool:
    """One Vertex worker pool: a role, its machine, how many replicas, and the name asked for."""

    role: str
    machine: MachineSpec
    count: int
    requested: str | None

    @property
    def index(self) -> int:
        """The pool's position in Vertex's ``workerPoolSpecs`` (the position is the role)."""
        return ROLES.index(self.role)

    def to_xcom(self) -> dict:
        return {
            "pool": f"workerpool{self.index}",
            "role": self.role,
            "machine_type": self.machine.machine_type,
            "accelerator_type": self.machine.accelerator_type,
            "accelerator_count": self.machine.accelerator_count,
            "count": self.count,
            "requested": self.requested,
        }


def _tier(scale_tier: Any) -> str:
    tier = scale_tier.strip().upper() if isinstance(scale_tier, str) else None
    if tier not in SCALE_TIERS:
        raise ValueError(f"scale_tier={scale_tier!r} is not a scale tier; accepted: {', '.join(SCALE_TIERS)}")
    return tier


def resolve_pools(
    scale_tier: str = "BASIC_GPU",
    master_type: str | None = None,
    worker_type: str | None = None,
    worker_count: int = 0,
    parameter_server_type: str | None = None,
    parameter_server_count: int = 0,
    evaluator_type: str | None = None,
    evaluator_count: int = 0,
    master_accelerator: Any = None,
    worker_accelerator: Any = None,
    parameter_server_accelerator: Any = None,
    evaluator_accelerator: Any = None,
) -> list[ReplicaPool]:
    """The Vertex worker pools of an ML Engine cluster, chief first, only pools with replicas.

    Raises ValueError, naming the argument and what it accepts, on anything ML Engine or Vertex AI
    would refuse: callers run this in an operator's constructor so a bad DAG fails to parse.
    """
    tier = _tier(scale_tier)
    types = {
        "chief": master_type,
        "worker": worker_type,
        "parameter_server": parameter_server_type,
        "evaluator": evaluator_type,
    }
    raw_counts = {
        "worker": worker_count,
        "parameter_server": parameter_server_count,
        "evaluator": evaluator_count,
    }
    counts = {role: parse_count(raw_counts[role], _FIELDS[role][1] or "") for role in raw_counts}
    raw_accels = {
        "chief": master_accelerator,
        "worker": worker_accelerator,
        "parameter_server": parameter_server_accelerator,
        "evaluator": evaluator_accelerator,
    }
    accels = {role: parse_accelerator(v, _FIELDS[role][2]) for role, v in raw_accels.items()}

    if tier != "CUSTOM":
        _refuse_custom_fields(tier, types, counts, raw_counts, raw_accels)
        return [
            ReplicaPool(role, machine_spec(name, None, _FIELDS[role][0], _FIELDS[role][2]), count, name)
            for role in ROLES
            if role in SCALE_TIERS[tier]
            for name, count in [SCALE_TIERS[tier][role]]
        ]

    if master_type is None:
        raise ValueError(
            "scale_tier='CUSTOM' needs master_type (the chief's machine); accepted: a legacy name such as "
            "'standard' or 'complex_model_m', or a Compute Engine type such as 'n1-standard-8'"
        )
    counts["chief"] = 1
    for role in ROLES[1:]:
        _check_pair(role, types[role], counts[role])
    for role in ROLES:
        if raw_accels[role] is not None and not counts[role]:
            field, count_field, acc_field, plural = _FIELDS[role]
            raise ValueError(
                f"{acc_field}={raw_accels[role]!r} is given but there are no {plural}; set {field} and "
                f"{count_field}, or drop {acc_field}"
            )
    kinds = {role: kind_of(str(types[role]), _FIELDS[role][0]) for role in ROLES if counts[role]}
    _check_no_mix(types, kinds)
    _check_tpu(types, kinds, counts)
    return [
        ReplicaPool(
            role,
            machine_spec(str(types[role]), accels[role], _FIELDS[role][0], _FIELDS[role][2]),
            counts[role],
            types[role],
        )
        for role in ROLES
        if counts[role]
    ]


def _refuse_custom_fields(
    tier: str, types: dict, counts: dict[str, int], raw_counts: dict, raw_accels: dict
) -> None:
    """ML Engine refused cluster settings with any tier but CUSTOM: the tier fixes the cluster."""
    fixed = ", ".join(f"{role} {count} x {name}" for role, (name, count) in SCALE_TIERS[tier].items())
    for role in ROLES:
        field, count_field, acc_field, _ = _FIELDS[role]
        given = [(field, types[role])]
        if count_field:
            given.append((count_field, raw_counts[role]) if counts[role] else (count_field, None))
        given.append((acc_field, raw_accels[role]))
        for name, value in given:
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} is only accepted with scale_tier='CUSTOM'; scale_tier={tier!r} fixes "
                    f"the whole cluster ({fixed}); set scale_tier='CUSTOM' and describe the cluster, or drop {name}"
                )


def _check_pair(role: str, machine: str | None, count: int) -> None:
    field, count_field, _, plural = _FIELDS[role]
    if count and machine is None:
        raise ValueError(
            f"{count_field}={count} needs {field} (the {plural}' machine); accepted: a legacy name such as "
            f"'complex_model_m' or a Compute Engine type such as 'n1-standard-8'"
        )
    if machine is not None and not count:
        raise ValueError(
            f"{field}={machine!r} is given with {count_field}=0; set {count_field} to 1 or more, or drop {field}"
        )


def _check_no_mix(types: dict, kinds: dict[str, str]) -> None:
    """ML Engine took legacy names or Compute Engine names for the whole cluster, never both
    (cloud-tpu goes with either)."""
    legacy = [r for r in ROLES if kinds.get(r) == "legacy"]
    ce = [r for r in ROLES if kinds.get(r) == "compute_engine"]
    if legacy and ce:
        lf, cf = _FIELDS[legacy[0]][0], _FIELDS[ce[0]][0]
        lname = types[legacy[0]].strip().lower()
        raise ValueError(
            f"{lf}={types[legacy[0]]!r} is a legacy ML Engine name but {cf}={types[ce[0]]!r} is a Compute "
            f"Engine type; master, workers, parameter servers and evaluators take either legacy names or "
            f"Compute Engine types, never a mix; e.g. write {lf}={LEGACY_MACHINES[lname].machine_type!r} "
            f"(the Compute Engine equivalent of {lname!r})"
        )


def _check_tpu(types: dict, kinds: dict[str, str], counts: dict[str, int]) -> None:
    """ML Engine ran Cloud TPU as exactly one worker (``workerType: cloud_tpu``, ``workerCount: 1``)."""
    for role, kind in kinds.items():
        field, count_field, _, _ = _FIELDS[role]
        if kind == "tpu" and role != "worker":
            raise ValueError(
                f"{field}={types[role]!r}: {TPU_MACHINE} is only accepted as worker_type (with worker_count=1); "
                f"for {field} use a CPU or GPU machine, e.g. 'n1-standard-8'"
            )
        if kind == "tpu" and counts[role] != 1:
            raise ValueError(
                f"{count_field}={counts[role]} with worker_type={types[role]!r}: a TPU job has exactly one TPU "
                f"worker; accepted: worker_count=1"
            )


def worker_pool_specs(pools: list[ReplicaPool]) -> list[dict]:
    """Vertex ``workerPoolSpecs`` (snake_case, without the container/python spec the operator adds).

    Position is the role, so a missing role before a present one is an empty ``{}`` (Vertex
    requires the placeholder); nothing follows the last present role.
    """
    by_index = {p.index: p for p in pools}
    if len(by_index) != len(pools):
        raise ValueError(f"two pools share a role: {[p.role for p in pools]}")
    last = max(by_index, default=-1)
    return [
        {"machine_spec": by_index[i].machine.to_api(), "replica_count": by_index[i].count}
        if i in by_index
        else {}
        for i in range(last + 1)
    ]

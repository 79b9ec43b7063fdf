"""Cloud ML Engine's training vocabulary, translated to Vertex AI custom-job worker pools.

Pure (standard library and the shipped catalog, no cloud SDK): ``MLEngineTrainOperator`` calls
``resolve_pools`` in its constructor, so a DAG with a bad cluster fails to parse, with a message
naming the argument and what it accepts, instead of failing at job submission.

- ``accelerators``: accelerator spellings -> Vertex enum names; the K80 note.
- ``machines``: legacy ML Engine machine names, Compute Engine names, GPU compatibility.
- ``tiers``: scale tiers -> ``ReplicaPool`` list -> ``workerPoolSpecs``.
- ``pricing``: per-replica-hour prices from the catalog snapshot (a job's cost estimate is
  ``lifecycle.vertex.cost``, through the one billing function).
- ``job``: ``JobConfig``, the checked arguments the Vertex engine submits.
"""

from __future__ import annotations

from airflow_cloudtrain.mlengine.accelerators import K80_REPLACEMENT_NOTE, parse_accelerator
from airflow_cloudtrain.mlengine.machines import LEGACY_MACHINES, MachineSpec
from airflow_cloudtrain.mlengine.pricing import hourly_price
from airflow_cloudtrain.mlengine.tiers import (
    ROLES,
    SCALE_TIERS,
    ReplicaPool,
    resolve_pools,
    worker_pool_specs,
)

__all__ = [
    "K80_REPLACEMENT_NOTE",
    "LEGACY_MACHINES",
    "ROLES",
    "SCALE_TIERS",
    "MachineSpec",
    "ReplicaPool",
    "hourly_price",
    "parse_accelerator",
    "resolve_pools",
    "worker_pool_specs",
]

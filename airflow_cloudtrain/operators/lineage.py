"""OpenLineage for every operator of the family, as Airflow's own providers give it (the Amazon
provider's SageMaker operators are the model): ``get_openlineage_facets_on_complete`` returns an
``OperatorLineage`` built from the task's XCom result and its arguments.

* outputs: the results folder and the checkpoint folder of the run, as datasets in the bucket
  (namespace ``s3://bucket`` / ``gs://bucket``, name the key prefix);
* inputs: the code tarball the run was given (the uploaded ``code/code.tar.gz`` of the run folder, a
  Vertex AI job's package, or ``code`` itself when it is an ``s3://``/``gs://`` URI) and every
  ``s3://``/``gs://`` URI among the values of ``env``;
* a run facet, ``cloudtrain``: cloud, instance type(s), nodes, attempts, interruptions, cost (USD).

The OpenLineage classes are imported inside the functions: the provider imports this module at DAG
parse time and must not pay for them. Reads only what the task already has (no API call: the
result the operator kept, ``EngineOperator.run_result``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from airflow_cloudtrain.contract.runs import CHECKPOINTS_PREFIX, CODE_KEY, RESULTS_PREFIX, join

_URI = re.compile(r"^(s3|gs)://([^/]+)/?(.*)$")


@functools.cache
def run_facet_class() -> type:
    """The ``cloudtrain`` run facet's class (made on first use: it needs the OpenLineage client)."""
    import attrs
    from openlineage.client.facet_v2 import RunFacet

    @attrs.define
    class CloudTrainRunFacet(RunFacet):
        """What the run was on and what it cost (``airflow_cloudtrain.operators.lineage``)."""

        cloud: str | None = attrs.field(default=None)
        instanceTypes: list[str] = attrs.field(factory=list)  # noqa: N815 (OpenLineage's camelCase)
        nodes: int | None = attrs.field(default=None)
        attempts: int | None = attrs.field(default=None)
        interruptions: int | None = attrs.field(default=None)
        costUsd: float | None = attrs.field(default=None)  # noqa: N815
        runUri: str | None = attrs.field(default=None)  # noqa: N815

    return CloudTrainRunFacet


def dataset(uri: str) -> Any:
    """An OpenLineage dataset for an ``s3://``/``gs://`` URI: namespace the bucket, name the key."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    scheme, bucket, key = _URI.match(uri).groups()  # type: ignore[union-attr]
    return Dataset(namespace=f"{scheme}://{bucket}", name=key.rstrip("/") or "/")


def _uris(*values: Any) -> list[str]:
    seen: list[str] = []
    for value in values:
        if isinstance(value, str) and _URI.match(value) and value.rstrip("/") not in seen:
            seen.append(value.rstrip("/"))
    return seen


def _result(operator: Any, task_instance: Any) -> dict[str, Any]:
    """The run's result: the one the operator kept (the listener extracts in the task's process or
    a ``fork()`` of it, where an XCom read goes through the task runner's supervisor channel, which
    a forked child must not use), else its XCom (a task that finished elsewhere)."""
    value = getattr(operator, "run_result", None)
    if value is None:
        try:
            value = task_instance.xcom_pull(task_ids=task_instance.task_id)
        except Exception:  # lineage must never fail the task
            return {}
    return value if isinstance(value, dict) else {}


def _rented(operator: Any, result: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(inputs, outputs, facet fields) of a run on rented instances (single, gang or work queue)."""
    run_uri = result.get("run_uri")
    code = getattr(operator, "code", None)
    inputs = _uris(code) or ([join(run_uri, CODE_KEY)] if run_uri and code else [])
    results = result.get("results_uri")
    if "items" in result:  # a work queue: each item's results under the run's results folder
        results = join(run_uri, RESULTS_PREFIX) if run_uri else None
        attempts = sum(int(i.get("attempts") or 0) for i in result["items"]) or None
        nodes = result.get("workers_launched")
        types = [result["instance_type"]] if result.get("instance_type") else []
    else:
        found = result.get("attempts")
        rows: list[dict[str, Any]] = found if isinstance(found, list) else []
        attempts = (
            (result.get("totals") or {}).get("attempts")
            or len({r.get("attempt") for r in rows})
            or (1 if result.get("instance_id") else None)  # one CloudTrainOperator run: one attempt
        )
        nodes = result.get("num_nodes") or (1 if result.get("instance_id") else None)
        types = sorted({r["instance_type"] for r in rows if r.get("instance_type")}) or (
            [result["instance_type"]] if result.get("instance_type") else []
        )
    outputs = _uris(results, join(run_uri, CHECKPOINTS_PREFIX) if run_uri else None)
    facet = {
        "cloud": result.get("cloud") or getattr(operator, "cloud", None),
        "instanceTypes": types,
        "nodes": nodes,
        "attempts": attempts,
        "interruptions": result.get("interruptions"),
        "costUsd": result.get("cost_usd"),
        "runUri": run_uri,
    }
    return inputs, outputs, facet


def _vertex(operator: Any, result: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(inputs, outputs, facet fields) of a Vertex AI job: its folder's model and checkpoints."""
    job_dir = result.get("job_dir")
    code = getattr(operator, "code", None)
    codes = code if isinstance(code, list) else [code]
    inputs = _uris(*codes)
    if not inputs and job_dir and code:  # a local folder: the package it was uploaded as
        inputs = _uris(*(result.get("package_uris") or [])) or [join(job_dir, "packages")]
    outputs = _uris(*(join(job_dir, sub) for sub in ("model", CHECKPOINTS_PREFIX))) if job_dir else []
    pools = result.get("replicas") or []
    facet = {
        "cloud": "vertex",
        "instanceTypes": sorted({p["machine_type"] for p in pools if p.get("machine_type")}),
        "nodes": sum(int(p.get("count") or 0) for p in pools) or None,
        "attempts": 1 if job_dir else None,
        "interruptions": None,  # Vertex AI restarts a preempted replica itself and does not say
        "costUsd": result.get("cost_usd"),
        "runUri": job_dir,
    }
    return inputs, outputs, facet


def facets_on_complete(operator: Any, task_instance: Any) -> Any:
    """The operator's ``OperatorLineage`` once its task succeeded."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    result = _result(operator, task_instance)
    vertex = "job_dir" in result or type(operator).__name__ == "MLEngineTrainOperator"
    inputs, outputs, facet = (_vertex if vertex else _rented)(operator, result)
    env = getattr(operator, "env", None) or {}
    inputs += [u for u in _uris(*env.values()) if u not in inputs] if isinstance(env, dict) else []
    return OperatorLineage(
        inputs=[dataset(u) for u in inputs],
        outputs=[dataset(u) for u in outputs],
        run_facets={"cloudtrain": run_facet_class()(**facet)} if result else {},
    )

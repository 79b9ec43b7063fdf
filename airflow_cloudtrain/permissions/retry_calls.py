"""A retry's calls, taken from the code instead of the record of a test run.

A work-queue operator's retry (``SpotFleetOperator``, ``PreemptibleGroupOperator``) deletes the outcome
of every item an earlier try recorded as failed, so that item gets a fresh chance
(``lifecycle/fleet/run.py``). A recording run makes that call only when a test's earlier try left a
failed item, which depends on timing: ``SpotFleetOperator``'s recorded document lacked
``s3:DeleteObject`` while its Google Cloud twin had ``storage.objects.delete``, and a real retry would
have been refused (the suite warned of it, "permission missing from its operator's document"). So the
generator adds the run folder's delete (``storage.DELETE_CALLS``) to the Airflow side of every
work-queue operator, on each provider the record shows it ran on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def work_queue_operators() -> set[str]:
    """The documents' operators that run a work queue (subclasses of ``WorkQueueOperator``)."""
    from airflow_cloudtrain.operators.work_queue import WorkQueueOperator
    from airflow_cloudtrain.permissions import operator_classes, operator_name

    return {operator_name(cls) for cls in operator_classes() if issubclass(cls, WorkQueueOperator)}


def needed(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The record's calls with the run folder's delete on the Airflow side of every work-queue operator,
    where the record shows its Airflow side ran on that provider."""
    from airflow_cloudtrain.storage import DELETE_CALLS

    out = [dict(row) for row in rows]
    queues = work_queue_operators()
    ran = sorted({(r["operator"], r["provider"]) for r in out if r["side"] == "airflow"})
    for operator, provider in ran:
        if operator in queues:
            out += [
                {"operator": operator, "provider": provider, "side": "airflow", "service": s, "operation": o}
                for s, o in DELETE_CALLS[provider]
            ]
    return out

"""The run folder's deletes, taken from the code instead of the record of a test run.

Two deletes are made only on some paths, so a recording run may or may not see them, depending on its
timing, and a real run would be refused where the document lacks them (the suite warns of such a call,
"permission missing from its operator's document"):

- A work-queue operator's retry (``SpotFleetOperator``, ``PreemptibleGroupOperator``) deletes the
  outcome of every item an earlier try recorded as failed, so that item gets a fresh chance
  (``lifecycle/fleet/run.py``): ``storage.DELETE_CALLS`` on the Airflow side. ``SpotFleetOperator``'s
  recorded EC2 document lacked ``s3:DeleteObject`` while its Google Cloud twin had it.
- An agent clears a checkpoint version's folder before uploading it (``agent/checkpoints.py``: what an
  agent killed mid-upload left), aborting S3's incomplete multipart uploads first:
  ``storage.DELETE_PREFIX_CALLS`` on the instance side of every operator whose instances run the agent.
  ``CloudTrainOperator``'s recorded EC2 instance document lacked ``s3:ListBucketMultipartUploads`` and
  ``s3:DeleteObject``, and every document ``s3:AbortMultipartUpload``: a job that writes checkpoints
  would have had its upload refused.

Each is added on each provider the record shows the operator's side ran on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def work_queue_operators() -> set[str]:
    """The documents' operators that run a work queue (subclasses of ``WorkQueueOperator``)."""
    from airflow_cloudtrain.operators.work_queue import WorkQueueOperator
    from airflow_cloudtrain.permissions import operator_classes, operator_name

    return {operator_name(cls) for cls in operator_classes() if issubclass(cls, WorkQueueOperator)}


def needed(rows: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """The record's calls with a work-queue retry's delete (Airflow side) and a checkpoint upload's
    folder clear (instance side) where the record shows that side ran on that provider."""
    from airflow_cloudtrain.storage import DELETE_CALLS, DELETE_PREFIX_CALLS

    out = [dict(row) for row in rows]
    queues = work_queue_operators()
    ran = sorted({(r["operator"], r["provider"], r["side"]) for r in out})
    for operator, provider, side in ran:
        calls: tuple[tuple[str, str], ...] = ()
        if side == "airflow" and operator in queues:
            calls = DELETE_CALLS[provider]
        elif side == "instance":
            calls = DELETE_PREFIX_CALLS[provider]
        out += [
            {"operator": operator, "provider": provider, "side": side, "service": s, "operation": o}
            for s, o in calls
        ]
    return out

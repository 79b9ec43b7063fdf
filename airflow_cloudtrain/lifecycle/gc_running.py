"""``cloudtrain gc --bucket``: the bucket's running index entries that no longer stand for an attempt in
flight (``lifecycle.cost_index``: ``_cloudtrain/running/<run id>-<instance id>.json``).

An attempt's release deletes its entry; a task killed between its launch and its release, or a
release cut short, leaves one behind. The Cloud training page already drops such entries when it
reads them (``cost_index.stale_reason``), but they pile up: ``gc`` lists them beside the cloud's
leftovers, as kind ``running_index``, and deletes those older than ``--older-than`` under the same
decision table (an entry whose agent ended is a finished run; one whose agent never published, or a
fleet's or Vertex AI job's entry that its wait stopped refreshing, is decided by age alone: for the
latter, the time since its last refresh). An entry of a run in flight is not listed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_cloudtrain.lifecycle.cost_index import (
    AGENT_ENDED,
    RUNNING_PREFIX,
    live_markers,
    read_running,
    running_key,
    stale_reason,
)
from airflow_cloudtrain.lifecycle.leftovers import FINISHED, UNKNOWN, Leftover, decide

if TYPE_CHECKING:
    from airflow_cloudtrain.storage import RunFolder

KIND = "running_index"


def stale_entries(folder: RunFolder, older_than_s: float, now: float) -> list[Leftover]:
    """The stale running index entries of the bucket ``folder`` is, each with ``gc``'s decision."""
    records = read_running(folder)
    if not records:
        return []
    live = live_markers(folder)
    out = []
    for record in records:
        why = stale_reason(record, live, now)
        if why is None:
            continue  # an attempt in flight
        lease = FINISHED if why == AGENT_ENDED else UNKNOWN
        # a fleet's or a Vertex job's record: its age is its silence (its wait rewrote it until then)
        last = record.updated_at or record.launched_at or record.released_at
        age = max(0.0, now - float(last))
        action, because = decide(lease, age, older_than_s)
        out.append(
            Leftover(
                KIND,
                running_key(record.run_id, record.instance_id)[len(RUNNING_PREFIX) :],
                folder.uri,
                None,
                record.run_uri,
                age,
                why,
                record.hourly_usd,
                lease,
                action,
                because,
            )
        )
    return out


def delete_entries(folder: RunFolder, doomed: list[Leftover]) -> None:
    """Delete the entries marked ``delete``, each on its own (``result`` says how it went)."""
    for entry in doomed:
        try:
            folder.delete_key(RUNNING_PREFIX + entry.id)
        except Exception as err:
            entry.result = f"failed: {err}"
        else:
            entry.result = "deleted"

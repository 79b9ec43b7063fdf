"""status.json and heartbeats: the agent's side of what the operator polls.

The status is rewritten on every change by the main thread and, on a notice, by the metadata
watcher, so writes are serialised here; and once a final state is written nothing follows it,
because observers take a final status to mean that logs and results are complete.

A failed write of a non-final change or a heartbeat is only logged (the next change / beat carries
it); the runner writes the final status through ``agent.retry.retry``, which replaced the fixed
five tries that lived here.

With a live index (``RunSpec.live_uri``; ``agent.beacon``) every non-final change also rewrites the
instance's beacon, and the heartbeat is the live index's ``<instance-id>.beat`` instead of the
``heartbeat`` file; the runner writes the final beacon after the final status.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from airflow_cloudtrain.agent.beacon import BeaconWriter
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder

log = logging.getLogger("cloudtrain.agent")


class StatusWriter:
    """Holds the current ``RunStatus`` of one instance and writes it to the run folder."""

    def __init__(self, folder: RunFolder, instance_id: str, started_at: float) -> None:
        self.folder = folder
        self.status = runs.RunStatus(runs.STARTING, instance_id, started_at=started_at)
        self.beacon: BeaconWriter | None = None  # set when the run has a live index
        self._lock = threading.Lock()

    def update(self, raise_errors: bool = False, **changes: Any) -> None:
        """Apply ``changes`` and rewrite status.json; a no-op once a final state was written.

        A failed write of a non-final change is kept in memory (the next write carries it); a failed
        write with ``raise_errors`` raises and is not kept, so the caller can retry it.
        """
        with self._lock:
            if self.status.final:
                return
            new = replace(self.status, **changes, updated_at=time.time())
            try:
                self.folder.put_text(runs.status_key(new.instance_id), new.to_json())
            except Exception as err:
                if raise_errors:
                    raise
                log.warning(
                    "status write failed (%s: %s); the next change rewrites it", type(err).__name__, err
                )
            self.status = new
            if self.beacon is not None and not new.final:  # the final one: the runner, after this
                self.beacon.publish()

    def beat(self) -> None:
        """Heartbeat: the operator tells a dead agent from a slow job by this timestamp (the live
        index's ``<instance-id>.beat`` with a live index, else the ``heartbeat`` file). Raises when
        the write fails."""
        if self.beacon is not None:
            try:
                self.beacon.beat()
                return
            except Exception:
                # the live index cannot be written (e.g. a role scoped to the run folder): the
                # operator, before declaring the run lost, also reads the heartbeat file
                self.folder.put_text(runs.heartbeat_key(self.status.instance_id), f"{time.time():.3f}")
                raise
        else:
            self.folder.put_text(runs.heartbeat_key(self.status.instance_id), f"{time.time():.3f}")

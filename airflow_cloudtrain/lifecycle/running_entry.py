"""A fleet's or a Vertex AI job's record in the bucket's running index (``lifecycle.cost_index``),
kept by whoever waits for it: the worker's blocking wait or the triggerer.

Single runs' attempts are told live by their agent's beacon in the live index; a fleet (many workers
coming and going) and a Vertex job (no agent of ours) have none, so their record carries its own
sign of life: ``updated_at``, rewritten when what the page shows changes (the workers running, their
price per hour) and otherwise at most every ``REFRESH_S``, so a wait that polls every 10 s costs one
small write per ten minutes. A record not refreshed for ``SILENT_AFTER_S`` stands for a run nobody
watches any more (``cost_index.stale_reason``): the page drops it and ``cloudtrain gc`` deletes it.

The record also carries what was spent by ``updated_at`` (``cost_usd``); the page adds the price per
hour since. Every write and the delete are best effort: a refused write costs the page a row, never
the run. The entry is plain JSON (``to_dict``), so it crosses into the triggerer in the wait's handle.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.lifecycle.cost_index import (
    REFRESH_S,
    RUNNING,
    SILENT_AFTER_S,
    CostRecord,
    clear_running,
    write_record,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.runs import RunKey
    from airflow_cloudtrain.storage import RunFolder

__all__ = ["REFRESH_S", "SILENT_AFTER_S", "RunningEntry", "cost_so_far"]


@dataclass
class RunningEntry:
    """One watched run's in-flight record and the bucket it lives in."""

    bucket: str  # the bucket's URI (the run's ``config.bucket``)
    record: CostRecord

    def to_dict(self) -> dict[str, Any]:
        return {"bucket": self.bucket, "record": dataclasses.asdict(self.record)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RunningEntry | None:
        if not data or not data.get("bucket") or not isinstance(data.get("record"), dict):
            return None
        fields = {f.name for f in dataclasses.fields(CostRecord)}
        return cls(str(data["bucket"]), CostRecord(**{k: data["record"].get(k) for k in fields}))

    @classmethod
    def of(
        cls,
        bucket: str,
        key: RunKey,
        *,
        operator: str,
        run_id: str,
        run_uri: str,
        cloud: str,
        name: str,
        instance_type: str | None,
        nodes: int,
        spot: bool,
        hourly_usd: float | None,
        started_at: float,
    ) -> RunningEntry:
        """A run launched now: ``name`` (the group, the job) stands in for the instance."""
        return cls(
            bucket,
            CostRecord(
                dag_id=key.dag_id,
                task_id=key.task_id,
                airflow_run_id=key.run_id,
                map_index=key.map_index,
                run_id=run_id,
                run_uri=run_uri,
                cloud=cloud,
                instance_id=name,
                instance_type=instance_type,
                num_nodes=nodes,
                spot=spot,
                state=RUNNING,
                interrupted=False,
                launched_at=started_at,
                released_at=started_at,
                cost_usd=0.0,
                cost_basis="",
                hourly_usd=None if hourly_usd is None else round(hourly_usd, 6),
                operator=operator,
                updated_at=started_at,
            ),
        )

    def write(self, folder: RunFolder, log: logging.Logger) -> None:
        """Write the record as it is (``folder``: any folder of the bucket's cloud, whose clients
        ``at`` reuses; best effort, as ``write_record`` is)."""
        write_record(folder.at(self.bucket), self.record, log)

    def update(
        self,
        folder: RunFolder,
        log: logging.Logger,
        now: float,
        nodes: int | None = None,
        hourly_usd: float | None = None,
        spent_usd: float | None = None,
        instance_type: str | None = None,
    ) -> bool:
        """Rewrite the record when what the page shows changed (nodes, price per hour, type) or when
        ``REFRESH_S`` passed since the last write; whether it wrote. ``spent_usd``: the cost by
        ``now`` (kept as the record's ``cost_usd``; None: the last one plus the price per hour since)."""
        r = self.record
        shown = (
            r.num_nodes if nodes is None else nodes,
            r.hourly_usd if hourly_usd is None else round(hourly_usd, 6),
            r.instance_type if instance_type is None else instance_type,
        )
        changed = shown != (r.num_nodes, r.hourly_usd, r.instance_type)
        if not changed and not self.due(now):
            return False
        if spent_usd is None:
            spent_usd = cost_so_far(r, now)
        self.record = dataclasses.replace(
            r,
            num_nodes=shown[0],
            hourly_usd=shown[1],
            instance_type=shown[2],
            cost_usd=None if spent_usd is None else round(spent_usd, 6),
            updated_at=now,
        )
        self.write(folder, log)
        return True

    def due(self, now: float) -> bool:
        """Is the refresh due (``REFRESH_S`` since the last write)? No I/O: the triggerer asks first."""
        return now - float(self.record.updated_at or 0.0) >= REFRESH_S

    def clear(self, folder: RunFolder, log: logging.Logger) -> None:
        """Out of the running index (the run was released, or priced): best effort."""
        clear_running(folder.at(self.bucket), self.record.run_id, self.record.instance_id, log)


def cost_so_far(record: CostRecord, now: float | None = None) -> float | None:
    """A watched record's cost by ``now``: what was spent by its last write plus its price per hour
    since (per second; the minimum was already counted in the spent part)."""
    now = time.time() if now is None else now
    if record.updated_at is None or record.cost_usd is None:
        return None
    since = max(0.0, now - float(record.updated_at))
    return round(float(record.cost_usd) + float(record.hourly_usd or 0.0) * since / 3600.0, 6)

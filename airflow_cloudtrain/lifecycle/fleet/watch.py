"""The wait of a fleet run: scale from the backlog, notice outcomes and workers, decide when it is over.

One ``poll`` makes a fixed handful of calls whatever the number of items: GetQueueAttributes,
DescribeAutoScalingGroups, DescribeInstances of the group's members (one filtered call), a listing of
``outcomes/`` and a read of each outcome that is new. The blocking wait and the trigger run the same
``FleetWatch``, so scaling and the end are decided the same way in both modes.

Scaling: the group's desired capacity is raised to ``min(max_workers, visible + in-flight)`` whenever
that is more than it is; it is never lowered from here. Workers lower it themselves: one that finds
the queue empty drops its scale-in protection and leaves with "decrement desired capacity", so a
busy worker is never scaled in, and the group shrinks to 0 as the queue empties.

The end: every item has an outcome (``outcomes/<id>.json``), or the queue has been empty (nothing
visible, in flight or delayed) on two polls in a row; an item without an outcome then went to the
dead-letter queue after ``max_item_attempts`` deliveries whose workers vanished, and is failed.

Cost: each worker's lifetime (its launch to its end: the worker's own record, else when the watch saw
it end, else now) is billed on its own (per second, 60 s minimum). The result delivered at the end
prices a spot worker at what it was charged when the cloud can say (``charged``: EC2's spot price
history of the worker's zone, GCE Spot's SKU price; ``core.billing.instance_cost``, the same function
as a single run's attempts), else at the price of its instance type in the market the group buys (the
budget's projection during the run always uses that price).

An item that failed for good is logged with the last lines of its output (``item_log_tail``: one
listing and the newest chunks of that item's log, read once), as a single run's task log shows its job's.

On GCP (``clouds.gcp.fleet``) Pub/Sub has no backlog call (``depth`` is None): the backlog is the
items without an outcome, the run ends when each has one, and each poll also pulls the dead-letter
subscription: an item that arrives there without an outcome (its deliveries ran out on workers that
vanished) is given a failed one, so the end still comes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from math import fsum
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract import workqueue
from airflow_cloudtrain.contract.runs import log_prefix, log_seq, split_stamp
from airflow_cloudtrain.contract.workqueue import ItemOutcome, WorkerRecord
from airflow_cloudtrain.core.billing import (
    INSTANCE_MINIMUM_S,
    PriceHistory,
    billed_seconds,
    billed_usd,
    instance_cost,
)
from airflow_cloudtrain.core.cloud import ALIVE_STATES, RUNNING
from airflow_cloudtrain.core.lease import LeaseRenewer
from airflow_cloudtrain.lifecycle.fleet.handle import FleetHandle
from airflow_cloudtrain.lifecycle.running_entry import RunningEntry

# (instance type, zone, spot, start, end) -> the prices charged, or None: ``RunBackend.charged_prices``
Charged = Callable[[str, "str | None", bool, float, float], "PriceHistory | None"]

if TYPE_CHECKING:
    from airflow_cloudtrain.core.cloud import Instance
    from airflow_cloudtrain.core.fleet import FleetBackend
    from airflow_cloudtrain.storage import RunFolder

EMPTY_POLLS_TO_END = 2
ITEM_TAIL_LINES = 20  # a failed item's last lines shown in the task log (``item_log_tail``)


class FleetFailed(RuntimeError):
    """The fleet cannot finish: no worker starts, or its group is gone."""


def read_outcomes(folder: RunFolder, known: set[str]) -> dict[str, ItemOutcome]:
    """The outcomes in the run folder whose item id is not in ``known``."""
    out: dict[str, ItemOutcome] = {}
    for key in folder.list(workqueue.OUTCOMES_PREFIX + "/"):
        item = key.rsplit("/", 1)[-1].removesuffix(".json")
        if item in known or not key.endswith(".json"):
            continue
        raw = folder.get_text(key)
        if raw:
            out[item] = ItemOutcome.from_json(raw)
    return out


def item_log_tail(folder: RunFolder, outcome: ItemOutcome, limit: int = ITEM_TAIL_LINES) -> list[str]:
    """The last ``limit`` lines its attempt's job wrote (stamped), from the log chunks the item's
    agent uploaded to ``items/<id>/instances/<attempt>/logs/``: secrets are already cut out there (the
    agent redacts every chunk). Reads chunks from the newest back, only as many as the lines need."""
    if not outcome.instance_id or outcome.attempt == "dead-letter":  # no attempt ran to an end
        return []
    prefix = f"{workqueue.item_prefix(outcome.id)}/{log_prefix(outcome.attempt)}"
    keys = sorted((k for k in folder.list(prefix) if k.endswith(".log")), key=log_seq)
    lines: list[str] = []
    for key in reversed(keys):
        lines = (folder.get_text(key) or "").splitlines() + lines
        if len(lines) >= limit:
            break
    return lines[-limit:]


class FleetWatch:
    """One fleet's wait, the same in the worker and in the triggerer: ``poll`` until it says over,
    then ``refresh`` and ``result``."""

    def __init__(
        self,
        handle: FleetHandle,
        cloud: FleetBackend,
        folder: RunFolder,
        log: logging.Logger,
        startup_timeout: float | None = 1800.0,
        clock: Callable[[], float] = time.time,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.handle = handle
        self.cloud = cloud
        self.folder = folder
        self.log = log
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        # worker -> the start of the record whose silence replaced it (``_replace_silent``): a GCE
        # group makes the VM again under its name, whose new agent writes a record of its own
        self.replaced: dict[str, float] = {}
        self._silent_checked = 0.0
        self.clock = clock
        self.outcomes: dict[str, ItemOutcome] = {}
        self.members: dict[str, Instance] = {}  # instance id -> Instance (any state)
        self.ended_seen: dict[str, float] = {}
        self.empty_polls = 0
        self.last_progress = clock()
        # the fleet's lease: its workers leave once nobody renewed it (``agent.worker``)
        self.lease = LeaseRenewer(folder, handle.orphan_timeout_s, "fleet", log)
        # its record in the bucket's running index (None: a handle of an earlier release)
        self.index = RunningEntry.from_dict(handle.index)

    # --- one poll --------------------------------------------------------------------------------

    def poll(self) -> bool:
        """One round; True when the run is over. Raises ``FleetFailed`` when it cannot finish."""
        handle, cloud = self.handle, self.cloud
        now = self.clock()
        self.lease.renew()  # when due
        depth = cloud.depth(handle.queue)
        group = cloud.group(handle.group)
        if group is None:
            raise FleetFailed(f"the worker group {handle.group} no longer exists")
        self._members(cloud.members(handle.run_key), now)
        self._index(now)
        self._replace_silent(now)
        self._fail_dead_letters(cloud.take_dead_letters(handle.dead_letter))
        new = read_outcomes(self.folder, set(self.outcomes))
        for item_id in sorted(new):
            self._log_outcome(new[item_id])
        self.outcomes.update(new)
        if new or any(m.state in ALIVE_STATES for m in self.members.values()):
            self.last_progress = now
        if len(self.outcomes) >= len(handle.item_ids):
            return True
        if depth is None:  # no backlog API (Pub/Sub): what has no outcome yet is the backlog
            backlog = len(handle.item_ids) - len(self.outcomes)
            waiting = f"{backlog} item(s) without an outcome"
        else:
            self.empty_polls = self.empty_polls + 1 if depth.total == 0 else 0
            if self.empty_polls >= EMPTY_POLLS_TO_END:
                return True
            backlog = depth.backlog
            waiting = f"{depth.visible} item(s) waiting, {depth.in_flight} running"
        target = self.within_budget(min(handle.max_workers, backlog), group.desired, now)
        if target > group.desired:
            cloud.set_desired(handle.group, target)
            self.log.info("Scaling %s to %d worker(s): %s", handle.group, target, waiting)
        if self.startup_timeout and now - self.last_progress > self.startup_timeout:
            raise FleetFailed(
                f"no worker of {handle.group} ran for {self.startup_timeout:.0f} s while "
                f"{backlog} item(s) waited (capacity, quota or a bid below the spot price?)"
            )
        return False

    def within_budget(self, target: int, desired: int, now: float) -> int:
        """``max_cost``: the run ends (``FleetFailed``, which deletes the group: its workers get SIGTERM and
        checkpoint their items) once its cost by the next poll would pass the budget, and the group grows
        only by the workers whose first (billed) minute the budget still covers."""
        budget, handle = self.handle.max_cost_usd, self.handle
        if budget is None:
            return target
        spent, _ = self.cost({}, now)
        alive = [m for m in self.members.values() if m.state in ALIVE_STATES]
        running = fsum(handle.prices.get(m.instance_type, 0.0) for m in alive)
        projected = spent + running * handle.poll_interval / 3600.0
        if projected >= budget:
            raise FleetFailed(
                f"max_cost=${budget:g} reached: ${spent:.4f} spent by the fleet's workers, {len(alive)} running at "
                f"${running:g}/h would pass it by the next poll; the group is deleted (its workers checkpoint "
                "their items) and the items without an outcome are left undone"
            )
        price = max(handle.prices.values(), default=0.0)
        if target <= desired or price <= 0:
            return target
        affordable = int((budget - projected) // billed_usd(price, INSTANCE_MINIMUM_S))
        if desired + affordable < target:
            self.log.warning(
                "Not growing %s past %d worker(s): max_cost=$%g leaves $%.4f, and a worker bills at least $%.4f",
                handle.group,
                desired + affordable,
                budget,
                budget - projected,
                billed_usd(price, INSTANCE_MINIMUM_S),
            )
            return desired + affordable
        return target

    def _index(self, now: float) -> None:
        """Keep the running index's record current: rewritten when the workers running or their price
        per hour changed, else every ``running_entry.REFRESH_S`` (best effort)."""
        if self.index is None:
            return
        alive = [m for m in self.members.values() if m.state in ALIVE_STATES]
        types = Counter(m.instance_type for m in alive)
        self.index.update(
            self.folder,
            self.log,
            now,
            nodes=len(alive),
            hourly_usd=fsum(self.handle.prices.get(m.instance_type, 0.0) for m in alive),
            spent_usd=self.cost({}, now)[0],
            instance_type=types.most_common(1)[0][0] if types else None,
        )

    def _fail_dead_letters(self, letters: list[tuple[str, int]]) -> None:
        """Items that reached the dead-letter subscription without an outcome fail for good (first
        writer wins, as for the workers' outcomes)."""
        for body, deliveries in letters:
            try:
                item_id, _, interruptions = workqueue.decode_message(body)
            except (ValueError, KeyError, TypeError):
                self.log.warning("A malformed message reached the dead-letter queue: %.80r", body)
                continue
            key = workqueue.outcome_key(item_id)
            if self.folder.get_text(key) is not None:
                continue
            outcome = ItemOutcome(
                id=item_id,
                state=workqueue.FAILED,
                attempt="dead-letter",
                instance_id="",
                exit_code=None,
                message=f"no result after {deliveries or 'several'} deliveries: its workers vanished "
                "(it is in the dead-letter queue)",
                attempts=deliveries or 1,
                interruptions=interruptions,
            )
            self.folder.put_text(key, outcome.to_json())

    def _members(self, found: list[Instance], now: float) -> None:
        for inst in found:
            before = self.members.get(inst.id)
            self.members[inst.id] = inst
            if before is None and inst.state in ALIVE_STATES:
                market = "spot" if inst.spot else "on-demand"
                self.log.info(
                    "Worker %s started (%s, %s, %s)", inst.id, inst.instance_type, market, inst.zone
                )
            if inst.state not in ALIVE_STATES and inst.id not in self.ended_seen:
                self.ended_seen[inst.id] = now
                why = "reclaimed (spot interruption)" if inst.preempted else "ended"
                self.log.info("Worker %s %s", inst.id, why)

    def _replace_silent(self, now: float) -> None:
        """A running worker whose record (its heartbeat: ``agent.worker`` rewrites it every few
        seconds) has not changed for ``heartbeat_timeout``: its agent died while its machine runs on,
        so it takes no item and would hold its place in the group for good. The group replaces it;
        the item it held comes back after its lease. Checked every third of the timeout (a listing
        and a read per worker). A worker that never wrote its record (its agent never started: a
        bootstrap that failed, an image without Python, a bucket it cannot write) is replaced the same
        way once it has run ``startup_timeout`` since its launch: ``startup_timeout`` alone never
        fires while it runs, since a running member counts as progress."""
        timeout = self.heartbeat_timeout
        if not timeout or now - self._silent_checked < timeout / 3:
            return
        self._silent_checked = now
        try:  # a record missing because the bucket could not be read is no sign of a dead agent
            records = self._worker_records(strict=True)
        except Exception as err:
            self.log.info("Could not read the workers' records (%s); checking them again later", err)
            return
        for iid, inst in sorted(self.members.items()):
            record = records.get(iid)
            if inst.state == RUNNING and record is None:
                self._replace_unstarted(iid, inst, now)
            if inst.state != RUNNING or record is None or record.ended_at:
                continue
            if self.replaced.get(iid) == record.started_at:  # replaced; its successor not started yet
                continue
            silent = now - (record.updated_at or record.started_at)
            if silent <= timeout:
                continue
            self.log.warning(
                "Worker %s stopped beating %.0f s ago (heartbeat_timeout=%.0fs): its agent is gone; "
                "replacing it",
                iid,
                silent,
                timeout,
            )
            self._replace(iid, record.started_at)

    def _replace_unstarted(self, iid: str, inst: Instance, now: float) -> None:
        """A running worker with no record ``startup_timeout`` after its launch (``_replace_silent``)."""
        launched, limit = inst.launch_time, self.startup_timeout
        if not launched or not limit or now - launched <= limit or self.replaced.get(iid) == launched:
            return
        self.log.warning(
            "Worker %s has run %.0f s without writing its record (startup_timeout=%.0fs): its agent "
            "never started; replacing it",
            iid,
            now - launched,
            limit,
        )
        self._replace(iid, launched)

    def _replace(self, iid: str, since: float) -> None:
        """Have the group replace ``iid``; ``since`` tells this worker from its successor under the
        same name (a GCE group's recreated VM)."""
        try:
            self.cloud.replace_member(self.handle.group, iid)
        except Exception as err:  # the next check tries again
            self.log.warning("Could not replace worker %s: %s", iid, err)
        else:
            self.replaced[iid] = since

    def _log_outcome(self, outcome: ItemOutcome) -> None:
        where = f"on {outcome.instance_id}, delivery {outcome.attempts}"
        if outcome.state == workqueue.SUCCEEDED:
            self.log.info("Item %s succeeded %s", outcome.id, where)
        else:
            self.log.warning(
                "Item %s failed for good %s: %s", outcome.id, where, outcome.message or outcome.exit_code
            )
            self._log_tail(outcome)

    def _log_tail(self, outcome: ItemOutcome) -> None:
        """The failed item's last lines under its outcome, as a single run's log shows the job's."""
        try:
            lines = item_log_tail(self.folder, outcome)
        except Exception as err:  # the outcome is what matters: a log that cannot be read is only noted
            self.log.info("Item %s: its log could not be read (%s: %s)", outcome.id, type(err).__name__, err)
            return
        if lines:
            self.log.info("Item %s: the last %d line(s) of its output:", outcome.id, len(lines))
        for line in lines:
            stamp, text = split_stamp(line)
            self.log.info("[item %s%s] %s", outcome.id, f" {stamp[11:23]}" if stamp else "", text)

    # --- the result ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read what a result needs (after a deferral the watch starts empty)."""
        now = self.clock()
        with contextlib.suppress(Exception):
            self._members(self.cloud.members(self.handle.run_key), now)
        self.outcomes.update(read_outcomes(self.folder, set(self.outcomes)))

    def result(self, charged: Charged | None = None) -> dict[str, Any]:
        """The XCom: per item outcome, worker count, interruptions and cost (``cost``: with ``charged``,
        each spot worker at the prices it was charged)."""
        handle, now = self.handle, self.clock()
        duplicates = Counter(
            key.split("/")[1]
            for key in self.folder.list(workqueue.DUPLICATES_PREFIX + "/")
            if key.count("/") >= 2
        )
        items, failed = [], []
        for item_id in handle.item_ids:
            outcome = self.outcomes.get(item_id)
            if outcome is None:
                failed.append(item_id)
                items.append(
                    {
                        "id": item_id,
                        "state": workqueue.FAILED,
                        "exit_code": None,
                        "attempts": None,
                        "instance_id": None,
                        "results_uri": None,
                        "message": "no result: its deliveries ran out on workers that vanished "
                        "(it is in the dead-letter queue)",
                        "duplicate_runs": duplicates.get(item_id, 0),
                    }
                )
                continue
            if outcome.state != workqueue.SUCCEEDED:
                failed.append(item_id)
            items.append(
                {
                    "id": item_id,
                    "state": outcome.state,
                    "exit_code": outcome.exit_code,
                    "attempts": outcome.attempts,
                    "interruptions": outcome.interruptions,
                    "instance_id": outcome.instance_id,
                    "results_uri": outcome.results_uri,
                    "message": outcome.message,
                    "duplicate_runs": duplicates.get(item_id, 0),
                }
            )
        records = self._worker_records()
        cost, basis = self.cost(records, now, charged)
        types = Counter(m.instance_type for m in self.members.values())
        return {
            "run_id": handle.run_id,
            "run_uri": handle.run_uri,
            "cloud": handle.cloud,
            "region": handle.region,
            "zone": None,
            "instance_type": types.most_common(1)[0][0] if types else None,
            "exit_code": 1 if failed else 0,
            "items_total": len(handle.item_ids),
            "items_succeeded": len(handle.item_ids) - len(failed),
            "items_failed": failed,
            "items_duplicated": sorted(i for i, n in duplicates.items() if n),
            "items": items,
            "workers_launched": len(set(self.members) | set(records)),
            # reclaimed workers, or (when EC2 no longer lists them) the item runs they stopped
            "interruptions": max(
                sum(1 for m in self.members.values() if m.preempted),
                sum(o.interruptions for o in self.outcomes.values()),
            ),
            "cost_usd": cost,
            "cost_basis": basis,
            "duration_s": round(now - handle.started_at, 3),
            "queue": handle.queue,
            "dead_letter_queue": handle.dead_letter,
            "group": handle.group,
        }

    def cost(
        self, records: dict[str, WorkerRecord], now: float, charged: Charged | None = None
    ) -> tuple[float, str]:
        """(USD, how it was counted): each worker's lifetime billed on its own (per second, 60 s
        minimum), at the prices ``charged`` says a spot worker was charged (None, or a failed read:
        its type's price in the group's market); a worker whose type has no price counts nothing."""
        costs, billed, unpriced = [], 0.0, 0
        sources: Counter[str] = Counter()
        for inst in self.members.values():
            start = inst.launch_time or self.handle.started_at
            record = records.get(inst.id)
            end = (record.ended_at if record else None) or self.ended_seen.get(inst.id) or now
            price = self.handle.prices.get(inst.instance_type)
            history = self._charged(charged, inst, start, end) if charged and inst.spot else None
            if history is not None:
                usd, _ = instance_cost(price, start, end - start, 1, history)
                sources[history.source] += 1
            elif price is not None:
                usd = billed_usd(price, end - start, 1, INSTANCE_MINIMUM_S)
            else:
                unpriced += 1
                continue
            costs.append(float(usd or 0.0))
            billed += billed_seconds(end - start, INSTANCE_MINIMUM_S)
        basis = (
            f"{len(costs)} worker(s), {billed:.0f} s billed in all "
            f"(each worker per second, {INSTANCE_MINIMUM_S:.0f} s minimum)"
        )
        if sources:
            basis += f"; {sum(sources.values())} at the prices charged ({', '.join(sorted(sources))})"
        if sources and len(costs) > sum(sources.values()):
            basis += f"; {len(costs) - sum(sources.values())} at the group's price for their type"
        if unpriced:
            basis += f"; {unpriced} worker(s) of a type with no known price not counted"
        return round(fsum(costs), 6), basis

    def _charged(self, charged: Charged, inst: Instance, start: float, end: float) -> PriceHistory | None:
        """What ``inst`` was charged, or None (the group's price stands) when it cannot be read."""
        try:
            history = charged(inst.instance_type, inst.zone, True, start, start + billed_seconds(end - start))
        except Exception as err:  # a price read is not a reason to fail the delivered result
            self.log.warning(
                "Could not read the prices worker %s was charged (%s); costing at its type's price",
                inst.id,
                err,
            )
            return None
        return history if history is not None and history.points else None

    def _worker_records(self, strict: bool = False) -> dict[str, WorkerRecord]:
        """The workers' records; what could not be read is left out (``strict``: raises instead)."""
        out = {}
        try:
            for key in self.folder.list(workqueue.WORKERS_PREFIX + "/"):
                raw = self.folder.get_text(key)
                if raw:
                    record = WorkerRecord.from_json(raw)
                    out[record.instance_id] = record
        except Exception:
            if strict:
                raise
        return out

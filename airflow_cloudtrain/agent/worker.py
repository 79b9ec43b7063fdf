"""Worker mode: the agent takes work items from a queue, one at a time, until the queue is empty.

When the run folder's spec has ``worker`` set (``workqueue.WorkerSettings``), ``agent.cli`` runs
``Worker`` instead of one ``Agent``. Each item is an ordinary run of its own (``runner.Agent``) in the
item's folder ``items/<id>/``, named by the attempt ``<instance-id>.<delivery>``: logs, heartbeats,
status, checkpoints (restored before the job, synced during and after it) and results under
``results/<attempt>/``, exactly as for a single run; the item's local folders are removed after it
(an absolute ``checkpoint_dir`` gets a folder per item). Why it works the way it does:

- Leases, not locks. A received message is invisible to other workers for ``lease_s`` (its lease),
  and a heartbeat thread renews the lease every ``heartbeat_s`` while the item runs, so a long item
  stays with its worker while a worker that vanished (spot reclaim, crash) loses its item to another
  worker within ``lease_s``. A failed renewal is only logged: correctness does not depend on it.
  How close a lease came to running out is measured (``LeaseGaps``) and kept in the worker's record.
- Exactly one result per item: the first writer of ``outcomes/<id>.json`` wins. A worker checks for
  an outcome when it receives the item (already there: the message is deleted, nothing runs) and
  again before writing its own; a run that finished after the item had its result writes
  ``duplicates/<id>/<attempt>.json`` instead. Queues deliver at least once; the outcome makes it once.
- Failures use up attempts, interruptions do not. The job failing (failed, timed_out, idle) makes the
  message visible again at once (another try, maybe elsewhere) until its delivery count reaches
  ``max_item_attempts``; then the item's outcome is ``failed`` and its message goes to the
  dead-letter queue. A spot notice (or SIGTERM) stops the item like a single run (checkpoint synced),
  and the item is sent again as a NEW message with ``interruptions + 1`` (its delivery count starts
  over, and the next worker resumes from the checkpoint); this worker then takes no more work.
- Leaving: after ``empty_polls`` empty receives in a row, a worker in a group takes off its scale-in
  protection (set while it had work) and terminates itself through the group with the desired
  capacity decremented, so the group neither replaces it nor scales in a busy worker; it must not
  power off inside a group (the group would launch a replacement). Outside a group, or when leaving
  fails, it runs the power-off command (quietly when the fleet's teardown came first: no longer a
  member, or the group gone, ``out_of_group``). ``workers/<instance-id>.json`` records what it did.

- Orphaned fleets: the worker reads its fleet's ``lease.json`` (``agent.lease``) between items and
  during one; once no watcher renewed it for ``orphan_timeout`` it writes ``orphaned.json``, stops the
  running item like a notice (checkpoint synced, sent again), takes no more work and leaves the group
  as above, so the group drains to 0. The group, queues and template are ``cloudtrain gc``'s to delete.

The queue and group are small objects (``agent.queue_sqs``: SQS + Auto Scaling); another cloud is
another pair of classes with the same methods. An item's exception never ends the loop: it is logged
and the item's lease released. A deleted queue means the fleet is over: the worker leaves.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_cloudtrain.agent.jobs import StopRequest, checkpoint_dir
from airflow_cloudtrain.agent.lease import LeaseWatch
from airflow_cloudtrain.agent.logs import Periodic
from airflow_cloudtrain.agent.queue_sqs import AutoScalingGroup, Lease, QueueGone, SqsQueue
from airflow_cloudtrain.agent.runner import Agent, power_off
from airflow_cloudtrain.agent.watcher import Notice, metadata_for
from airflow_cloudtrain.agent.workspace import default_workdir
from airflow_cloudtrain.contract import runs, workqueue
from airflow_cloudtrain.contract.retry import backoff, retry
from airflow_cloudtrain.contract.workqueue import ItemOutcome, WorkerRecord, WorkerSettings
from airflow_cloudtrain.storage import RunFolder, open_run_folder

log = logging.getLogger("cloudtrain.agent")

LEFT, INTERRUPTED = "left", "interrupted"  # WorkerRecord.state at the end
MAX_RECEIVE_ERRORS = 8  # receives failing in a row (backing off up to 30 s) before the worker gives up


def _sqs(settings: WorkerSettings, instance_id: str) -> tuple[Any, Any]:
    group = AutoScalingGroup(settings, instance_id) if settings.group else None
    return SqsQueue(settings), group


def _pubsub(settings: WorkerSettings, instance_id: str) -> tuple[Any, Any]:
    from airflow_cloudtrain.agent.queue_pubsub import ManagedInstanceGroup, PubSubQueue

    mig = ManagedInstanceGroup(settings, instance_id) if settings.group else None
    return PubSubQueue(settings), mig


# The agent's own per-provider table (it may import only the contract, storage and itself, so the
# Airflow side's registry is not for it): provider -> its work queue and group.
QUEUES: dict[str, Callable[[WorkerSettings, str], tuple[Any, Any]]] = {"aws": _sqs, "gcp": _pubsub}


def open_backend(settings: WorkerSettings, instance_id: str) -> tuple[Any, Any]:
    """(queue, group or None) for the settings' provider. The clients' SDKs are imported by the
    backends when first used, so a worker on one cloud never needs the other cloud's."""
    opener = QUEUES.get(settings.provider)
    if opener is None:
        raise NotImplementedError(f"no worker queue for provider {settings.provider!r} in this agent")
    return opener(settings, instance_id)


def out_of_group(err: BaseException) -> bool:
    """Whether leaving failed because this instance is no longer in its group, or the group is gone:
    Auto Scaling's ValidationError "Instance Id not found - No managed instance found ..." /
    "AutoScalingGroup name not found - ...", or a 404 from Compute Engine for a deleted managed
    instance group. That is the fleet's teardown having come first (the group scaled to 0 or
    deleted): the worker powers off as outside a group, with no traceback, since nothing went wrong."""
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        message = str(error.get("Message", ""))
        return error.get("Code") == "ValidationError" and (
            "Instance Id not found" in message or "AutoScalingGroup name not found" in message
        )
    return getattr(err, "code", None) == 404  # google.api_core NotFound


class LeaseGaps:
    """How long an item's lease went, at most, without a call reaching the queue: from the start of
    one call (the receive, a renewal) to the end of the next (a renewal, the ack). The queue restarts
    the lease when it gets a call, and both of those moments lie inside that span, so a longest span
    under ``lease_s`` means the lease never ran out; one over it (a starved machine, a slow queue)
    means another worker may have run the item too."""

    def __init__(self, since: float) -> None:
        self.since = since  # the start of the last call (monotonic)
        self.longest = 0.0

    def call(self, fn: Callable[[], object]) -> None:
        began = time.monotonic()
        fn()
        self.longest = max(self.longest, time.monotonic() - self.since)
        self.since = began


class Worker:
    """Takes items from the queue and runs each in an ``Agent`` until the queue stays empty."""

    def __init__(
        self,
        folder: RunFolder,
        spec: runs.RunSpec,
        instance_id: str | None = None,
        workdir: str | None = None,
        poweroff: str | None = None,
        queue: Any = None,
        group: Any = None,
    ) -> None:
        assert spec.worker, "not a worker spec"
        self.folder, self.spec, self.poweroff = folder, spec, poweroff
        self.settings = WorkerSettings.from_dict(spec.worker)
        self.metadata: Any = None
        try:
            self.metadata = metadata_for(spec.cloud)
            self.instance_id = instance_id or self.metadata.instance_id()
        except Exception as err:
            log.warning("metadata service unavailable (%s: %s)", type(err).__name__, err)
            self.instance_id = instance_id or socket.gethostname()
            self.metadata = None
        self.workdir = workdir or default_workdir(self.instance_id)
        self.queue, self.group = queue, group
        self.record = WorkerRecord(self.instance_id, time.time())
        self.current: Agent | None = None
        self.notice: Notice | None = None
        self._signal: str | None = None
        self._protected = False
        self._lock = threading.Lock()
        self._record_lock = threading.Lock()  # the loop and the record's beat both write it
        # the fleet's lease (``agent.lease``): lapsed, the worker stops taking items and leaves
        self.lease = LeaseWatch(folder, spec.orphan_timeout_s, time.time())
        self.orphaned: str | None = None
        self._lease_checked = 0.0

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        """Work until the queue is empty or the machine is being taken back; always returns 0."""
        ending = LEFT
        try:
            if self.queue is None:
                self.queue, self.group = open_backend(self.settings, self.instance_id)
            log.info("worker %s on %s (group %s)", self.instance_id, self.settings.queue, self.settings.group)
            self._write_record()
            # the record is this worker's heartbeat too: the fleet's watch replaces a worker whose
            # record stops changing for heartbeat_timeout (its agent died, its machine runs on)
            beat = Periodic(
                "worker record", self.spec.heartbeat_interval_s, self._write_record, run_first=False
            )
            beat.start()
            try:
                ending = self._loop()
            finally:
                beat.stop()
        except Exception:
            log.exception("worker error; leaving")
        if ending == INTERRUPTED and self.orphaned:  # nobody watches the fleet: leave, the group drains
            log.info("the fleet's lease lapsed: leaving the group (%s)", self.orphaned)
            ending = LEFT
        self.record.state, self.record.ended_at = ending, time.time()
        self._write_record(final=True)
        if ending == INTERRUPTED:  # the cloud is taking the machine: no power-off, no leaving
            log.info("worker stops: %s", self._signal or (self.notice and self.notice.kind) or "interrupted")
            return 0
        if self.group is not None:
            try:
                self.group.unprotect_and_leave()
                log.info("left group %s; it terminates this instance", self.settings.group)
                return 0
            except Exception as err:
                if out_of_group(err):  # the fleet's teardown came first: nothing left to leave
                    log.info("already out of group %s (%s); powering off", self.settings.group, err)
                else:
                    log.exception("could not leave group %s; powering off", self.settings.group)
        power_off(self.poweroff)
        return 0

    def _loop(self) -> str:
        empty = errors = 0
        while True:
            if self._stopping():
                return INTERRUPTED
            asked = time.monotonic()
            try:
                lease = self.queue.receive()
            except QueueGone as err:
                log.info("the queue is gone (%s): no more work", err)
                return LEFT
            except Exception as err:
                errors += 1
                log.warning("receive failed (%d in a row): %s: %s", errors, type(err).__name__, err)
                if errors >= MAX_RECEIVE_ERRORS:
                    return LEFT
                time.sleep(backoff(errors, base_s=1.0, cap_s=30.0))
                continue
            errors = 0
            if lease is None:
                empty += 1
                if empty >= self.settings.empty_polls:
                    log.info("%d empty receives in a row: the queue is done", empty)
                    return LEFT
                continue
            empty = 0
            if self._stopping():  # a notice came during the wait: give the item back untouched
                self._release(lease)
                return INTERRUPTED
            try:
                go_on = self._handle(lease, LeaseGaps(asked))
            except Exception:
                log.exception("item of message %s failed in the worker; releasing it", lease.message_id)
                self._release(lease)
                go_on = True
            self._write_record()
            if not go_on:
                return INTERRUPTED

    def _handle(self, lease: Lease, gaps: LeaseGaps) -> bool:
        """Run one leased item to its end; whether to take more work."""
        settings = self.settings
        try:
            item_id, text, interruptions = workqueue.decode_message(lease.body)
        except (ValueError, KeyError, TypeError) as err:
            log.error("malformed message %s (%s): to the dead-letter queue", lease.message_id, err)
            self.queue.to_dead_letter(lease)
            return True
        if self.folder.get_text(workqueue.outcome_key(item_id)) is not None:
            log.info("item %s already has its outcome: message deleted", item_id)
            self.queue.done(lease)
            return True
        if self.group is not None and not self._protected:
            try:
                self.group.protect()
                self._protected = True
            except Exception as err:
                log.warning("scale-in protection failed: %s: %s", type(err).__name__, err)
        attempt = workqueue.attempt_name(self.instance_id, lease.delivery)
        item_uri = runs.join(self.folder.uri, workqueue.item_prefix(item_id))
        env = {**self.spec.env, workqueue.ENV_ITEM: text, workqueue.ENV_ITEM_ID: item_id}
        local_checkpoints = self.spec.checkpoint_dir  # an absolute one: a folder per item in it
        if local_checkpoints and os.path.isabs(local_checkpoints):
            local_checkpoints = os.path.join(local_checkpoints, workqueue.item_prefix(item_id))
        spec = replace(
            self.spec,
            run_uri=item_uri,
            run_id=f"{self.spec.run_id}-{item_id}",
            worker=None,
            orphan_timeout_s=None,  # the worker watches the fleet's lease; items have none
            live_uri=None,  # items are watched through their outcomes, not the live index
            env=env,
            max_runtime_s=settings.item_timeout_s,
            restarts=interruptions,
            checkpoint_dir=local_checkpoints,
        )
        workdir = Path(self.workdir, "items", f"{item_id}-{lease.delivery}")
        agent = Agent(item_uri, attempt, str(workdir), folder=open_run_folder(item_uri), spec=spec)
        log.info("item %s: attempt %s (interruptions %d)", item_id, attempt, interruptions)
        self.record.items.append(attempt)
        self._write_record()
        with self._lock:
            self.current = agent
            if self._signal is not None:  # came just before: the item stops at once, as a notice
                agent.stop_for_signal(self._signal)
        lease_chore = Periodic(
            "lease",
            settings.heartbeat_s,
            lambda: gaps.call(lambda: self.queue.extend(lease)),
            run_first=False,
        )
        interval = self.lease.interval_s
        fleet_lease = Periodic(
            "fleet-lease", interval or 3600.0, lambda: self._stop_if_orphaned(agent), run_first=False
        )
        started = time.time()
        try:
            lease_chore.start()
            if interval is not None:
                fleet_lease.start()
            agent.run()
        finally:
            lease_chore.stop()
            if interval is not None:
                fleet_lease.stop()
            with self._lock:
                self.current = None
            # results and checkpoints are up (a retry restores from the run folder): free the disk
            for local in {str(workdir), checkpoint_dir(spec, str(workdir))}:
                shutil.rmtree(local, ignore_errors=True)
        state, exit_code, message = agent.outcome or (runs.FAILED, None, "the item's agent gave no outcome")
        log.info("item %s: %s%s", item_id, state, f" ({message})" if message else "")
        outcome = ItemOutcome(
            id=item_id,
            state=workqueue.SUCCEEDED if state == runs.SUCCEEDED else workqueue.FAILED,
            attempt=attempt,
            instance_id=self.instance_id,
            exit_code=exit_code,
            message=message if state in (runs.SUCCEEDED, runs.FAILED) else f"{state}: {message}",
            attempts=lease.delivery,
            interruptions=interruptions,
            results_uri=runs.join(item_uri, runs.results_prefix(attempt)),
            started_at=started,
            ended_at=time.time(),
        )
        if state == runs.SUCCEEDED:
            self._record_outcome(outcome)
            gaps.call(lambda: self.queue.done(lease))
            self._note_gaps(item_id, gaps)
            return True
        self._note_gaps(item_id, gaps)
        if state == runs.INTERRUPTED:  # stopped by a notice / SIGTERM, checkpoint synced: send it again
            self.queue.requeue(lease, workqueue.encode_message(item_id, text, interruptions + 1))
            return False
        if lease.delivery >= settings.max_item_attempts:
            if self._record_outcome(outcome):
                self.queue.to_dead_letter(lease)
            else:  # another attempt gave the item its result meanwhile
                self.queue.done(lease)
        else:
            self._release(lease)
        return True

    def _note_gaps(self, item_id: str, gaps: LeaseGaps) -> None:
        """Keep the longest gap in the record; say when it was longer than the lease."""
        longest = round(gaps.longest, 3)
        self.record.longest_lease_gap_s = max(self.record.longest_lease_gap_s or 0.0, longest)
        if longest > self.settings.lease_s:
            log.warning(
                "item %s: its lease went up to %.1f s without a call reaching the queue (lease %s s): "
                "another worker may have run it too (its result is a duplicate)",
                item_id,
                longest,
                self.settings.lease_s,
            )

    # -- stopping ------------------------------------------------------------------------------------
    def stop_for_signal(self, name: str) -> None:
        """SIGTERM & co.: the running item stops like on a notice; no more work is taken."""
        with self._lock:
            self._signal = name
            agent = self.current
        if agent is not None:
            agent.stop_for_signal(name)

    def _orphaned(self) -> bool:
        """Has the fleet's lease lapsed (read at most every check interval)? Recorded once."""
        interval = self.lease.interval_s
        if self.orphaned or interval is None or time.time() - self._lease_checked < interval:
            return bool(self.orphaned)
        self._lease_checked = time.time()
        message = self.lease.check()
        if message is not None:
            self.orphaned = message
            log.warning("%s: taking no more items", message)
            self.lease.record("worker")
        return bool(self.orphaned)

    def _stop_if_orphaned(self, agent: Agent) -> None:
        """During an item: a lapsed fleet lease stops it like a notice (checkpoint synced, the item
        sent again for whoever runs the fleet next); the worker then leaves."""
        if self._orphaned() and self.orphaned:
            agent.request_stop(StopRequest(runs.INTERRUPTED, self.orphaned, 10.0))

    def _stopping(self) -> bool:
        """Signalled, the metadata service announces an interruption, or the fleet's lease lapsed
        (asked between items)."""
        if self._signal is not None or self.notice is not None or self._orphaned():
            return True
        if self.metadata is not None:
            try:
                self.notice = self.metadata.poll()
            except Exception as err:
                log.debug("metadata poll failed: %s: %s", type(err).__name__, err)
        return self.notice is not None

    # -- records -------------------------------------------------------------------------------------
    def _record_outcome(self, outcome: ItemOutcome) -> bool:
        """Write the item's outcome unless it has one (first writer wins); else a duplicate record.
        Whether this one became the outcome."""
        key = workqueue.outcome_key(outcome.id)
        if retry(lambda: self.folder.get_text(key), what="outcome check") is None:
            retry(lambda: self.folder.put_text(key, outcome.to_json()), what="outcome write")
            return True
        duplicate = workqueue.duplicate_key(outcome.id, outcome.attempt)
        log.info("item %s already had its outcome: this run is %s", outcome.id, duplicate)
        retry(lambda: self.folder.put_text(duplicate, outcome.to_json()), what="duplicate write")
        return False

    def _write_record(self, final: bool = False) -> None:
        with self._record_lock:
            self.record.updated_at = time.time()
            text, key = self.record.to_json(), workqueue.worker_key(self.instance_id)
        try:
            if final:
                retry(lambda: self.folder.put_text(key, text), what="worker record")
            else:
                self.folder.put_text(key, text)
        except Exception as err:
            log.warning("worker record write failed: %s: %s", type(err).__name__, err)

    def _release(self, lease: Lease) -> None:
        try:
            self.queue.release_now(lease)
        except Exception as err:  # it comes back anyway once its lease runs out
            log.warning("could not release message %s: %s: %s", lease.message_id, type(err).__name__, err)

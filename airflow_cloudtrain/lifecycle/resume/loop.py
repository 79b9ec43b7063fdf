"""The checkpoint-resume loop's memory and its attempts: what ``CheckpointResumeOperator`` drives.

Each (re)launch is a ``RunAttempt`` of the same run key (so the same ledger, tag sweep and teardown
guarantee) in the same run folder (so the agent restores the newest complete checkpoint there).
The loop's history (``lifecycle.history.RunHistory``) is saved to ``task_state_store`` and to the
run folder after every change, and an attempt's end is saved as ``pending`` *before* it is released
and accounted: a worker killed anywhere in between finds it on reload and finishes it, so no
interruption is lost from the budgets and no attempt is billed twice.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.runs import (
    CHECKPOINTS_PREFIX,
    SPEC_KEY,
    Manifest,
    RunStatus,
    join,
    manifest_key,
    manifest_versions,
    results_prefix,
    status_key,
)
from airflow_cloudtrain.core.ledger import ResourceLedger, store_get, store_set
from airflow_cloudtrain.core.retry import call_with_retry
from airflow_cloudtrain.lifecycle.prepare import JobOptions
from airflow_cloudtrain.lifecycle.resume.history import (
    ABANDONED,
    LEFT_FOR_SPOT,
    LOOP_KEY,
    AttemptRow,
    RunHistory,
    index_key,
    ledger_key,
)
from airflow_cloudtrain.lifecycle.resume.recovery import (
    SPOT_OF,
    RecoverySettings,
    Step,
    capacity_row,
    gang_rows,
    launch_fields,
    next_probe_at,
    next_step,
    node_rows,
    probe_step,
    row_for,
    within_budget,
)
from airflow_cloudtrain.lifecycle.resume.zones import launch_order, no_capacity_zones, note_move
from airflow_cloudtrain.lifecycle.run.abandon import delivered, has_final_status
from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt, RunContext

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.records import LaunchRecord, Outcome
    from airflow_cloudtrain.storage import RunFolder


HEAD_SYNC_WAIT_S = 60.0  # a stopped gang's uploading nodes sync their last checkpoint before a relaunch


class ResumeSourceNotFound(ValueError):
    """``resume_from`` names no run this bucket knows."""


def resolve_resume_from(backend: RunBackend, bucket: str, value: str) -> str:
    """The run folder ``resume_from`` names: a run URI as is (it must hold a spec), a run id
    through the bucket's ``index/<run_id>.json``."""
    if value.startswith(("s3://", "gs://")):
        uri = value.rstrip("/")
        if not call_with_retry(lambda: backend.run_folder(uri).get_text(SPEC_KEY)):
            raise ResumeSourceNotFound(f"resume_from={value!r}: no run folder there (no {SPEC_KEY})")
        return uri
    raw = call_with_retry(lambda: backend.run_folder(bucket).get_text(index_key(value)))
    if not raw:
        raise ResumeSourceNotFound(
            f"resume_from={value!r}: no run with that id under {bucket} (no {index_key(value)})"
        )
    return str(json.loads(raw)["run_uri"])


class RecoveryLoop:
    """One task's loop over attempts; rebuilt from its saved history after every deferral."""

    def __init__(
        self, ctx: RunContext, settings: RecoverySettings, job: JobOptions, resume_from: str | None = None
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.job = job
        self.log = ctx.log
        self.killed = False
        self.history = self._load(resume_from)
        self.ctx.folder_uri = self.history.run_uri
        # one ledger object for every attempt of this loop: attempts can be alive at once (a switch to
        # spot launches beside the running one; a resolved switch), and each save writes it whole
        self.ledger = ResourceLedger.load(ctx.key.digest, ctx.store, ctx.log)

    # -- history ---------------------------------------------------------------------------------
    def _load(self, resume_from: str | None) -> RunHistory:
        """The saved history (the newer of the store's and the run folder's copies), else a new one,
        saved at once: its start time is what a timedelta ``deadline`` counts from."""
        ctx = self.ctx
        run_id = ctx.key.short_id
        saved = store_get(ctx.store, LOOP_KEY)
        stored = RunHistory.from_dict(saved) if saved and saved.get("run_id") == run_id else None
        run_uri = stored.run_uri if stored else ctx.run_uri
        if stored is None and resume_from:
            run_uri = resolve_resume_from(ctx.backend, ctx.config.bucket, resume_from)
            self.log.info("Resuming %s: its checkpoints, and its run folder %s", resume_from, run_uri)
        raw = call_with_retry(lambda: ctx.backend.run_folder(run_uri).get_text(ledger_key(run_id)))
        in_folder = RunHistory.from_dict(json.loads(raw)) if raw else None
        if in_folder and (stored is None or (in_folder.updated_at or 0) > (stored.updated_at or 0)):
            if stored is None:  # the store is gone (a cleared task): the run folder has the history
                self.log.info("Continuing the loop from the ledger in %s", run_uri)
            return in_folder
        if stored is not None:
            return stored
        history = RunHistory(
            run_id=run_id,
            run_uri=run_uri,
            policy=self.settings.policy,
            started_at=time.time(),
            resumed_from=run_uri if resume_from else None,
        )
        index = json.dumps({"run_uri": run_uri, "dag_id": ctx.key.dag_id, "task_id": ctx.key.task_id})
        call_with_retry(lambda: ctx.backend.run_folder(ctx.config.bucket).put_text(index_key(run_id), index))
        self.history = history
        self.save()
        return history

    def save(self, strict: bool = True) -> None:
        """To the store (best effort) and the run folder (retried; with ``strict=False`` a failure
        is only logged, for the write-ahead before a release, which must not wait on the bucket)."""
        history = self.history
        history.updated_at = time.time()
        store_set(self.ctx.store, LOOP_KEY, history.to_dict())
        folder = self.ctx.backend.run_folder(history.run_uri)
        try:
            call_with_retry(lambda: folder.put_text(ledger_key(history.run_id), history.to_json()))
        except Exception as err:
            if strict:
                raise
            self.log.warning("Could not save the run's ledger to %s (%s); going on", history.run_uri, err)

    # -- steps -----------------------------------------------------------------------------------
    def next_step(self) -> Step:
        if self.history.pending:
            self._finish_pending()
        step = next_step(self.history, self.settings, self.ctx.try_number, time.time())
        self.log.info("Next: %s%s (%s)", step.kind, f" on {step.cloud}" if step.cloud else "", step.reason)
        return step

    def next_probe_at(self, launch: LaunchRecord) -> float | None:
        """When the wait on ``launch`` stops to ask the policy (``recovery.next_probe_at``)."""
        return next_probe_at(self.history, self.settings, launch)

    def probe_step(self, launch: LaunchRecord) -> Step:
        """The policy's look while the on-demand ``launch`` runs (``recovery.probe_step``), within
        ``max_cost`` (a spot launch the budget cannot pay is no probe); saved: the next look is
        ``probe_interval`` after this one, whatever it decided."""
        now = time.time()
        step = within_budget(
            probe_step(self.history, self.settings, launch, now), self.history, self.settings
        )
        self.history.asked_at = now
        self.save()
        self.log.info("Probe: %s%s (%s)", step.kind, f" on {step.cloud}" if step.cloud else "", step.reason)
        return step

    def attempt(self, cloud: str | None = None, handover: str | None = None) -> RunAttempt:
        """An attempt of this run on ``cloud`` (spot or on-demand of the same provider); launching
        goes through ``launch_attempt``, which numbers it. ``handover``: its agent restores only once
        that marker exists (a make-before-break switch, ``lifecycle.resume.switch``)."""
        ctx, cloud = self.ctx, cloud or self.settings.cloud
        spot = cloud == SPOT_OF[cloud]
        config = replace(ctx.config, cloud=cloud, bid=ctx.config.bid if spot else None)
        options = replace(
            ctx.options,
            provisioning=ctx.options.provisioning if spot else None,
            sequence=self.history.launch_seq,
        )
        job = replace(self.job, restarts=self.history.restarts, handover_key=handover)
        wait = replace(ctx.wait, spent_usd=float(self.history.totals()["cost_usd"]))  # for ``max_cost``
        order = functools.partial(self.zone_order, spot)
        attempt = RunAttempt(
            replace(ctx, config=config, options=options, job=job, wait=wait, zone_order=order), self.ledger
        )
        attempt.killed = self.killed
        return attempt

    def launch_attempt(self, cloud: str | None) -> RunAttempt:
        """The next launch: numbered (and saved) first, so its client tokens are never reused."""
        self.history.launch_seq += 1
        self.save()
        return self.attempt(cloud)

    def zone_order(self, spot: bool, offer: Offer, zones: list[str | None]) -> list[str | None]:
        """The zones an attempt tries ``offer`` in (``RunContext.zone_order``): the allowed ones, a
        spot launch's least recent trouble first, then the cloud's placement score
        (``lifecycle.resume.zones``)."""
        nodes = self.ctx.gang.num_nodes if self.ctx.gang is not None else 1

        def scores(named: list[str]) -> dict[str, float] | None:
            return self.ctx.backend.spot_placement_scores(offer.instance_type, nodes, named, self.log)

        return launch_order(
            self.history, self.settings.zones, spot, offer, zones, time.time(), self.log, scores
        )

    def launch_failed(self, cloud: str, err: Exception) -> None:
        """No offer had capacity: a ledger row (it spends the interruption budget) and no cost."""
        from airflow_cloudtrain.core.launcher import LaunchFailed

        tried = no_capacity_zones(err.tried, self.ctx.backend.region) if isinstance(err, LaunchFailed) else []
        row = capacity_row(
            self.history.next_attempt, self.ctx.try_number, cloud, str(err), time.time(), tried
        )
        self.history.attempts.append(row)
        self.save()
        self.log.warning("Attempt %d found no capacity: %s", row.attempt, err)

    def begin_wait(self, reason: str) -> None:
        """A wait before the next launch starts (saved: a deferral or a dead worker may end it)."""
        now = time.time()
        self.history.waits.append({"from": now, "to": now, "reason": reason, "open": True})
        self.save()

    def end_wait(self) -> None:
        for wait in reversed(self.history.waits):
            if wait.pop("open", False):
                wait["to"] = time.time()
                break
        self.save()

    def finish(self, attempt: RunAttempt, launch: LaunchRecord, outcome: Outcome) -> AttemptRow:
        """Release the attempt's instance, account for it and add its row (crash-safe, see module)."""
        if self.history.pending and self.history.pending["launch"].get("instance_id") != launch.instance_id:
            self._finish_pending()  # an older end a failed save left behind: account for it first
        self.history.pending = {"launch": launch.to_dict(), "outcome": outcome.to_dict()}
        self.save(strict=False)
        return self._finish(attempt, launch, outcome)

    def abandoned(self, launch: LaunchRecord, reason: str) -> None:
        """A row for an attempt released without a reported end (killed task, failed wait), so the
        ledger still shows what it cost. Best effort: the task is failing anyway."""
        from airflow_cloudtrain.core.billing import billed_cost

        if self.history.has(launch.instance_id):
            return
        now = time.time()
        hourly = launch.hourly_usd * launch.num_nodes if launch.hourly_usd is not None else None
        cost, _ = billed_cost(hourly, now - float(launch.launched_at or now))  # a gang: every node
        row = AttemptRow(
            attempt=self.history.next_attempt,
            try_number=self.ctx.try_number,
            ended=ABANDONED,
            **launch_fields(launch),
            ended_at=now,
            cost_usd=float(cost or 0.0),
            message=reason,
        )
        rows = node_rows(launch, row)
        note_move(self.history, rows)
        self.history.attempts.extend(rows)
        self.history.pending = None
        try:
            self.save(strict=False)
        except Exception as err:
            self.log.warning("Could not record the abandoned attempt in the ledger: %s", err)

    def unwatched(self, current: LaunchRecord | None) -> None:
        """Rows for the attempts an earlier try launched and never reported: that try died, and its
        instance ended while no try watched it (the cloud took it), so this try found nothing to
        adopt and launched again. Each one's in-flight record in the bucket's running index (its
        launch time and price) is all that is left of it: without a row its cost was missing from
        the ledger and ``cost_usd``, and the next job was told ``CLOUDTRAIN_RESTARTS=0`` (the fault
        campaign's s014). Billed up to now (when it ended is not known); its record then goes, as a
        release's does. Best effort, as the index is.

        Called before each launch (``current`` None: an instance still alive is left to ``start``
        to adopt), so the job's ``CLOUDTRAIN_RESTARTS`` counts it, and after ``start`` with the
        attempt it runs (everything else of the run is released by then)."""
        from airflow_cloudtrain.core.billing import billed_cost
        from airflow_cloudtrain.core.cloud import ALIVE_STATES
        from airflow_cloudtrain.lifecycle.cost_index import RUNNING, RUNNING_PREFIX, CostRecord, clear_running

        own = set(current.node_ids) if current else set()
        try:
            bucket = self.ctx.backend.run_folder(self.ctx.config.bucket)
            keys = call_with_retry(lambda: bucket.list(f"{RUNNING_PREFIX}{self.history.run_id}-"))
            records = [CostRecord.from_json(text) for k in keys if (text := bucket.get_text(k))]
            records = [r for r in records if r.state == RUNNING and r.instance_id not in own]
            if records and current is None:
                states = call_with_retry(
                    lambda: self.ctx.backend.cloud.describe([r.instance_id for r in records])
                )
                records = [r for r in records if states[r.instance_id].state not in ALIVE_STATES]
            # a job that ended with its worker dead is ``start``'s to deliver (its row says how it ended)
            folder = self.ctx.backend.run_folder(self.history.run_uri)
            records = [
                r
                for r in records
                if not call_with_retry(functools.partial(has_final_status, folder, r.instance_id))
            ]
            # one a try released on purpose (a switch to spot cut short: its job never started) or
            # already reported is no unwatched attempt: only its entry goes
            handled = [
                r
                for r in records
                if call_with_retry(functools.partial(delivered, self.ctx.store, folder, r.instance_id))
            ]
        except Exception as err:
            self.log.warning("Could not read this run's entries in the running index (%s)", err)
            return
        for record in handled:
            clear_running(bucket, record.run_id, record.instance_id, self.log)
        records = [r for r in records if r not in handled]
        now, rows = time.time(), len(self.history.attempts)
        for record in records:
            if not self.history.has(record.instance_id):
                cost, _ = billed_cost(record.hourly_usd, now - float(record.launched_at or now))
                self.history.attempts.append(
                    AttemptRow(
                        attempt=self.history.next_attempt,
                        try_number=self.ctx.try_number,
                        ended=ABANDONED,
                        cloud=record.cloud,
                        instance_id=record.instance_id,
                        instance_type=record.instance_type,
                        spot=record.spot,
                        launched_at=record.launched_at,
                        ended_at=now,
                        hourly_usd=record.hourly_usd,
                        cost_usd=float(cost or 0.0),
                        num_nodes=record.num_nodes,
                        message="an earlier try died; its instance ended unwatched (no end reported)",
                    )
                )
                self.log.warning("Attempt of %s ended while no try watched it: counted", record.instance_id)
            clear_running(bucket, record.run_id, record.instance_id, self.log)
        if len(self.history.attempts) > rows:
            self.save(strict=False)

    def _finish(self, attempt: RunAttempt, launch: LaunchRecord, outcome: Outcome) -> AttemptRow:
        """The attempt's row (a gang's: a row per node, ``recovery.gang_rows``; returns the head's)."""
        left = outcome.state == LEFT_FOR_SPOT  # its replacement runs: release this one only
        done = attempt.finish(launch, outcome, keep_others=left)
        folder, number, beat = attempt.folder, self.history.next_attempt, attempt.last_heartbeat
        if launch.nodes:
            if not outcome.ok:
                self._await_uploads(folder, launch, outcome.rank)
            statuses = [attempt_status(folder, iid) for iid in launch.node_ids]
            rows = gang_rows(done, statuses, number, self.ctx.try_number, beat)
        else:
            if left:  # its agent is uploading the last checkpoint the replacement restores
                self._await_uploads(folder, launch, None)
            status = attempt_status(folder, launch.instance_id)
            rows = [row_for(done, status, number, self.ctx.try_number, beat)]
        row = rows[0]
        if not self.history.has(launch.instance_id):
            note_move(self.history, rows)
            self.history.attempts.extend(rows)
            if row.restore_note:
                self._progress_lost(row)
            else:
                self._restored_older(row)
        self.history.pending = None
        self.save()
        self.log.info("Ledger so far:\n%s", self.history.table())
        return row

    def _await_uploads(self, folder: RunFolder, launch: LaunchRecord, lost: int | None) -> None:
        """A gang stopped because a node was lost (or failed): the agents of the nodes that upload
        checkpoints (the head; every rank with ``checkpoint_ranks="all"``) got SIGTERM with the
        release and are uploading the job's last checkpoint. The next gang's nodes each restore the
        newest complete checkpoint when they boot, so they must not boot while such an upload may
        still complete (two ranks would restore different steps): wait for those agents' final
        statuses, which each writes after its last sync, at most ``HEAD_SYNC_WAIT_S``. The node that
        ended the gang is not waited for: it already reported, or it vanished."""
        from airflow_cloudtrain.contract.gang import uploads

        ranks = self.job.checkpoint_ranks
        waiting = [
            iid
            for rank, iid in enumerate(launch.node_ids)
            if rank != lost and uploads(rank, launch.num_nodes, ranks)
        ]
        deadline = time.monotonic() + HEAD_SYNC_WAIT_S
        while waiting and time.monotonic() < deadline and not self.killed:
            try:
                raws = {iid: folder.get_text(status_key(iid)) for iid in waiting}
            except Exception as err:  # the bucket hiccuped: the next round reads again
                self.log.warning("Could not read the gang's statuses (%s); retrying", err)
                raws = {}
            waiting = [i for i in waiting if not ((raw := raws.get(i)) and RunStatus.from_json(raw).final)]
            if waiting:
                time.sleep(0.5)
        if waiting:
            self.log.warning(
                "Node(s) %s did not report their end within %.0f s; relaunching the gang with the "
                "checkpoints complete now",
                ", ".join(waiting),
                HEAD_SYNC_WAIT_S,
            )

    def _restored_older(self, row: AttemptRow) -> None:
        """The attempt restored an older checkpoint than the previous one uploaded last (its newest
        failed verification, or was never complete): the previous attempt lost that much more."""
        earlier = [r for r in self.history.heads if r.attempt < row.attempt]
        previous = earlier[-1] if earlier else None
        if previous is None or row.restored_saved_at is None or previous.checkpoint_saved_at is None:
            return
        extra = previous.checkpoint_saved_at - row.restored_saved_at
        if extra > 0:
            previous.work_lost_s = round((previous.work_lost_s or 0.0) + extra, 3)
            previous.progress_s = round(max(0.0, previous.progress_s - extra), 3)

    def _progress_lost(self, row: AttemptRow) -> None:
        """A relaunch restored nothing although the job made progress before: say so, and count
        everything the earlier attempts did as work lost (the job ran from the beginning again)."""
        self.log.warning(
            "Attempt %d restored no checkpoint and ran from the beginning: %s", row.attempt, row.restore_note
        )
        for earlier in self.history.attempts:
            if earlier.attempt != row.attempt and earlier.progress_s:
                earlier.work_lost_s = round((earlier.work_lost_s or 0.0) + earlier.progress_s, 3)
                earlier.progress_s = 0.0

    def _finish_pending(self) -> None:
        from airflow_cloudtrain.core.records import LaunchRecord, Outcome

        pending = self.history.pending or {}
        launch = LaunchRecord.from_dict(pending["launch"])
        outcome = Outcome.from_dict(pending["outcome"])
        if self.history.has(launch.instance_id):
            self.history.pending = None
            return
        self.log.info("Finishing attempt on %s that an earlier worker left half done", launch.instance_id)
        self._finish(self.attempt(launch.cloud), launch, outcome)

    def close(self, ok: bool, message: str = "") -> None:
        self.history.state = "succeeded" if ok else "failed"
        self.history.message = message
        self.save()
        self.log.info("Ledger of run %s:\n%s", self.history.run_id, self.history.table())

    # -- result ----------------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        """The XCom: the contract's keys from the last attempt that ran an instance, with the whole
        run's totals and the ledger."""
        history = self.history
        totals = history.totals()
        last = next((r for r in reversed(history.heads) if r.instance_id), None)
        per_attempt: dict[str, Any] = {}
        if last is not None:
            per_attempt = {
                "run_id": history.run_id,
                "results_uri": join(history.run_uri, results_prefix(last.instance_id or "")),
                "cloud": last.cloud,
                "instance_id": last.instance_id,
                "instance_type": last.instance_type,
                "region": last.region,
                "zone": last.zone,
                "spot": last.spot,
                "exit_code": last.exit_code,
                "state": "succeeded" if last.ended == "finished" else last.ended,
                **last_nodes(history, last),
            }
        return {
            **per_attempt,
            "run_uri": history.run_uri,
            "cost_usd": totals["cost_usd"],
            "duration_s": totals["duration_s"],
            "interruptions": totals["interruptions"],
            "restarts": history.restarts,
            "resumed_step": last.restored_step if last is not None else None,
            "resumed_from": history.resumed_from,
            "policy": history.policy,
            "ledger_uri": join(history.run_uri, ledger_key(history.run_id)),
            "totals": totals,
            "attempts": [r.to_dict() for r in history.attempts],
        }


def last_nodes(history: RunHistory, head: AttemptRow) -> dict[str, Any]:
    """XCom ``num_nodes`` and ``nodes`` (rank, instance id, zone, private address, exit code) of the
    attempt whose head row is ``head``, as ``CloudTrainOperator`` gives them."""
    rows = [r for r in history.attempts if r.attempt == head.attempt and r.instance_id]
    if head.rank is None:  # one instance
        rows = [head]
    nodes = [
        {
            "rank": r.rank or 0,
            "instance_id": r.instance_id,
            "zone": r.zone,
            "private_ip": r.private_ip,
            "exit_code": r.exit_code,
        }
        for r in rows
    ]
    return {"num_nodes": len(nodes), "nodes": nodes}


def attempt_status(folder: RunFolder, instance_id: str) -> RunStatus | None:
    """The agent's last ``status.json`` of an ended attempt, its ``checkpoint`` brought up to the newest
    checkpoint that instance uploaded: what the ledger row's ``checkpoint_step`` promises.

    The agent writes a version's ``MANIFEST.json`` (it is complete: the next attempt restores it),
    then rewrites its status; an instance taken without notice in between leaves a status one upload
    behind (``checkpoint`` None after the first). The manifests in the run folder say which instance
    uploaded each version, so the newer ones are read (newest first, until one of this instance's;
    the agent keeps only the two newest versions, so that is at most two reads)."""
    raw = call_with_retry(lambda: folder.get_text(status_key(instance_id)))
    status = RunStatus.from_json(raw) if raw else None
    if status is None:
        return None
    reported = (status.checkpoint or {}).get("uploaded_at")
    keys = call_with_retry(lambda: folder.list(CHECKPOINTS_PREFIX + "/"))
    for version in sorted(manifest_versions(list(keys)), reverse=True):
        text = call_with_retry(functools.partial(folder.get_text, manifest_key(version)))
        try:
            manifest = Manifest.from_json(text) if text else None
        except ValueError:
            continue  # not a complete version: the agent would not restore it either
        if manifest is None or manifest.instance_id != instance_id:
            continue
        created = manifest.created_at
        if isinstance(reported, (int, float)) and (created is None or created <= reported):
            break  # the status already knows this one (or a newer one)
        uploaded = {"step": manifest.step, "saved_at": manifest.saved_at, "uploaded_at": created}
        return replace(status, checkpoint=uploaded)
    return status

"""The agent's run: spec -> setup -> job -> results -> final status -> power off.

Teardown is a guarantee, so ``Agent.run`` never raises: whatever happens it tries to upload results,
flush the log, write a final status and run the power-off command. The final status is the last
write of the run folder, so an observer that sees it also sees every log chunk and result.

The live index (``spec.live_uri``, see ``agent.beacon``): the instance's beacon is rewritten on every
status change and after every log flush that uploaded chunks; each heartbeat writes its ``.beat``
object there (instead of the ``heartbeat`` file). After the final status come the final beacon (final status, every chunk) and
then the end marker, both retried like the final status: the end marker is the run's last write.

Results go to ``runs.results_prefix(instance_id)`` (``results/<instance-id>/``): one folder per
instance, i.e. per attempt, so a retried task's new instance never mixes files into (or overwrites)
what a finished try uploaded.

Transient storage errors (throttling, 5xx, dropped connections; see ``agent.retry``) do not lose a
run: reading the spec, fetching the code, uploading each result file, the final log flush and the
final status are retried with backoff for a few minutes. Heartbeats, log chunks and intermediate
status writes are not: a failure is logged and the next round carries the data.

Checkpoints (``agent.checkpoints``): before the setup commands the newest verified checkpoint of the
run folder is restored into the job's checkpoint directory (``CLOUDTRAIN_RESUMED`` /
``CLOUDTRAIN_RESUMED_STEP`` tell the job); while the job runs the newest complete one is uploaded
every ``checkpoint_interval_s``, and once more after the job ended (also when a notice or SIGTERM
stopped it), before the results. The agent zip is copied to ``<workdir>/.cloudtrain/agent.zip`` and
appended to the job's ``PYTHONPATH``, so the job can ``import airflow_cloudtrain.contract.checkpoint``. The
status says what the operator needs to tell how much work a resume keeps: ``restored_step`` (written
with the ``setup`` state), ``checkpoint`` (``{"step", "saved_at", "uploaded_at"}`` of the
newest checkpoint this agent uploaded, rewritten after every upload) and ``checkpoint_history`` (the
newest 200 uploads' time, step and version, in that same write: no extra PUT).

Interruption notices: the job gets SIGTERM at once and ``jobs.notice_grace`` seconds before SIGKILL:
``spec.stop_grace_s`` or what the notice leaves (``at``; 30 s without one), in both cases less a
reserve for the final checkpoint sync (from how long the last upload took, at least 5 s), so the
job's last checkpoint and its upload fit inside the notice. The ``interruption`` record of the status
is rewritten as the agent gets there: the notice, then ``job_stopped_at`` when the job exited, then
``checkpoint_at`` / ``checkpoint_step`` once the final sync is done; all before the final status.

Hung jobs (``spec.idle_timeout_s``; see ``agent.idle``): while the job runs, a chore samples its
process tree's CPU time (and, with GPUs, ``nvidia-smi``); once it used neither for the timeout the
job is stopped like any other stop (checkpoints synced) and the run ends as ``idle``. A gang's node
(``num_nodes`` > 1) records that in the run folder and stops only once every node of the gang is idle
(``agent.gang.GangIdle``): one idle rank of a busy gang is waiting on the others, not hung.

Orphaned runs (``spec.orphan_timeout_s``; see ``agent.lease``): a chore reads the run folder's
``lease.json``; once no watcher renewed it for the timeout the job is stopped like at ``max_runtime``
(checkpoints synced), ``orphaned.json`` is written and the run ends ``failed`` with a message naming
the lapsed lease, then powers off. Item agents of a worker have no lease (the worker watches its fleet's).

Work items (``agent.worker``): a worker runs one ``Agent`` per item, given the item's spec, its folder
(``items/<id>/``) and the attempt name as ``instance_id`` (``<instance-id>.<delivery>``), without a
power-off; everything above holds per item. ``outcome`` is the run's final (state, exit code, message).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow_cloudtrain.agent import gang
from airflow_cloudtrain.agent.beacon import BeaconWriter
from airflow_cloudtrain.agent.checkpoints import KEEP_VERSIONS, KEEP_VERSIONS_ALL_RANKS, CheckpointSync
from airflow_cloudtrain.agent.idle import IdleWatch, proc_available, sample_interval
from airflow_cloudtrain.agent.jobs import (
    MIN_SYNC_RESERVE_S,
    NOTICE_DEFAULT_LEFT_S,
    StopRequest,
    build_job_command,
    checkpoint_dir,
    container_name,
    job_env,
    notice_grace,
    resume_report,
    run_process,
)
from airflow_cloudtrain.agent.lease import LeaseWatch
from airflow_cloudtrain.agent.logs import LogStreamer, Periodic
from airflow_cloudtrain.agent.status import StatusWriter
from airflow_cloudtrain.agent.watcher import FOLDER_CLOUD, AwsMetadata, GceMetadata, Notice, metadata_for
from airflow_cloudtrain.agent.workspace import default_workdir, fetch_code, mount_volume
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.retry import retry
from airflow_cloudtrain.storage import RunFolder, open_run_folder

log = logging.getLogger("cloudtrain.agent")

AGENT_ZIP_IN_WORKDIR = ".cloudtrain/agent.zip"
NOTICE_GRACE_S = notice_grace(NOTICE_DEFAULT_LEFT_S)  # 25 s: a 30 s notice less the sync reserve
TIMEOUT_GRACE_S = 10.0  # max_runtime and idle stops, unless spec.stop_grace_s says otherwise
SYNC_RESERVE_FACTOR = 1.5  # the final sync may take this much longer than the last timed one
# the finishing writes (results, last log chunk, final status, final beacon, end marker) share this
# many seconds of retries: a store that refuses them for good must not keep a billed instance up for
# one retry budget each (about 10 minutes). The final status always gets a sixth of it.
FINISH_BUDGET_S = 180.0


class Agent:
    """One run on one instance; see the module docstring for the guarantees."""

    def __init__(
        self,
        run_uri: str,
        instance_id: str | None = None,
        workdir: str | None = None,
        poweroff: str | None = None,
        folder: RunFolder | None = None,
        spec: runs.RunSpec | None = None,
        finish_budget_s: float = FINISH_BUDGET_S,
    ) -> None:
        self.run_uri = run_uri
        self.finish_budget_s = finish_budget_s
        self.instance_id = instance_id
        self.workdir = workdir
        self.poweroff = poweroff
        self.folder = folder
        self.spec: runs.RunSpec | None = spec  # given: spec.json is not read (a worker's item)
        self.outcome: tuple[str, int | None, str] | None = None  # (state, exit_code, message) at the end
        self.metadata: AwsMetadata | GceMetadata | None = None
        self.streamer: LogStreamer | None = None
        self.writer: StatusWriter | None = None
        self.beacon: BeaconWriter | None = None  # with a live index (spec.live_uri)
        self.started_at = time.time()
        self.deadline: float | None = None
        self.notice: Notice | None = None
        self._chores: dict[str, Periodic] = {}
        self._stop_lock = threading.RLock()  # signal handlers run in the main thread, maybe inside it
        self._stop: StopRequest | None = None
        self.checkpoints: CheckpointSync | None = None
        self.resumed_step: int | None = None
        self._restore: dict[str, Any] | None = None  # RunStatus.restore
        self._report_file: Path | None = None
        self._interruption: dict[str, object] | None = None  # what status.json's record holds
        self._interruption_lock = threading.Lock()  # the watcher and the main thread both add to it
        self._checkpoint: dict[str, float | int | None] | None = None  # RunStatus.checkpoint
        self._node_rank: int | None = None  # a gang node's rank, once past the barrier
        self._gang_idle: gang.GangIdle | None = None  # a gang node's side of the idle rule

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        """Run to the end and power off; returns the agent's exit code (always 0)."""
        try:
            state, exit_code, message = self._run()
        except Exception as err:
            log.exception("agent error")
            state, exit_code, message = runs.FAILED, None, f"agent error: {type(err).__name__}: {err}"
        self.outcome = (state, exit_code, message)
        try:
            self._finish(state, exit_code, message)
        except Exception:
            log.exception("could not finish the run cleanly")
        finally:
            self._power_off()
        return 0

    def _run(self) -> tuple[str, int | None, str]:
        self._open()
        spec, folder = self.spec, self.folder
        assert spec is not None and folder is not None and self.workdir is not None
        if spec.max_runtime_s:
            self.deadline = self.started_at + float(spec.max_runtime_s)
        workdir = Path(self.workdir)
        for sub in ("output", "checkpoints"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        agent_zip = self._install_agent_zip(workdir)
        if spec.code_uri:
            self._note(f"fetching code from {spec.code_uri}")
            fetch_code(folder, spec.code_uri, workdir)
        volumes = []
        if spec.volume_device and mount_volume(spec.volume_device, spec.volume_mount, self._note):
            volumes.append(spec.volume_mount)
        local_checkpoints = Path(checkpoint_dir(spec, str(workdir)))
        local_checkpoints.mkdir(parents=True, exist_ok=True)
        assert self.instance_id is not None
        checkpoints_in = folder
        all_ranks = spec.num_nodes > 1 and spec.checkpoint_ranks == "all"
        if all_ranks:  # each rank restores its own
            rank, ended = gang.find_rank(spec, folder, self.instance_id, self._note, self.should_stop)
            if ended:
                return ended
            self._node_rank = rank
            checkpoints_in = gang.checkpoint_folder(folder, spec, rank)
        self.checkpoints = CheckpointSync(
            checkpoints_in,
            local_checkpoints,
            self.instance_id,
            note=self._note,
            on_uploaded=self._uploaded,
            snapshots=spec.checkpoint_snapshots,
            dcp_shards=all_ranks and bool(self._node_rank),  # not DCP's coordinator
            keep_versions=KEEP_VERSIONS_ALL_RANKS if all_ranks else KEEP_VERSIONS,
        )
        if spec.handover_key and (ended := self._await_handover(spec.handover_key, spec.handover_timeout_s)):
            return ended
        restored = self.checkpoints.restore(gang.common_steps(folder, spec, self._note))
        gang.merge_ranks(folder, spec, self._node_rank, restored, self.checkpoints, self._note)
        self.resumed_step = restored.step if restored is not None else None
        self._report_file = Path(resume_report(str(workdir)))
        with contextlib.suppress(OSError):
            self._report_file.unlink()
        self._restore = restored.record() if restored is not None else self._nothing_restored()
        self._update(state=runs.SETUP, restored_step=self.resumed_step, restore=self._restore)
        resumed = restored is not None
        spec = self._with_secrets(spec)  # a copy for the job's environment only: never written
        setup_env = {**os.environ, **job_env(spec, str(workdir), self.resumed_step, agent_zip, resumed)}
        for number, cmd in enumerate(spec.setup_cmds, 1):
            if stop := self.should_stop():
                return stop.state, None, stop.message
            self._note(f"setup command {number}/{len(spec.setup_cmds)}")
            code, stop = run_process(
                ["bash", "-lc", cmd], setup_env, str(workdir), self._sink, self.should_stop
            )
            if stop:
                self._job_exited()
                return stop.state, code, stop.message
            if code != 0:
                return runs.FAILED, code, f"setup command {number} {cmd[:200]!r} exited with code {code}"

        if stop := self.should_stop():
            return stop.state, None, stop.message
        if spec.num_nodes > 1:  # a gang: every node at the barrier, then the job (``agent.gang``)
            spec, ended = gang.join(
                spec, folder, self.instance_id, self.metadata, self._note, self.should_stop
            )
            if ended:
                return ended
            self._node_rank = spec.node_rank
        argv, extra = build_job_command(spec, str(workdir), volumes, self.resumed_step, agent_zip, resumed)
        self._update(state=runs.RUNNING, job_started_at=time.time())
        interval = float(spec.checkpoint_interval_s or 0)
        if interval > 0:
            self._chores["checkpoints"] = Periodic(
                "checkpoints", interval, self._sync_checkpoints, run_first=False
            ).start()
        self._note(f"job started{f' in {spec.image}' if spec.image else ''}")
        code, stop = run_process(
            argv,
            {**os.environ, **extra},
            str(workdir),
            self._sink,
            self.should_stop,
            on_start=self._job_started,
            on_exit=lambda killed: (
                self.checkpoints.job_ended(time.time(), killed) if self.checkpoints else None
            ),
            on_stopping=self.checkpoints.job_stopping if self.checkpoints else None,
        )
        self._stop_chore("idle")
        if self._gang_idle is not None:  # a rank whose job ended keeps no hung gang alive
            self._gang_idle.ended()
        if stop:
            self._job_exited()
        if stop and spec.image:  # a killed `docker run` client leaves its container running
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(["docker", "rm", "-f", container_name(spec)], capture_output=True, timeout=60)
        if stop:
            return stop.state, code, stop.message
        if code == 0:
            return runs.SUCCEEDED, 0, ""
        return runs.FAILED, code, f"command exited with code {code}"

    def _open(self) -> None:
        """Find the spec and who we are, write ``starting`` and start the chores."""
        self.folder = self.folder or open_run_folder(self.run_uri)
        spec_error: Exception | None = None
        try:
            if self.spec is None:
                self.spec = read_spec(self.folder)
        except Exception as err:  # still report it, under our instance id
            spec_error = err
        cloud = self.spec.cloud if self.spec else FOLDER_CLOUD.get(self.folder.scheme, "gcloud")
        try:
            self.metadata = metadata_for(cloud)
            self.instance_id = self.instance_id or self.metadata.instance_id()
        except Exception as err:
            log.warning("metadata service unavailable (%s: %s)", type(err).__name__, err)
            self.instance_id = self.instance_id or socket.gethostname()
        self.streamer = LogStreamer(self.folder, self.instance_id)
        writer = self.writer = StatusWriter(self.folder, self.instance_id, self.started_at)
        if self.spec is not None and self.spec.live_uri:
            try:
                index = self.folder.at(self.spec.live_uri)
            except ValueError as err:  # not an s3:// / gs:// URI: the run folder alone, as before
                log.error("live index %r unusable (%s); writing heartbeats instead", self.spec.live_uri, err)
            else:
                self.beacon = BeaconWriter(
                    index, self.instance_id, lambda: writer.status, self.streamer.snapshot
                )
                writer.beacon = self.beacon
        writer.update()
        if spec_error is not None:
            raise spec_error
        assert self.spec is not None
        self._chores["heartbeat"] = Periodic("heartbeat", self.spec.heartbeat_interval_s, self.writer.beat)
        self._chores["logs"] = Periodic("logs", self.spec.log_interval_s, self._flush_logs, run_first=False)
        if self.metadata is not None:
            self._chores["metadata"] = Periodic("metadata", self.spec.metadata_poll_s, self._watch)
        lease = LeaseWatch(self.folder, self.spec.orphan_timeout_s, self.started_at)
        if lease.interval_s is not None:  # nobody renewing it for orphan_timeout ends the run
            self._chores["lease"] = Periodic(
                "lease", lease.interval_s, lambda: self._check_lease(lease), run_first=False
            )
        for chore in self._chores.values():
            chore.start()
        self.workdir = self.workdir or default_workdir(self.instance_id)
        log.info("run %s on %s in %s", self.spec.run_id, self.instance_id, self.workdir)

    def _finish(self, state: str, exit_code: int | None, message: str) -> None:
        """Results, last log chunk, final status: in this order, each attempted whatever failed before."""
        self._stop_chore("metadata")
        self._stop_chore("lease")
        self._stop_chore("idle")
        self._stop_chore("checkpoints", timeout=600.0)  # a round in progress finishes its upload
        writer = self.writer
        if self.folder is None or writer is None:
            log.error("no run folder or status to report to; final state %s: %s", state, message)
            return
        if self.notice is not None and "job_stopped_at" not in (self._interruption or {}):
            self._job_exited()  # stopped before the job ran, or it ended as the notice came
        if self.checkpoints is not None and self._uploads():  # what the job saved last (notice too)
            self._read_resume_report()
            try:
                self.checkpoints.sync()
            except Exception as err:
                self._note(f"checkpoint upload failed: {type(err).__name__}: {err}")
            else:
                checkpoint = self._checkpoint
                if self.notice is not None and checkpoint is not None:
                    self._record_interruption(
                        checkpoint_at=checkpoint["uploaded_at"], checkpoint_step=checkpoint["step"]
                    )
        deadline = time.monotonic() + self.finish_budget_s

        def left(at_least: float = 0.0) -> float:
            return max(at_least, deadline - time.monotonic())

        output = Path(self.workdir, "output") if self.workdir else None
        if output is not None and output.is_dir() and self.instance_id:
            prefix = runs.results_prefix(self.instance_id)
            try:
                keys = self.folder.upload_dir(
                    output, prefix, call=lambda up: retry(up, what="results upload", budget_s=left())
                )
                self._note(f"uploaded {len(keys)} result file(s)")
            except Exception as err:  # named with its destination: an access denied names no bucket
                failure = f"results upload to {self.folder.uri}/{prefix} failed: {type(err).__name__}: {err}"
                self._note(failure)
                if state == runs.SUCCEEDED:
                    state, message = runs.FAILED, failure
        self._note(f"finished: {state}" + (f", exit code {exit_code}" if exit_code is not None else ""))
        self._stop_chore("logs")
        if self.streamer is not None:
            streamer = self.streamer
            try:
                retry(lambda: streamer.flush(final=True), what="final log flush", budget_s=left())
            except Exception as err:  # the status still has to be written
                log.error("final log flush failed: %s: %s", type(err).__name__, err)
        self.outcome = (state, exit_code, message)
        changes: dict[str, Any] = {
            "state": state,
            "exit_code": exit_code,
            "message": message,
            "ended_at": time.time(),
        }
        try:  # still beating meanwhile: a slow store is not a dead agent
            self._final_status(writer, changes, left(self.finish_budget_s / 6))
            beacon = self.beacon
            if beacon is not None:  # after the final status; the end marker last of all
                final = writer.status if writer.status.final else replace(writer.status, **changes)
                retry(
                    lambda: beacon.publish_final(final),
                    what="final beacon",
                    budget_s=left(self.finish_budget_s / 12),
                )
                retry(
                    lambda: beacon.write_end(final),
                    what="end marker",
                    budget_s=left(self.finish_budget_s / 12),
                )
        finally:
            self._stop_chore("heartbeat")

    def _final_status(self, writer: StatusWriter, changes: dict[str, Any], budget_s: float) -> None:
        """status.json's final write. One that fails for good is logged, not raised: the live index (a
        prefix of its own, which may still take writes) then carries the outcome to the operator."""
        try:
            retry(lambda: writer.update(raise_errors=True, **changes), what="final status", budget_s=budget_s)
        except Exception as err:
            log.error("final status write failed: %s: %s", type(err).__name__, err)
            if self.beacon is None:
                raise

    def _power_off(self) -> None:
        power_off(self.poweroff)

    # -- stopping ----------------------------------------------------------------------------------
    def request_stop(self, request: StopRequest) -> bool:
        """Ask the running step to stop (first request wins: whether this one did); safe from threads
        and signal handlers."""
        with self._stop_lock:
            if self._stop is None:
                self._stop = request
                return True
            return False

    def stop_for_signal(self, name: str) -> None:
        """The instance shutting down under the agent (SIGTERM...): a notice of unknown length, so the
        job gets the grace of a 30 s notice (or ``stop_grace_s``, within it)."""
        stop_grace = self.spec.stop_grace_s if self.spec is not None else None
        grace = notice_grace(NOTICE_DEFAULT_LEFT_S, stop_grace, self.sync_reserve_s())
        self.request_stop(StopRequest(runs.INTERRUPTED, f"agent received {name}", grace))

    def sync_reserve_s(self) -> float:
        """Seconds to keep for the final checkpoint sync after the job exits: the last upload round's
        time with some margin, at least ``MIN_SYNC_RESERVE_S``."""
        last = self.checkpoints.last_round_s if self.checkpoints is not None else None
        return max(MIN_SYNC_RESERVE_S, SYNC_RESERVE_FACTOR * last) if last else MIN_SYNC_RESERVE_S

    def should_stop(self) -> StopRequest | None:
        if self._stop is None and self.deadline is not None and time.time() >= self.deadline:
            assert self.spec is not None
            limit = f"{float(self.spec.max_runtime_s or 0):g}"
            grace = self.spec.stop_grace_s if self.spec.stop_grace_s is not None else TIMEOUT_GRACE_S
            self.request_stop(StopRequest(runs.TIMED_OUT, f"exceeded max_runtime of {limit} s", grace))
        return self._stop

    def _watch(self) -> None:
        """Metadata chore: on a notice, stop the job first, then record it in the status."""
        if self.notice is not None or self.metadata is None:
            return
        notice = self.metadata.poll()
        if notice is None:
            return
        with self._interruption_lock:  # before the stop: the main thread adds to it once the job exits
            self._interruption = notice.interruption()
        self.notice = notice
        left = notice.at - time.time() if notice.at is not None else NOTICE_DEFAULT_LEFT_S
        stop_grace = self.spec.stop_grace_s if self.spec is not None else None
        grace = notice_grace(left, stop_grace, self.sync_reserve_s())
        message = f"{notice.kind} interruption notice (action {notice.action})"
        self.request_stop(StopRequest(runs.INTERRUPTED, message, grace))
        self._note(f"{message}: stopping the job, {grace:.1f} s grace of {max(left, 0):.1f} s left")
        self._record_interruption()

    def _await_handover(self, key: str, timeout_s: float) -> tuple[str, int | None, str] | None:
        """A make-before-break launch: the instance this one replaces is still stopping and uploading
        its last checkpoint; restoring before that upload completes would resume from an older step.
        Wait for the operator's marker (``runs.handover_key``), at most ``timeout_s`` (an operator that
        died mid-switch: its retry releases one of the two instances, and this one goes on)."""
        assert self.folder is not None
        self._note(f"waiting for the handover ({key}) before restoring the checkpoint")
        until = time.monotonic() + timeout_s
        while time.monotonic() < until:
            if stop := self.should_stop():
                return stop.state, None, stop.message
            try:
                if self.folder.get_text(key) is not None:
                    self._note("handover received: the instance before this one has synced its checkpoint")
                    return None
            except Exception as err:  # the bucket hiccuped: the next round reads again
                log.warning("could not read %s: %s", key, err)
            time.sleep(1.0)
        self._note(f"no handover within {timeout_s:.0f} s: restoring the newest complete checkpoint now")
        return None

    def _check_lease(self, lease: LeaseWatch) -> None:
        """Lease chore (``agent.lease``): a lapsed lease stops the job as ``max_runtime`` does; the
        run ends ``failed`` with a message naming the lapse, and ``orphaned.json`` records it."""
        if self._stop is not None:
            return
        message = lease.check()
        if message is None:
            return
        assert self.spec is not None
        grace = self.spec.stop_grace_s if self.spec.stop_grace_s is not None else TIMEOUT_GRACE_S
        if self.request_stop(StopRequest(runs.FAILED, message, max(0.0, float(grace)))):
            lease.record("agent")
            self._note(f"{message}: stopping the job ({float(grace):g} s grace), then powering off")

    def _record_interruption(self, **fields: object) -> None:
        """Add ``fields`` to the interruption record and write it; under a lock, so the last write
        holds every field whichever thread added it."""
        with self._interruption_lock:
            if self._interruption is None:
                return
            self._interruption.update(fields)
            self._update(interruption=dict(self._interruption))

    def _job_exited(self) -> None:
        """A stopped job (or setup command) exited: on a notice, the record says when."""
        if self.notice is not None:
            self._record_interruption(job_stopped_at=time.time())

    def _nothing_restored(self) -> dict[str, Any] | None:
        """Nothing was restored: on a relaunch of a job that made progress before, say so in one
        WARNING line and in the status (the ledger row's reason); on a first attempt, nothing."""
        assert self.checkpoints is not None and self.folder is not None and self.spec is not None
        note = self.checkpoints.restore_note or "nothing to restore"
        relaunched = int(self.spec.restarts or 0) > 0
        progress = "none of it kept" in note or "could be verified" in note
        with contextlib.suppress(Exception):
            keys = self.folder.list("instances/")
            others = [k for k in keys if k.endswith("/status.json") and f"/{self.instance_id}/" not in k]
            relaunched = relaunched or bool(others)
            interval = float(self.spec.checkpoint_interval_s or 0)
            for key in others if interval > 0 and not progress else []:
                text = self.folder.get_text(key)
                status = runs.RunStatus.from_json(text) if text else None
                end = status and (status.ended_at or status.updated_at)
                if status and status.job_started_at and end and end - status.job_started_at > interval:
                    progress = True
        if not (relaunched and progress):
            return None
        self._note(
            f"WARNING: relaunched, but no checkpoint was restored: {note}; the job starts from the beginning"
        )
        return {"note": note}

    def _read_resume_report(self) -> None:
        """The job's ``checkpoint.report_resumed(step)``: the step it really resumed from wins."""
        path = getattr(self, "_report_file", None)
        if path is None or self._restore is None or "version" not in self._restore:
            return
        try:
            step = int(path.read_text().strip())
        except (OSError, ValueError):
            return
        if self._restore.get("source") == "job" and self._restore.get("step") == step:
            return
        self._restore = {**self._restore, "step": step, "source": "job"}
        self.resumed_step = step
        self._update(restored_step=step, restore=dict(self._restore))

    def _uploaded(self, version: int, manifest: runs.Manifest) -> None:
        """CheckpointSync wrote a manifest (its uploads one at a time): the status tells the operator
        what a resume would keep, and its history every checkpoint taken (the page's timeline)."""
        at = time.time()
        self._checkpoint = {"step": manifest.step, "saved_at": manifest.saved_at, "uploaded_at": at}
        history = self.writer.status.with_checkpoint(at, manifest.step, version) if self.writer else None
        self._update(checkpoint=dict(self._checkpoint), checkpoint_history=history)

    def _job_started(self, pid: int) -> None:
        """``run_process``'s on_start: the checkpoint sync learns the job's pid, the watchdog starts."""
        if self.checkpoints is not None:
            self.checkpoints.job_started(pid)
        self._watch_idle(pid)

    # -- the hung-job watchdog ---------------------------------------------------------------------
    def _watch_idle(self, pid: int) -> None:
        """``run_process``'s on_start for the job: start the idle chore when ``idle_timeout_s`` is set.
        Never raises: the job is already running."""
        spec = self.spec
        if spec is None or not spec.idle_timeout_s or spec.idle_timeout_s <= 0:
            return
        try:
            if not proc_available():
                self._note("idle_timeout: no /proc on this machine to read CPU use from; not watching")
                return
            watch = IdleWatch(
                pid,
                float(spec.idle_timeout_s),
                gpu=bool(spec.gpus and spec.gpus > 0),
                note=self._note,
                container=container_name(spec) if spec.image else None,
            )
            interval = sample_interval(watch.timeout_s)
            if spec.num_nodes > 1 and self._node_rank is not None:
                assert self.folder is not None and self.instance_id is not None
                self._gang_idle = gang.GangIdle(
                    self.folder,
                    spec.num_nodes,
                    self._node_rank,
                    self.instance_id,
                    watch.timeout_s,
                    interval,
                    self._note,
                )
            self._chores["idle"] = Periodic("idle", interval, lambda: self._check_idle(watch)).start()
        except Exception as err:
            self._note(f"idle_timeout: could not start the watchdog: {type(err).__name__}: {err}")

    def _check_idle(self, watch: IdleWatch) -> None:
        """Idle chore: once the job used no CPU (nor GPU) for the timeout, stop it as ``idle``; a
        gang's node only once every node of the gang is idle too (``gang.GangIdle``)."""
        if self._stop is not None:
            return
        idle = watch.poll()
        gang_idle = self._gang_idle
        if gang_idle is not None:
            if not gang_idle.check(idle, time.time() - watch.idle_for):
                return
            message = (
                f"no CPU or GPU use for {watch.timeout_s:g} s on all {gang_idle.n} nodes of the gang "
                "(idle_timeout): stopped the hung job"
            )
        elif not idle:
            return
        else:
            message = f"no CPU or GPU use for {watch.timeout_s:g} s (idle_timeout): stopped the hung job"
        assert self.spec is not None
        grace = self.spec.stop_grace_s if self.spec.stop_grace_s is not None else TIMEOUT_GRACE_S
        if self.request_stop(StopRequest(runs.IDLE, message, max(0.0, float(grace)))):
            self._note(f"{message} ({grace:g} s grace)")

    def _with_secrets(self, spec: runs.RunSpec) -> runs.RunSpec:
        """The spec with ``secret_env`` read (instance identity) into ``env``; the log redacts them."""
        if not spec.secret_env:
            return spec
        from dataclasses import replace

        from airflow_cloudtrain.agent.secrets import resolve_secret_env
        from airflow_cloudtrain.contract.secret_refs import redactions

        self._note(f"reading {len(spec.secret_env)} secret(s): {', '.join(sorted(spec.secret_env))}")
        values = resolve_secret_env(spec.secret_env)
        if self.streamer is not None:
            self.streamer.redact(redactions(list(values.values())))
        return replace(spec, env={**spec.env, **values}, secret_env={})

    # -- small helpers -----------------------------------------------------------------------------
    def _sync_checkpoints(self) -> None:
        """The periodic chore: upload the newest complete checkpoint if it is new or changed."""
        if self.checkpoints is not None and self._uploads():
            self._read_resume_report()
            self.checkpoints.sync()

    def _uploads(self) -> bool:
        """A gang's node uploads only with ``checkpoint_ranks="all"`` or as the head (``agent.gang``)."""
        return self.spec is None or gang.uploads_checkpoints(self.spec, self._node_rank)

    def _update(self, **changes: Any) -> None:
        if self.writer is not None:
            self.writer.update(**changes)

    def _flush_logs(self) -> None:
        """Logs chore: upload new chunks; when some went up, the beacon says so (even if a later
        chunk of the round failed)."""
        streamer = self.streamer
        if streamer is None:
            return
        before = streamer.seq
        try:
            streamer.flush()
        finally:
            if self.beacon is not None and streamer.seq != before:
                self.beacon.publish()

    def _sink(self, data: bytes) -> None:
        if self.streamer is not None:
            self.streamer.write(data)

    def _note(self, message: str) -> None:
        """A line for the job log (echoed to the agent's stdout too); never pass env values here."""
        if self.streamer is not None:
            self.streamer.note(message)
        else:
            log.info("%s", message)

    def _stop_chore(self, name: str, timeout: float = 30.0) -> None:
        chore = self._chores.pop(name, None)
        if chore is not None:
            chore.stop(timeout)

    def _install_agent_zip(self, workdir: Path) -> str | None:
        """Copy the agent zip (this very program; built when running from source) into the workdir,
        where the job, in a container too, can put it on its ``PYTHONPATH``. None if that failed."""
        dest = workdir / AGENT_ZIP_IN_WORKDIR
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            source = running_zip()
            if source is not None:
                shutil.copyfile(source, tmp)
            else:
                from airflow_cloudtrain.contract.bootstrap import build_agent_zip

                tmp.write_bytes(build_agent_zip())
            os.replace(tmp, dest)
        except Exception as err:
            self._note(f"could not put the agent zip on the job's PYTHONPATH: {type(err).__name__}: {err}")
            return None
        return str(dest)


def read_spec(folder: RunFolder) -> runs.RunSpec:
    """The run folder's spec.json (retried on transient errors); raises when it is missing."""
    text = retry(lambda: folder.get_text(runs.SPEC_KEY), what="spec read")
    if text is None:
        raise RuntimeError(f"no {runs.SPEC_KEY} in {folder.uri}")
    return runs.RunSpec.from_json(text)


def power_off(command: str | None) -> None:
    """Run the power-off command (``--poweroff``), if any; never raises."""
    if not command:
        return
    log.info("powering off: %s", command)
    try:
        subprocess.run(command, shell=True, check=False)
    except Exception:
        log.exception("power-off command failed")


def running_zip() -> Path | None:
    """The zip this agent is imported from (the zipapp on an instance), None when run from source."""
    import airflow_cloudtrain

    for parent in Path(airflow_cloudtrain.__file__).parents:
        if parent.is_file():
            return parent if zipfile.is_zipfile(parent) else None
    return None

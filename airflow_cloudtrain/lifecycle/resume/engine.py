"""The checkpoint-resume loop as an ``Engine``: ``CheckpointResumeOperator``'s run machinery.

The operator's skeleton (``operators.base.EngineOperator``) drives it like any engine; what it waits
on (the handle) is one of two things:

- an attempt in flight, its ``LaunchRecord``: waited on by ``RunAttempt.wait``, or deferred on a
  ``triggers.run.RunTrigger`` (the single run's trigger);
- a ``Pause`` before the next launch (no offer had capacity, or the deadline policy waits): slept
  here, or deferred on Airflow's ``DateTimeTrigger``.

``advance`` finishes what ended (the attempt released and accounted into the ledger, or the pause
closed) and runs the loop's next steps (``RecoveryLoop.next_step``): launches (a launch that found
no capacity is a ledger row and the loop goes on), until the next handle to wait on, the job's end
(the XCom) or a failure (a spent budget: the task fails saying why). Each deferral resumes in a new
process: the loop is rebuilt from its saved history, so the engine holds nothing the history lacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from airflow_cloudtrain.core.records import LaunchRecord, Outcome

if TYPE_CHECKING:
    from airflow_cloudtrain.core.engine import Engine, Log, Step, TriggerSpec
    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt
    from airflow_cloudtrain.lifecycle.run.engine import AttemptEngine
    from airflow_cloudtrain.spec import RunConfig

TIMER_TRIGGER = "airflow.providers.standard.triggers.temporal.DateTimeTrigger"
PAUSE_RENEW_S = 30.0  # a blocking pause wakes this often to renew the run's lease when due


@dataclass(frozen=True)
class Pause:
    """The loop waits until ``until`` (unix time) before its next launch, for ``reason``."""

    until: float
    reason: str = ""


Handle = Union[LaunchRecord, Pause]  # noqa: UP007  (a runtime alias; py3.10 has the | form too)


class ResumeRun:
    """The loop over attempts, one ``Engine`` step at a time.

    ``load`` builds the loop from the task's rendered arguments and saved history (called once, on
    first use); ``by_run_key`` is a plain attempt of the same run, what releases it when the loop
    cannot be rebuilt (the bucket is down) after a failed deferral: releasing needs only the run
    key (the ledger and the tag sweep)."""

    def __init__(
        self,
        load: Callable[[], RecoveryLoop],
        by_run_key: Callable[[], RunAttempt],
        log: Log,
    ) -> None:
        self._load = load
        self._by_run_key = by_run_key
        self.log = log
        self._loop: RecoveryLoop | None = None
        self.attempt: RunAttempt | None = None  # the current (or last) attempt
        self._handle: Handle | None = None  # what the engine waits on now
        self.killed = False

    @property
    def loop(self) -> RecoveryLoop:
        if self._loop is None:
            self._loop = self._load()
            self._loop.killed = self.killed
        return self._loop

    @property
    def config(self) -> RunConfig:
        return self.loop.ctx.config

    # -- the Engine calls ------------------------------------------------------------------------
    def start(self) -> Step[Handle]:
        try:
            return self._next()
        except Exception as err:
            # a try that fails before its attempt runs (its ledger cannot be saved: the fault
            # campaign's s105) must not leave what an earlier try launched running until gc
            if not self.killed:
                self.abandon(f"the try failed before its attempt: {err}")
            raise

    def over(self, handle: Handle) -> bool:
        if isinstance(handle, Pause):  # a timer already past would fire at once: no deferral
            return time.time() >= handle.until
        return self._current().over(handle)

    def trigger(self, handle: Handle) -> TriggerSpec:
        from airflow_cloudtrain.core.engine import TriggerSpec

        if isinstance(handle, Pause):
            from datetime import datetime, timezone

            moment = datetime.fromtimestamp(handle.until, timezone.utc)
            return TriggerSpec(TIMER_TRIGGER, {"moment": moment})
        return self._probing(handle).trigger(handle)

    def wait(self, handle: Handle) -> Outcome | None:
        if isinstance(handle, Pause):  # on_kill may come while we sleep
            from airflow_cloudtrain.core.engine import sleep_unless

            lease = self._current().lease  # still wanted between attempts (``core.lease``)
            while not self.killed and time.time() < handle.until:
                lease.renew()
                sleep_unless(min(handle.until - time.time(), PAUSE_RENEW_S), lambda: self.killed)
            return None
        return self._probing(handle).wait(handle)

    def advance(self, handle: Handle, outcome: Outcome | None) -> Step[Handle]:
        from airflow_cloudtrain.core.waiting import PROBE_DUE

        if isinstance(handle, Pause):
            self.loop.end_wait()
        elif outcome is not None and outcome.state == PROBE_DUE:
            return self._probe(handle)
        elif outcome is not None:
            self.loop.finish(self._current(), handle, outcome)
        return self._next()

    def resume(self, event: Any) -> Step[Handle]:
        """Back from a ``RunTrigger`` (its event names the launch and the outcome: finish that
        attempt, then go on) or from the timer (its event is the moment: the pause is over)."""
        if isinstance(event, dict) and "outcome" in event:
            launch = LaunchRecord.from_dict(event["launch"])
            self.attempt = self.loop.attempt(launch.cloud)
            return self.advance(launch, Outcome.from_dict(event["outcome"]))
        return self.advance(Pause(time.time()), None)

    def abandon(self, reason: str) -> None:
        """Release the run; the attempt waited on gets a ledger row (``abandoned``) with its cost.

        In a fresh engine (a failed deferral) the attempt waited on is the one the store recorded."""
        try:
            loop = self.loop
        except Exception as err:
            self.log.warning("Could not load the run's loop (%s); releasing by run key", err)
            self._by_run_key().abandon()
            return
        attempt = self.attempt or loop.attempt()
        waited_on = self._handle if self._handle is not None else attempt.stored
        attempt.abandon()
        if isinstance(waited_on, LaunchRecord):
            try:
                loop.abandoned(waited_on, reason)
            except Exception as err:  # the release above is what mattered
                self.log.warning("Could not record the failed attempt in the ledger: %s", err)

    def kill(self) -> None:
        """Stop the loop (no further launch or wait) and release the current attempt."""
        self.killed = True
        if self._loop is not None:
            self._loop.killed = True
        if self.attempt is not None:
            self.attempt.kill()

    # -- the loop's steps ------------------------------------------------------------------------
    def _current(self) -> RunAttempt:
        if self.attempt is None:
            self.attempt = self.loop.attempt()
        return self.attempt

    def _next(self) -> Step[Handle]:
        """The loop's steps until one waits (an attempt in flight, a pause), ends or fails."""
        from airflow.exceptions import AirflowException

        from airflow_cloudtrain.core.engine import Step
        from airflow_cloudtrain.core.launcher import LaunchFailed

        loop = self.loop
        while True:
            if self.killed:
                raise AirflowException(f"task killed: the loop stopped (run {loop.history.run_id})")
            if loop.history.switch:  # an earlier worker died mid-switch: undo its spot launch first
                from airflow_cloudtrain.lifecycle.resume.switch import resolve_switch

                resolve_switch(loop)
            step = loop.next_step()
            if step.kind == "done":
                loop.close(True)
                self._handle = None
                return Step.finished(loop.result())
            if step.kind == "fail":
                loop.close(False, step.reason)
                raise AirflowException(f"{step.reason} (run {loop.history.run_id})")
            if step.kind == "wait":
                self.log.info("Waiting %.0f s before the next launch: %s", step.seconds, step.reason)
                loop.begin_wait(step.reason)
                return self._waiting(Pause(time.time() + step.seconds, step.reason))
            loop.unwatched(None)  # before the attempt is made: its job's CLOUDTRAIN_RESTARTS counts them
            attempt = self.attempt = loop.launch_attempt(step.cloud)  # before start: on_kill sees it
            try:
                launch, done = attempt.start()
            except LaunchFailed as err:  # start() released whatever the failed launch made
                loop.launch_failed(step.cloud or loop.settings.cloud, err)
                continue
            loop.unwatched(launch)  # what earlier tries launched and nobody reported: counted
            if done is None:
                return self._waiting(launch)
            loop.finish(attempt, launch, done)  # an earlier try's job already ended

    def _probing(self, launch: LaunchRecord) -> RunAttempt:
        """The attempt whose wait on ``launch`` stops at the loop's next probe (``recovery.next_probe_at``:
        an on-demand attempt of ``policy="deadline"``), in the blocking wait and the trigger alike."""
        from dataclasses import replace

        attempt = self._current()
        at = self.loop.next_probe_at(launch)
        attempt.ctx.wait = replace(attempt.ctx.wait, probe_at=at)
        return attempt

    def _probe(self, launch: LaunchRecord) -> Step[Handle]:
        """The on-demand attempt's wait stopped for a probe: ask the policy, maybe switch to spot
        (``lifecycle.resume.switch``); then wait on whichever attempt runs now."""
        from airflow_cloudtrain.lifecycle.resume.switch import switch_to_spot

        loop = self.loop
        step = loop.probe_step(launch)
        if step.kind == "launch" and step.cloud is not None:
            switched = switch_to_spot(loop, self._current(), launch, step.cloud, step.reason)
            if switched is not None:  # a fresh attempt: its budget counts the on-demand one's cost
                _, spot = switched
                self.attempt = loop.attempt(spot.cloud)
                return self._waiting(spot)
        return self._waiting(launch)

    def _waiting(self, handle: Handle) -> Step[Handle]:
        from airflow_cloudtrain.core.engine import Step

        self._handle = handle
        return Step.waiting(handle)


if TYPE_CHECKING:  # both protocols, checked
    _engine: Engine[Handle] = ResumeRun.__new__(ResumeRun)
    _attempts: AttemptEngine = ResumeRun.__new__(ResumeRun)

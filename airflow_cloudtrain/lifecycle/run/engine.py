"""The single run as an ``Engine``: one ``RunAttempt`` from launch to the delivered result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.core.records import LaunchRecord, Outcome

if TYPE_CHECKING:
    from airflow_cloudtrain.core.engine import Engine, Step, TriggerSpec
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt
    from airflow_cloudtrain.spec import RunConfig


class AttemptEngine(Protocol):
    """What ``CloudTrainOperator`` (and ``CheckpointResumeOperator``) read of their engine besides
    the ``Engine`` calls: the rendered configuration (for the run's one "bid ignored" line) and the
    attempt in flight (its console links)."""

    @property
    def config(self) -> RunConfig: ...

    @property
    def attempt(self) -> RunAttempt | None: ...


def raise_for(result: Outcome, run_id: str) -> None:
    """The task fails on anything but success, naming an interruption as one."""
    if result.ok:
        return
    from airflow.exceptions import AirflowException

    prefix = "spot interruption: " if result.interrupted else ""
    raise AirflowException(f"{prefix}{result.message or result.state} (run {run_id})")


class SingleRun:
    """``CloudTrainOperator``'s engine: launch or adopt, wait, release, account, deliver."""

    def __init__(self, attempt: RunAttempt) -> None:
        self.attempt: RunAttempt = attempt

    @property
    def config(self) -> RunConfig:
        return self.attempt.ctx.config

    def start(self) -> Step[LaunchRecord]:
        from airflow_cloudtrain.core.engine import Step

        launch, done = self.attempt.start()
        return Step.waiting(launch) if done is None else self.advance(launch, done)

    def over(self, handle: LaunchRecord) -> bool:
        return self.attempt.over(handle)

    def trigger(self, handle: LaunchRecord) -> TriggerSpec:
        return self.attempt.trigger(handle)

    def wait(self, handle: LaunchRecord) -> Outcome:
        return self.attempt.wait(handle)

    def advance(self, handle: LaunchRecord, outcome: Outcome) -> Step[LaunchRecord]:
        from airflow_cloudtrain.core.engine import Step

        record = self.attempt.finish(handle, outcome)
        raise_for(outcome, handle.run_id)
        return Step.finished(record.result())

    def resume(self, event: Any) -> Step[LaunchRecord]:
        return self.advance(LaunchRecord.from_dict(event["launch"]), Outcome.from_dict(event["outcome"]))

    def abandon(self, reason: str) -> None:
        self.attempt.abandon()

    def kill(self) -> None:
        self.attempt.kill()


if TYPE_CHECKING:  # both halves of the protocol, checked
    _single: Engine[LaunchRecord] = SingleRun.__new__(SingleRun)
    _attempts: AttemptEngine = SingleRun.__new__(SingleRun)

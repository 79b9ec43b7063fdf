"""The single run as an ``Engine``: one ``RunAttempt`` from launch to the delivered result."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.core.records import LaunchRecord, Outcome

if TYPE_CHECKING:
    from airflow_cloudtrain.core.engine import Step, TriggerSpec
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt


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
        self.attempt = attempt

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

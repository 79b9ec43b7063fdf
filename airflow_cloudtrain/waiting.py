"""When is a run over, and how did it end? One pure decision for blocking and deferrable waits.

Inputs are what the operator can see: the agent's status in the run folder and the instance as the
cloud reports it. The instance ending without a final status means the agent never got to say
(spot interruption, external termination, crash); the cloud's state reason then tells which.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.clouds.base import ENDED_STATES, STOPPED, Instance
from airflow_cloudtrain.runs import INTERRUPTED, SUCCEEDED, RunStatus


def outcome(
    status: RunStatus | None, instance: Instance | None, ended_grace_over: bool
) -> dict[str, Any] | None:
    """None while the run goes on, else an event payload: ``{"status": "success" | "error", ...}``.

    ``ended_grace_over`` is True once the instance has been seen ended for a little while: an agent
    writes its final status just before powering off, so an ended instance gets one more read.
    """
    if status is not None and status.final:
        interrupted = status.state == INTERRUPTED or bool(status.interruption)
        return {
            "status": "success" if status.state == SUCCEEDED else "error",
            "state": status.state,
            "exit_code": status.exit_code,
            "message": status.message,
            "interrupted": interrupted and status.state != SUCCEEDED,
            "interruptions": 1 if status.interruption else 0,
        }
    if instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED):
        if not ended_grace_over:
            return None
        preempted = instance.preempted or bool(status and status.interruption)
        what = "a spot interruption" if preempted else f"the instance being {instance.state}"
        return {
            "status": "error",
            "state": "interrupted" if preempted else "lost",
            "exit_code": None,
            "message": f"instance {instance.id} ended before the job finished: {what}"
            + (f" ({instance.state_reason})" if instance.state_reason else ""),
            "interrupted": preempted,
            "interruptions": 1 if preempted else 0,
        }
    return None


ENDED_GRACE_S = 3.0  # the agent writes its final status before powering off; this covers the race


class RunWatch:
    """The per-run state of a wait, shared by the blocking loop and the trigger.

    Remembers since when the instance has been seen ended (for the grace above) and when the wait
    must give up (``max_runtime`` plus a margin, in case the agent itself could not stop the job).
    """

    def __init__(self, deadline: float | None, clock: Any = None) -> None:
        import time

        self.deadline = deadline
        self.clock = clock or time.monotonic
        self.wall = time.time
        self.ended_since: float | None = None

    def decide(self, status: RunStatus | None, instance: Instance | None) -> dict[str, Any] | None:
        if instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED):
            self.ended_since = self.ended_since or self.clock()
        grace_over = self.ended_since is not None and self.clock() - self.ended_since >= ENDED_GRACE_S
        event = outcome(status, instance, grace_over)
        if event is None and self.deadline is not None and self.wall() > self.deadline:
            event = {"status": "error", "state": "timed_out", "exit_code": None, "interrupted": False,
                     "interruptions": 0, "message": "max_runtime passed and the agent did not stop the job"}  # fmt: skip
        return event

"""When is a run over, and how did it end? One pure decision for blocking and deferrable waits.

Inputs are what the operator can see: the agent's status in the run folder and the instance as the
cloud reports it. The instance ending without a final status means the agent never got to say
(spot interruption, external termination, crash); the cloud's state reason then tells which.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.contract.runs import INTERRUPTED, SUCCEEDED, RunStatus
from airflow_cloudtrain.core.cloud import ENDED_STATES, STOPPED, Instance
from airflow_cloudtrain.core.records import ERROR, SUCCESS, Outcome


def outcome(status: RunStatus | None, instance: Instance | None, ended_grace_over: bool) -> Outcome | None:
    """None while the run goes on, else how it ended.

    ``ended_grace_over`` is True once the instance has been seen ended for a little while: an agent
    writes its final status just before powering off, so an ended instance gets one more read.
    """
    if status is not None and status.final:
        interrupted = status.state == INTERRUPTED or bool(status.interruption)
        return Outcome(
            status=SUCCESS if status.state == SUCCEEDED else ERROR,
            state=status.state,
            exit_code=status.exit_code,
            message=status.message,
            interrupted=interrupted and status.state != SUCCEEDED,
            interruptions=1 if status.interruption else 0,
            ended_at=status.ended_at,
        )
    if instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED):
        if not ended_grace_over:
            return None
        preempted = instance.preempted or bool(status and status.interruption)
        what = "a spot interruption" if preempted else f"the instance being {instance.state}"
        return Outcome(
            status=ERROR,
            state="interrupted" if preempted else "lost",
            message=f"instance {instance.id} ended before the job finished: {what}"
            + (f" ({instance.state_reason})" if instance.state_reason else ""),
            interrupted=preempted,
            interruptions=1 if preempted else 0,
        )
    return None


ENDED_GRACE_S = 3.0  # the agent writes its final status before powering off; this covers the race


class RunWatch:
    """The per-run state of a wait, shared by the blocking loop and the trigger.

    Besides the final status and the instance state it watches the agent itself: an agent that
    never reports (the bootstrap failed) or stops beating (killed, out of memory, machine hung)
    leaves an instance running that nobody will power off, so the wait ends as ``lost`` and the
    operator terminates it. It also gives up at the deadline (``max_runtime`` plus a margin).
    """

    def __init__(
        self,
        deadline: float | None,
        launched_at: float | None = None,
        startup_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        clock: Any = None,
        wall: Any = None,
    ) -> None:
        import time

        self.deadline = deadline
        self.launched_at = launched_at
        self.startup_timeout = startup_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock or time.monotonic
        self.wall = wall or time.time
        self.ended_since: float | None = None
        self.ended_seen_at: float | None = None  # wall time, for the ledger

    def decide(
        self, status: RunStatus | None, instance: Instance | None, heartbeat_at: float | None = None
    ) -> Outcome | None:
        if instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED):
            self.ended_since = self.ended_since or self.clock()
            self.ended_seen_at = self.ended_seen_at or self.wall()
        grace_over = self.ended_since is not None and self.clock() - self.ended_since >= ENDED_GRACE_S
        event = outcome(status, instance, grace_over)
        if event is None:
            event = self._agent_silent(status, heartbeat_at)
        if event is None and self.deadline is not None and self.wall() > self.deadline:
            event = Outcome.lost("timed_out", "max_runtime passed and the agent did not stop the job")
        if event is not None:
            event.instance = instance.to_dict() if instance else None
            event.seen_ended_at = self.ended_seen_at
        return event

    def _agent_silent(self, status: RunStatus | None, heartbeat_at: float | None) -> Outcome | None:
        now = self.wall()
        if (
            status is None
            and self.startup_timeout
            and self.launched_at
            and now - self.launched_at > self.startup_timeout
        ):
            return Outcome.lost(
                "lost",
                f"the agent never reported within startup_timeout={self.startup_timeout:.0f}s "
                "(the bootstrap failed or the instance cannot reach the bucket)",
            )
        if status is not None and not status.final and self.heartbeat_timeout:
            last = max(heartbeat_at or 0.0, status.updated_at or 0.0, status.started_at or 0.0)
            if last and now - last > self.heartbeat_timeout:
                return Outcome.lost(
                    "lost",
                    f"the agent stopped beating {now - last:.0f}s ago "
                    f"(heartbeat_timeout={self.heartbeat_timeout:.0f}s)",
                )
        return None


def parse_heartbeat(raw: bytes | str | None) -> float | None:
    """The heartbeat file holds the agent's unix time; anything else counts as no beat."""
    try:
        return float(raw.decode() if isinstance(raw, bytes) else raw) if raw else None
    except ValueError:
        return None

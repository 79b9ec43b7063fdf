"""When is a run over, and how did it end? One pure decision for blocking and deferrable waits.

Inputs are what the operator can see: the agent's status in the run folder and the instance as the
cloud reports it. The instance ending without a final status means the agent never got to say
(spot interruption, external termination, crash); the cloud's state reason then tells which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.runs import INTERRUPTED, SUCCEEDED, RunStatus
from airflow_cloudtrain.core.cloud import ENDED_STATES, STOPPED, Instance
from airflow_cloudtrain.core.records import ERROR, SUCCESS, Outcome

if TYPE_CHECKING:
    from airflow_cloudtrain.core.budget import BudgetWatch
    from airflow_cloudtrain.storage import RunFolder


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


PROBE_DUE = "probe_due"  # not an end: the wait stopped so the resume loop can look at spot (``RunWatch``)
ENDED_GRACE_S = 3.0  # the agent writes its final status before powering off; this covers the race


class RunWatch:
    """The per-run state of a wait, shared by the blocking loop and the trigger.

    Besides the final status and the instance state it watches the agent itself: an agent that
    never reports (the bootstrap failed) or stops beating (killed, out of memory, machine hung)
    leaves an instance running that nobody will power off, so the wait ends as ``lost`` and the
    operator terminates it. It also gives up at the deadline (``max_runtime`` plus a margin).
    """

    budget: BudgetWatch | None = None  # ``max_cost``: set by the caller (``core.budget``)
    # the resume loop's next look at spot while an on-demand attempt runs (unix time; None: never):
    # the wait ends ``probe_due`` then, the run untouched, and the loop decides (``lifecycle.resume``)
    probe_at: float | None = None

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
        self.last_beat: float | None = None  # the newest heartbeat read (``needs_heartbeat``)

    def needs_heartbeat(self, status: RunStatus | None) -> bool:
        """Whether reading the agent's heartbeat now could change the decision. Only a running
        status is judged by it (with a ``heartbeat_timeout``), and only once what the wait knows (the
        last beat read, the status's own times) is older than half the timeout: a wait then reads the
        heartbeat a few times per timeout instead of every poll (one or two GETs less per poll),
        and past half the timeout every poll, so a silent agent is found exactly as soon as before."""
        if not self.heartbeat_timeout or status is None or status.final:
            return False
        known = max(self.last_beat or 0.0, status.updated_at or 0.0, status.started_at or 0.0)
        return self.wall() - known > self.heartbeat_timeout / 2

    def decide(
        self, status: RunStatus | None, instance: Instance | None, heartbeat_at: float | None = None
    ) -> Outcome | None:
        if heartbeat_at is not None:
            self.last_beat = max(self.last_beat or 0.0, heartbeat_at)
        if instance is not None and (instance.state in ENDED_STATES or instance.state == STOPPED):
            self.ended_since = self.ended_since or self.clock()
            self.ended_seen_at = self.ended_seen_at or self.wall()
        grace_over = self.ended_since is not None and self.clock() - self.ended_since >= ENDED_GRACE_S
        event = outcome(status, instance, grace_over)
        if event is None:
            event = self._agent_silent(status, heartbeat_at)
        if event is None and self.deadline is not None and self.wall() > self.deadline:
            event = Outcome.lost("timed_out", "max_runtime passed and the agent did not stop the job")
        if event is None and self.budget is not None:
            event = self.budget.check(self.wall())
        if event is None and self.probe_at is not None and self.wall() >= self.probe_at:
            return Outcome(ERROR, PROBE_DUE, message="time to ask the spot policy (the run goes on)")
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
            last = max(self.last_beat or 0.0, status.updated_at or 0.0, status.started_at or 0.0)
            if last and now - last > self.heartbeat_timeout:
                return Outcome.lost(
                    "lost",
                    f"the agent stopped beating {now - last:.0f}s ago "
                    f"(heartbeat_timeout={self.heartbeat_timeout:.0f}s)",
                )
        return None


class GangWatch:
    """The one outcome of a gang (``num_nodes`` > 1), shared by the blocking wait and the trigger.

    Each node has its own ``RunWatch`` (final status, instance state, silent agent, deadline). The gang
    succeeds when every node's job has ended with success; the first node whose job fails, whose
    instance ends without a final status or whose agent goes silent ends the gang: the outcome names
    that node's rank (``Outcome.rank``), instance and exit code; a node interrupted (with notice: its
    agent reports it; without: the cloud took the instance) makes the gang's outcome ``interrupted``
    even when another node's job failed first because of it (``_cause``), and the caller's release stops the other nodes (their
    agents get SIGTERM and upload their logs and checkpoints). A node that finished first just waits
    for the others: its success is remembered, its instance may already be gone.
    """

    budget: BudgetWatch | None = None  # ``max_cost``, for every node together (``core.budget``)

    def __init__(
        self,
        node_ids: list[str],
        deadline: float | None,
        launched_at: float | None = None,
        startup_timeout: float | None = None,
        heartbeat_timeout: float | None = None,
        clock: Any = None,
        wall: Any = None,
    ) -> None:
        self.node_ids = list(node_ids)
        self.watches = [
            RunWatch(deadline, launched_at, startup_timeout, heartbeat_timeout, clock, wall) for _ in node_ids
        ]
        self.done: dict[int, Outcome] = {}  # rank -> its successful end

    def needs_heartbeat(self, rank: int, status: RunStatus | None) -> bool:
        """``RunWatch.needs_heartbeat`` of the node of ``rank``; never for a node that finished."""
        return rank not in self.done and self.watches[rank].needs_heartbeat(status)

    def decide(
        self,
        statuses: Sequence[RunStatus | None],
        instances: Sequence[Instance | None],
        heartbeats: Sequence[float | None] | None = None,
    ) -> Outcome | None:
        """None while the gang goes on, else its one outcome (``nodes``: every node's end so far)."""
        beats = heartbeats or [None] * len(self.node_ids)
        failed: list[tuple[int, Outcome]] = []
        for rank, watch in enumerate(self.watches):
            if rank in self.done:
                continue
            event = watch.decide(statuses[rank], instances[rank], beats[rank])
            if event is None:
                continue
            if event.ok:
                self.done[rank] = event
                continue
            failed.append((rank, event))
        if failed:
            return self._failed(*self._cause(failed, statuses, instances))
        if len(self.done) < len(self.node_ids):
            if self.budget is not None and (over := self.budget.check(self.watches[0].wall())) is not None:
                over.nodes = self._nodes()
                return over
            return None
        head = self.done[0]
        return Outcome(
            status=SUCCESS,
            state=head.state,
            exit_code=head.exit_code,
            message=f"all {len(self.node_ids)} nodes succeeded",
            instance=head.instance,
            ended_at=max((e.ended_at or 0.0 for e in self.done.values()), default=0.0) or None,
            nodes=self._nodes(),
        )

    def _cause(
        self,
        failed: list[tuple[int, Outcome]],
        statuses: Sequence[RunStatus | None],
        instances: Sequence[Instance | None],
    ) -> tuple[int, Outcome]:
        """The node that ended the gang. A lost node is an interruption, never the job's error: when
        one node is interrupted, the others' jobs often fail right after (their peer's sockets close),
        sometimes within the same poll, or before the cloud reports the lost instance ended. So an
        interrupted node wins over a failed one, and so does a node that got a notice (its agent is
        still stopping) or whose instance the cloud took back (still within the ended grace)."""
        for rank, event in failed:
            if event.interrupted:
                return rank, event
        for rank in range(len(self.node_ids)):
            if rank in self.done:
                continue
            status, instance = statuses[rank], instances[rank]
            noticed = bool(status is not None and status.interruption)
            taken = instance is not None and instance.preempted
            if noticed or taken:
                what = "got an interruption notice" if noticed else "was taken back by the cloud"
                return rank, Outcome(
                    status=ERROR,
                    state="interrupted",
                    message=f"a spot interruption: instance {self.node_ids[rank]} {what}",
                    interrupted=True,
                    interruptions=1,
                    instance=instance.to_dict() if instance else None,
                )
        return failed[0]

    def _failed(self, rank: int, event: Outcome) -> Outcome:
        iid = self.node_ids[rank]
        if event.exit_code is not None:
            what = f"exited with code {event.exit_code}" + (f" ({event.message})" if event.message else "")
        else:
            what = event.message or event.state
        event.message = f"node rank {rank} ({iid}) {what}; the gang's other nodes were stopped"
        event.nodes = self._nodes({rank: event})
        event.rank = rank
        return event

    def _nodes(self, extra: dict[int, Outcome] | None = None) -> list[dict[str, Any]]:
        ends = {**self.done, **(extra or {})}
        return [
            {
                "rank": rank,
                "instance_id": iid,
                "exit_code": ends[rank].exit_code if rank in ends else None,
                "state": ends[rank].state if rank in ends else "stopped",
            }
            for rank, iid in enumerate(self.node_ids)
        ]


def parse_heartbeat(raw: bytes | str | None) -> float | None:
    """The heartbeat file holds the agent's unix time; anything else counts as no beat."""
    try:
        return float(raw.decode() if isinstance(raw, bytes) else raw) if raw else None
    except ValueError:
        return None


def read_heartbeat(folder: RunFolder, live: RunFolder | None, instance_id: str) -> float | None:
    """Blocking: an agent's last heartbeat, the newer of its run folder's heartbeat file and the live
    index's ``<instance>.beat`` (``live``; an agent without a live index, or one that could not write to
    it, falls back to the file). The blocking wait's and the trigger's gang wait's one reading."""
    from airflow_cloudtrain.contract.runs import beat_name, heartbeat_key

    beats = [parse_heartbeat(folder.get_text(heartbeat_key(instance_id)))]
    if live is not None:
        beats.append(parse_heartbeat(live.get_text(beat_name(instance_id))))
    return max((b for b in beats if b is not None), default=None)

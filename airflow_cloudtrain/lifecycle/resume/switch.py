"""Leaving a running on-demand attempt for spot, make-before-break (``policy="deadline"``).

The deadline policy may leave on-demand for spot at any time (``policy.deadline.ours``), but the
operator cannot see spot capacity: it only learns it by launching. So while an on-demand attempt
runs, its wait stops every ``probe_interval`` (``recovery.next_probe_at``), the policy is asked as if
spot were there (``recovery.probe_step``, pure), and when it would leave, the launch itself is the
probe:

1. the switch is written ahead into the history (``RunHistory.switch``), then a spot instance is
   launched *beside* the running one (``RunAttempt.launch_beside``: through the same resource ledger,
   nothing adopted). No capacity in any allowed zone: a failed probe in the history (it tells the
   policy spot was unavailable then), nothing paid, the on-demand attempt goes on untouched;
2. once the spot instance's agent has reported (it booted while on-demand kept working), the
   on-demand attempt is stopped as the budget stop does (SIGTERM: the job checkpoints, the agent
   uploads it), its final status awaited, and its ledger row says ``left_for_spot``;
3. only then the handover marker is written (``contract.runs.handover_key``): the spot agent waited
   for it before restoring, so it resumes from the on-demand attempt's last checkpoint, not an
   older one.

Why this order: spot capacity is known only once a launch succeeded, and the running instance's last
checkpoint exists only once it has stopped; the marker is the one thing the new agent must not start
before. Stopping first (break-before-make) would pay a changeover for every probe that found nothing.

Crash safety: every create goes through the run's ledger; a worker killed anywhere in the switch
leaves ``switch`` in the history, and the next loop step (a retry's) releases that switch's spot launch,
which never started its job (it waits for the marker), before it goes on (``resolve_switch``): the
run never keeps two instances. Gangs keep the old behaviour (asked only between attempts): a second
whole gang beside the first would need its own network and barrier.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from airflow_cloudtrain.contract.runs import handover_key
from airflow_cloudtrain.core.cloud import ended
from airflow_cloudtrain.core.engine import poll_until
from airflow_cloudtrain.core.ledger import store_set
from airflow_cloudtrain.core.records import ERROR, LaunchRecord, Outcome
from airflow_cloudtrain.core.retry import call_with_retry
from airflow_cloudtrain.lifecycle.resume.history import LEFT_FOR_SPOT
from airflow_cloudtrain.lifecycle.resume.zones import no_capacity_zones
from airflow_cloudtrain.lifecycle.run.attempt import LAUNCH_KEY, RunKilled

if TYPE_CHECKING:
    from airflow_cloudtrain.core.ledger import Resource
    from airflow_cloudtrain.lifecycle.resume.loop import RecoveryLoop
    from airflow_cloudtrain.lifecycle.run.attempt import RunAttempt

BOOT_WAIT_S = 600.0  # the spot agent reports within this long (or ``startup_timeout``), or the switch is off
BOOT_POLL_S = 1.0


def switch_to_spot(
    loop: RecoveryLoop, od: RunAttempt, od_launch: LaunchRecord, cloud: str, reason: str
) -> tuple[RunAttempt, LaunchRecord] | None:
    """Launch spot on ``cloud`` beside the on-demand ``od_launch``, then stop it (module docstring).
    Returns the spot attempt and its launch, or None when the run stays on on-demand."""
    from airflow_cloudtrain.core.launcher import LaunchFailed

    history, log = loop.history, loop.log
    now = time.time()
    history.switch = {"from": od_launch.to_dict(), "at": now}
    loop.launch_attempt(cloud)  # numbered and saved (switch too) before the create call
    marker = handover_key(history.launch_seq)
    spot = loop.attempt(cloud, handover=marker)
    log.info("Launching spot beside on-demand %s: %s", od_launch.instance_id, reason)
    try:
        launch = spot.launch_beside()
    except LaunchFailed as err:
        zones = no_capacity_zones(err.tried, loop.ctx.backend.region)
        _stay(loop, od_launch, f"no spot capacity: {err}", zones)
        return None
    except Exception as err:  # not the run's end: the on-demand attempt goes on
        _stay(loop, od_launch, f"the spot launch failed: {type(err).__name__}: {err}")
        return None
    why_not = _await_boot(loop, od, od_launch, spot, launch)
    if why_not:
        _release_unstarted(spot, _entries(spot, launch))
        store_set(loop.ctx.store, LAUNCH_KEY, od_launch.to_dict())
        _stay(loop, od_launch, why_not)
        return None
    message = (
        f"left on-demand for spot {launch.instance_id} in {launch.zone}: {reason}; the job was stopped, "
        "its checkpoint synced, and the spot instance restores it"
    )
    loop.finish(od, od_launch, Outcome(ERROR, LEFT_FOR_SPOT, message=message))
    hand = json.dumps({"from": od_launch.instance_id, "to": launch.instance_id, "at": time.time()})
    call_with_retry(lambda: spot.folder.put_text(marker, hand))
    history.probes.append({"at": now, "ok": True, "zones": [launch.zone], "instance_id": launch.instance_id})
    history.switch = None
    loop.save()
    log.info("Switched to spot %s in %s; the job resumes there", launch.instance_id, launch.zone)
    return spot, launch


def _entries(spot: RunAttempt, launch: LaunchRecord) -> list[Resource]:
    return [e for e in spot.ledger.entries if e.kind == "instance" and e.id in launch.node_ids]


def _release_unstarted(attempt: RunAttempt, entries: list[Resource]) -> None:
    """Release a switch's spot launch, whose job never started (it waits for the handover), each
    instance marked delivered (``released``) first, as every teardown does: its agent writes a final
    status once the instance goes, and the next adoption (``RunAttempt`` looking for what earlier tries
    left) must not report that as the run's attempt ending and release the on-demand one with it."""
    for entry in entries:
        try:
            attempt.mark_released(entry.id or "")
        except Exception as err:  # the release below matters more
            attempt.log.warning("Could not mark %s released before releasing it: %s", entry.id, err)
    call_with_retry(lambda: attempt.ledger.release(attempt.ctx.backend, sweep=False, only=entries))


def _await_boot(
    loop: RecoveryLoop, od: RunAttempt, od_launch: LaunchRecord, spot: RunAttempt, launch: LaunchRecord
) -> str | None:
    """Until the spot agent's first status: None, or why the switch is off (the spot instance ended,
    never reported, or the on-demand job ended meanwhile: its end is the wait's to report).

    The one poll loop (``core.engine.poll_until``): transient errors are waited out within its budget.
    Any other error turns the switch off rather than ending the run: the caller releases the spot
    launch and the on-demand attempt goes on, whose own wait meets the error if it lasts. A kill
    raises ``RunKilled`` (the task's teardown releases both instances through the ledger)."""
    limit = loop.ctx.wait.startup_timeout or BOOT_WAIT_S
    until = time.monotonic() + limit
    cloud = loop.ctx.backend.cloud

    def step() -> str | None:  # "" once the spot agent reported, a reason to give up, or None: not yet
        if loop.killed:
            raise RunKilled("task killed during a switch to spot")
        od.lease.renew()
        if spot.status_of(launch.instance_id) is not None:
            return ""
        status = od.status_of(od_launch.instance_id)
        if status is not None and status.final:
            return "the on-demand job ended while spot booted"
        if ended(cloud.describe([launch.instance_id]).get(launch.instance_id)):
            return f"spot {launch.instance_id} ended before its agent reported"
        if time.monotonic() >= until:
            return f"spot {launch.instance_id}'s agent did not report within {limit:.0f} s"
        return None

    def transient(err: BaseException, delay: float) -> None:
        loop.log.warning(
            "Transient error while checking the switch to spot (%s); again in %.0f s", err, delay
        )

    try:
        return poll_until(step, BOOT_POLL_S, stopped=lambda: loop.killed, on_transient=transient) or None
    except RunKilled:
        raise
    except Exception as err:
        return f"could not check the switch to spot: {type(err).__name__}: {err}"


def _stay(loop: RecoveryLoop, od_launch: LaunchRecord, message: str, zones: list[str] | None = None) -> None:
    """A probe that found no spot: in the history (the policy sees spot unavailable now), and the
    run stays on ``od_launch``."""
    history = loop.history
    history.probes.append(
        {"at": time.time(), "ok": False, "zones": list(zones or []), "message": message[:300]}
    )
    history.switch = None
    loop.save()
    loop.log.info("Staying on on-demand %s: %s", od_launch.instance_id, message)


def resolve_switch(loop: RecoveryLoop) -> None:
    """A switch an earlier worker left half done (``RunHistory.switch``): release its spot launch (its
    job never started: it waits for the handover), keep the on-demand instance if it still runs, and
    let the loop go on as before the switch (its next wait adopts the on-demand instance)."""
    switch = loop.history.switch or {}
    od_launch = LaunchRecord.from_dict(switch["from"])
    attempt = loop.attempt(od_launch.cloud)
    backend = loop.ctx.backend
    call_with_retry(lambda: attempt.ledger.sweep(backend, ["instance"]))
    others = [e for e in attempt.ledger.entries if e.kind == "instance" and e.id != od_launch.instance_id]
    if others:
        loop.log.warning(
            "A switch to spot was cut short; releasing its spot launch %s",
            ", ".join(str(e.id) for e in others),
        )
        _release_unstarted(attempt, others)
    if any(e.kind == "instance" and e.id == od_launch.instance_id for e in attempt.ledger.entries):
        store_set(loop.ctx.store, LAUNCH_KEY, od_launch.to_dict())
    loop.history.probes.append(
        {"at": time.time(), "ok": False, "zones": [], "message": "switch cut short by a lost worker"}
    )
    loop.history.switch = None
    loop.save()

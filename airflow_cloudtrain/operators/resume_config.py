"""``CheckpointResumeOperator``'s own arguments, validated at DAG parse time (no cloud calls).

Every error names the field and the accepted forms; combinations that cannot mean anything (a
deadline with ``spot_first``, ``on_demand_after`` with ``deadline``) fail here, not at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS, PROVIDERS, provider
from airflow_cloudtrain.operators.checks import RUN_ID_RE, check_path, check_whole
from airflow_cloudtrain.operators.config import is_templated, parse_duration

MAX_RESTARTS = 1000  # more is a typo: each restart is a launch, and the history keeps every one
CHECKPOINT_RANKS = ("head", "all")  # whose checkpoint_dir a gang syncs (contract.runs.RunSpec)
# While an on-demand attempt runs, the deadline policy is asked this often whether to leave it for spot
# (a spot launch beside it is the probe: make-before-break). A probe that finds no capacity costs one API
# call; one that finds it costs a changeover (the default 300 s: boot, setup, restore), and the policy
# leaves on-demand only for a spot spell older than 1.5 changeovers anyway: so two changeovers between
# looks lose little of a spell (docs/spot_policy.md: 5, 10 and 30 min cost the same within 2 points).
DEFAULT_PROBE_INTERVAL_S = 600.0
MIN_PROBE_INTERVAL_S = 1.0
MAX_STOP_GRACE_S = 115.0  # AWS gives two minutes of notice, GCE about 30 s; the sync needs some


@dataclass(frozen=True)
class ResumeArgs:
    checkpoint_dir: str | None
    checkpoint_interval_s: float
    max_restarts: int
    max_restarts_on_errors: int
    resume_from: str | None
    policy: str
    on_demand_after: int | None
    deadline: timedelta | datetime | None
    expected_duration_s: float | None
    stop_grace_s: float | None
    idle_timeout_s: float | None
    probe_interval_s: float | None = None  # ``deadline`` only: the policy's look while on-demand runs

    def deadline_at(self, started_at: float) -> float | None:
        """The deadline as unix time, for a loop that started at ``started_at``."""
        if isinstance(self.deadline, timedelta):
            return started_at + self.deadline.total_seconds()
        if isinstance(self.deadline, datetime):
            when = self.deadline if self.deadline.tzinfo else self.deadline.replace(tzinfo=timezone.utc)
            return when.timestamp()
        return None


def _deadline(value: Any) -> timedelta | datetime:
    if isinstance(value, datetime):
        return value
    try:
        seconds = parse_duration(value, "deadline")
    except ValueError:
        seconds = None
    if seconds is None:
        raise ValueError(
            f"deadline={value!r} is not valid: use a timedelta from the first start (or '6h', "
            "seconds), or a datetime to finish by"
        )
    return timedelta(seconds=seconds)


def parse_checkpoint_ranks(value: Any) -> str:
    """``"head"`` (rank 0 syncs, every rank restores the head's) or ``"all"`` (each rank its own);
    with one node both mean the same."""
    if isinstance(value, str) and value in CHECKPOINT_RANKS:
        return value
    raise ValueError(
        f"checkpoint_ranks={value!r} is not valid: use 'head' (rank 0 syncs its checkpoint_dir and every "
        "rank restores the head's checkpoint, the default) or 'all' (every rank syncs and restores its own)"
    )


def parse_zones(
    value: Any, cloud: Any, region: Any = None, zone: Any = None, subnet_id: Any = None
) -> tuple[str, ...]:
    """``zones``: the zones of one region every launch may use, in the order of preference (a spot
    relaunch ranks them by the trouble the run saw: ``lifecycle.resume.zones``). None: the offers'
    own zones, as before. Moving across regions is not supported (the instance image, network and
    prices are per region): every zone must be of one region, ``region``'s when given."""
    from airflow_cloudtrain.operators.checks import parse_zone, zone_region

    if value is None:
        return ()
    forms = "a list of zone names of one region, e.g. zones=['us-east-1a', 'us-east-1b'] (EC2) or " + (
        "['us-central1-a', 'us-central1-b'] (GCE)"
    )
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"zones={value!r} is not valid: use {forms}")
    known = cloud if isinstance(cloud, str) and cloud in CLOUDS else None
    zones: list[str] = []
    for item in value:
        if item is None or item == "":
            raise ValueError(f"zones={value!r} has an empty zone: use {forms}")
        try:
            zones.append(str(parse_zone(item, known)))
        except ValueError as err:
            raise ValueError(f"zones={value!r}: {err}".replace("zone=", "zone ")) from None
    if len(set(zones)) != len(zones):
        raise ValueError(f"zones={value!r} names a zone twice: use {forms}, each zone once")
    clouds = [known] if known else [c for c in ("ec2", "gcloud") if zone_region(c, zones[0])]
    regions = {zone_region(clouds[0], z) for z in zones} if clouds else set()
    if len(regions) > 1:
        raise ValueError(
            f"zones={value!r} spans regions {', '.join(sorted(map(str, regions)))}: moving a run across "
            "regions is not supported; use zones of one region"
        )
    where = next(iter(regions), None)
    if isinstance(region, str) and region and where and region != where:
        raise ValueError(
            f"zones={value!r} are in {where}, not in region={region!r}: use zones of {region} or leave region out"
        )
    if zone not in (None, ""):
        raise ValueError(
            f"zones={value!r} and zone={zone!r} both given: use zone= for one zone or zones= for several, "
            "not both"
        )
    if subnet_id not in (None, ""):
        raise ValueError(
            f"zones={value!r} cannot be used with subnet_id={subnet_id!r}: an EC2 subnet is in one zone; "
            "leave subnet_id out to let the run move between zones, or use zone= for the subnet's zone"
        )
    return tuple(zones)


def zones_region(zones: tuple[str, ...], cloud: str) -> str | None:
    """The region of ``zones`` (parsed: all of one region), or None without zones."""
    from airflow_cloudtrain.operators.checks import zone_region

    return zone_region(cloud, zones[0]) if zones else None


def parse_resume_from(value: Any, cloud: str | None) -> str | None:
    """A run id (``ct-`` and 12 hex digits, as in the XCom) or a run URI of the same cloud (of
    either cloud while ``cloud`` is still a template: checked again once it is rendered)."""
    if value in (None, ""):
        return None
    if is_templated(value):
        return value
    known = cloud in CLOUDS
    either = [p.scheme for p in PROVIDERS.values()]
    scheme = provider(cloud).scheme if cloud is not None and known else f"({'|'.join(either)})"
    if isinstance(value, str) and (
        RUN_ID_RE.fullmatch(value) or re.fullmatch(rf"{scheme}://[^/]+/.+", value) is not None
    ):
        return value
    uri = (
        f"{scheme}://bucket/.../runs/..."
        if known
        else " or ".join(f"{x}://" for x in either) + "bucket/.../runs/..."
    )
    raise ValueError(
        f"resume_from={value!r} is not valid: use an earlier run's id (its XCom 'run_id', e.g. "
        f"'ct-0123456789ab') or its run URI ({uri})"
    )


def parse_resume_args(
    cloud: Any,
    checkpoint_dir: Any,
    checkpoint_interval: Any,
    max_restarts: Any,
    max_restarts_on_errors: Any,
    resume_from: Any,
    policy: Any,
    on_demand_after: Any,
    deadline: Any,
    expected_duration: Any,
    stop_grace: Any,
    idle_timeout: Any,
    probe_interval: Any = None,
) -> ResumeArgs:
    """Parse and cross-check; raises ValueError naming the first bad field."""
    from airflow_cloudtrain.lifecycle.resume.recovery import DEADLINE, POLICIES, SPOT_FIRST

    check_path(checkpoint_dir, "checkpoint_dir", "/tmp/checkpoints")
    interval = parse_duration(checkpoint_interval, "checkpoint_interval")
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not valid: use one of {', '.join(map(repr, POLICIES))}")
    if on_demand_after is not None:
        if policy == DEADLINE:
            raise ValueError(
                f"on_demand_after={on_demand_after!r} applies to policy='spot_first' only; with "
                "policy='deadline' the deadline policy decides when to run on-demand: leave it out"
            )
        on_demand_after = check_whole(on_demand_after, "on_demand_after", 1, MAX_RESTARTS)
    when = expected_s = probe_s = None
    if policy == SPOT_FIRST:
        named = (
            ("deadline", deadline),
            ("expected_duration", expected_duration),
            ("probe_interval", probe_interval),
        )
        for name, value in named:
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} applies to policy='deadline' only; set policy='deadline' too, or leave "
                    f"{name} out"
                )
    else:
        if deadline is None or expected_duration is None:
            missing = "deadline" if deadline is None else "expected_duration"
            raise ValueError(
                f"{missing} is required with policy='deadline': the policy needs when to finish "
                "(deadline) and roughly how much pure compute the job needs (expected_duration); give "
                "both, e.g. deadline='2d', expected_duration='10h'"
            )
        when = _deadline(deadline)
        probe_s = parse_duration(probe_interval, "probe_interval") or DEFAULT_PROBE_INTERVAL_S
        if probe_s < MIN_PROBE_INTERVAL_S:
            raise ValueError(
                f"probe_interval={probe_interval!r} is too short: every probe may launch a spot instance; "
                f"use at least {MIN_PROBE_INTERVAL_S:g} s (default {DEFAULT_PROBE_INTERVAL_S:g} s)"
            )
        expected_s = parse_duration(expected_duration, "expected_duration")
        if isinstance(when, timedelta) and expected_s and expected_s >= when.total_seconds():
            raise ValueError(
                f"expected_duration={expected_duration!r} does not fit in deadline={deadline!r}: "
                "the job could not finish in time even on on-demand capacity; give a later deadline or "
                "a shorter expected_duration"
            )
    grace = parse_duration(stop_grace, "stop_grace")
    if grace is not None and grace > MAX_STOP_GRACE_S:
        raise ValueError(
            f"stop_grace={stop_grace!r} is longer than an interruption notice leaves: AWS gives "
            f"120 s and GCE about 30 s, so use at most {MAX_STOP_GRACE_S:.0f} s, e.g. '30s'"
        )
    return ResumeArgs(
        checkpoint_dir=checkpoint_dir,
        checkpoint_interval_s=float(interval or 300.0),
        max_restarts=check_whole(max_restarts, "max_restarts", 0, MAX_RESTARTS),
        max_restarts_on_errors=check_whole(max_restarts_on_errors, "max_restarts_on_errors", 0, MAX_RESTARTS),
        resume_from=parse_resume_from(resume_from, cloud if isinstance(cloud, str) else None),
        policy=policy,
        on_demand_after=on_demand_after,
        deadline=when,
        expected_duration_s=expected_s,
        stop_grace_s=grace,
        idle_timeout_s=parse_duration(idle_timeout, "idle_timeout"),
        probe_interval_s=probe_s,
    )

"""EC2 Auto Scaling groups as AWS plays them, on top of moto's in-process autoscaling backend.

moto (5.2) creates groups, launches their members from the launch template (so a member whose user
data is our bootstrap runs an agent like any instance) and scales them in, sparing members protected
from scale-in. What a spot fleet lives on and moto lacks is filled in here; ``reconcile`` runs on the
emulator's instance poll (0.3 s), before the instances' side looks for agents to start, and
``request`` wraps moto's handling of every request that may change a group (server middleware):

- The spot market. moto launches every member on demand (``lifecycle`` None), whatever the
  ``MixedInstancesPolicy``. Each new member is placed at once (before the request that launched it is
  answered, or within the poll that launched it): beyond ``OnDemandBaseCapacity``, on-demand members
  make up ``OnDemandPercentageAboveBaseCapacity`` percent (AWS's default 100), the rest are spot
  (``lifecycle = "spot"``). A spot member reads as spot everywhere (``InstanceLifecycle``,
  ``Emulator.running_instances``), and ``Emulator.interrupt`` reclaims it as a spot instance.
- Replacement. A member terminated from outside (a spot reclaim, its own power-off) stays InService in
  moto's ``instance_states`` and is never replaced. AWS's health checks drop it and launch another:
  the poll drops dead members and, while fewer than ``DesiredCapacity`` are InService, moto's own
  ``set_desired_capacity`` launches the missing ones, with every member shielded from scale-in for
  that call (moto's rounding of a mixed policy can target fewer than are InService: it must not
  terminate one instead). A member that leaves through ``TerminateInstanceInAutoScalingGroup`` with a
  decrement is out of the group already and lowered the desired count: nothing replaces it.
- Deletion. moto deletes a group (``ForceDelete`` or not) by scaling it to 0, which leaves members
  protected from scale-in running; AWS terminates every member. The poll terminates any live instance
  that still carries ``aws:autoscaling:groupName`` (moto removes the tag when a member is detached or
  leaves) while that group is gone. This is done on the poll rather than around the
  DeleteAutoScalingGroup request because moto deletes a group without ``ForceDelete`` too (AWS refuses
  while it has members), so a request wrapper keyed on ``ForceDelete=true`` would still leak, and the
  poll sees every way a group goes; members go within a poll, as on AWS they shut down after the call.
- UpdateAutoScalingGroup without a launch setting (``MixedInstancesPolicy``, ``LaunchTemplate``,
  ``LaunchConfigurationName``) drops the group's ``MixedInstancesPolicy`` in moto; AWS keeps it, and
  so does ``request``.

moto has no locking: every Auto Scaling request and EC2 TerminateInstances (whose handler replaces
members) runs under ``LOCK``, and so does the reconcile. moto's backends are process-wide, and so are
this lock and the placement mark on each member.

Not played: members are of the launch template's own ``InstanceType`` (moto ignores the policy's
``Overrides``, so give the template a type), ``SpotMaxPrice`` never keeps a member from launching,
capacity faults (``Emulator.fail_capacity``) do not reach group launches, and capacity rebalancing has
no recommendation to act on (``Emulator.interrupt`` sends the interruption notice itself).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from airflow_cloudtrain.emulator.aws.backend import autoscaling_backend, ec2_backend

GROUP_TAG = "aws:autoscaling:groupName"
DEAD = ("shutting-down", "terminated")
LOCK = threading.RLock()  # moto's backends are process-wide, so is this
PLACED = "_cloudtrain_placed"  # set on a moto member once its market (spot or on-demand) is decided


def reconcile(regions: Sequence[str]) -> None:
    """The emulator's poll: every group in ``regions`` played as AWS plays it (module doc)."""
    with LOCK:
        for region in regions:
            backend = autoscaling_backend(region)
            for group in list(backend.autoscaling_groups.values()):
                _replace_dead(group)
                _place(group)
            _end_orphans(region, backend)


@contextlib.contextmanager
def request(region: str | None, operation: str, form: dict[str, list[str]]) -> Iterator[None]:
    """Around moto's handling of a request that may change groups (the server's middleware): one at
    a time with the reconcile; members it launched are placed before the answer goes out;
    UpdateAutoScalingGroup keeps the MixedInstancesPolicy unless it sets a launch setting."""
    with LOCK:
        groups: dict[str, Any] = {}
        if region is not None:
            with contextlib.suppress(KeyError):  # a region moto does not know: moto answers that
                groups = autoscaling_backend(region).autoscaling_groups
        name = (form.get("AutoScalingGroupName") or [""])[0]
        launch = ("MixedInstancesPolicy", "LaunchTemplate", "LaunchConfigurationName")
        group = groups.get(name) if operation == "UpdateAutoScalingGroup" else None
        policy = (
            None if group is None or any(k.startswith(launch) for k in form) else group.mixed_instances_policy
        )
        try:
            yield
        finally:
            if policy and group is not None and not group.mixed_instances_policy:
                group.mixed_instances_policy = policy
            for each in list(groups.values()):
                _place(each)


def member_group(tags: list[dict[str, str]] | None) -> str | None:
    """The group an instance belongs to, from its EC2 tags (``DescribeInstances`` ``Tags``)."""
    return next((t["Value"] for t in tags or () if t.get("Key") == GROUP_TAG), None)


def _place(group: Any) -> None:
    """Mark new members spot where the group's InstancesDistribution puts them there."""
    members = [s.instance for s in group.instance_states]
    placed = [i for i in members if getattr(i, PLACED, False)]
    if len(placed) == len(members):
        return
    dist = (group.mixed_instances_policy or {}).get("InstancesDistribution") or {}
    base = int(dist.get("OnDemandBaseCapacity") or 0)
    percent = int(dist.get("OnDemandPercentageAboveBaseCapacity", 100))
    spot = sum(1 for i in placed if i.lifecycle == "spot")
    on_demand = len(placed) - spot
    for inst in members:
        if getattr(inst, PLACED, False):
            continue
        setattr(inst, PLACED, True)
        above = on_demand - base  # on-demand members beyond the base
        if not group.mixed_instances_policy or above < 0 or above * 100 < percent * (above + spot + 1):
            on_demand += 1
        else:
            inst.lifecycle = "spot"
            spot += 1


def _replace_dead(group: Any) -> None:
    """Drop members that are gone, then launch replacements up to DesiredCapacity."""
    group.instance_states = [s for s in group.instance_states if s.instance.state not in DEAD]
    if len(group.active_instances()) >= (group.desired_capacity or 0):
        return
    shielded = [(s, s.protected_from_scale_in) for s in group.instance_states]
    for state, _ in shielded:
        state.protected_from_scale_in = True  # launch the missing, never terminate one
    try:
        group.set_desired_capacity(group.desired_capacity)
    finally:
        for state, protected in shielded:
            state.protected_from_scale_in = protected


def _end_orphans(region: str, backend: Any) -> None:
    """Terminate live instances still tagged as members of a group that is gone."""
    ec2 = ec2_backend(region)
    orphans = []
    for reservation in ec2.all_reservations():
        for inst in list(reservation.instances):
            group = getattr(inst, "autoscaling_group", None)  # moto's back-reference on members
            if group is None or inst.state in DEAD:
                continue
            name = ec2.tags.get(inst.id, {}).get(GROUP_TAG)
            if name is None:  # detached, or left through TerminateInstanceInAutoScalingGroup
                continue
            now = backend.autoscaling_groups.get(name)  # gone, or a new group of that name:
            if now is None or (now is not group and all(s.instance is not inst for s in now.instances)):
                orphans.append(inst.id)
    if orphans:
        ec2.terminate_instances(orphans)

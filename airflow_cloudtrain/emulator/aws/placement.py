"""EC2 placement groups, which moto lacks: CreatePlacementGroup, DescribePlacementGroups and
DeletePlacementGroup, answered in the middleware (``server``) as EC2 answers them.

What EC2 checks and our code must cope with: a name (1-255 ASCII characters) unique in the account and
region (``InvalidPlacementGroup.Duplicate``); a strategy of ``cluster``, ``spread`` or ``partition``
(``InvalidParameterValue``); ``PartitionCount`` only with ``partition``; tags from ``TagSpecification``
of ResourceType ``placement-group``; a name or id that does not exist is
``InvalidPlacementGroup.Unknown`` (describe by name or id, delete); describe filters ``group-name``,
``group-id``, ``strategy``, ``state``, ``tag:<key>`` and ``tag-key``. RunInstances naming a group that
does not exist (``Placement.GroupName``) is refused the same way, before moto sees it; the instances
of one that does are the group's (``put_in_group``; DescribeInstances shows ``Placement.GroupName``),
and a group with an instance not yet terminated cannot be deleted (``InvalidPlacementGroup.InUse``).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from airflow_cloudtrain.emulator.aws import wire
from airflow_cloudtrain.emulator.aws.backend import ACCOUNT_ID, ec2_backend

OPERATIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")
STRATEGIES = ("cluster", "spread", "partition")


@dataclass
class Group:
    name: str
    id: str
    strategy: str
    region: str
    tags: dict[str, str] = field(default_factory=dict)
    partitions: int | None = None


class PlacementGroups:
    """Every region's placement groups (the emulator's account)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], Group] = {}  # (region, name) -> group

    def answer(self, operation: str, region: str, form: dict[str, list[str]]) -> wire.Reply:
        with self._lock:
            try:
                if operation == "CreatePlacementGroup":
                    return self._create(region, form)
                if operation == "DescribePlacementGroups":
                    return self._describe(region, form)
                return self._delete(region, form)
            except _Error as err:
                return wire.ec2_error(err.code, err.message)

    def check_launch(self, region: str, form: dict[str, list[str]]) -> wire.Reply | None:
        """RunInstances' ``Placement.GroupName``: refused when there is no such group."""
        name = _one(form, "Placement.GroupName")
        with self._lock:
            if name and (region, name) not in self._groups:
                return wire.ec2_error(
                    "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
                )
        return None

    # -- the calls -----------------------------------------------------------------------------------
    def _create(self, region: str, form: dict[str, list[str]]) -> wire.Reply:
        name = _one(form, "GroupName") or ""
        if not 1 <= len(name) <= 255 or not name.isascii():
            raise _Error(
                "InvalidParameterValue", f"Invalid value '{name}' for GroupName: 1-255 ASCII characters"
            )
        strategy = _one(form, "Strategy") or ""
        if strategy not in STRATEGIES:
            raise _Error(
                "InvalidParameterValue",
                f"Value ({strategy}) for parameter strategy is invalid. Valid values: {', '.join(STRATEGIES)}",
            )
        count = _one(form, "PartitionCount")
        if count is not None and strategy != "partition":
            raise _Error(
                "InvalidParameterCombination", "PartitionCount is only valid with the partition strategy"
            )
        if (region, name) in self._groups:
            raise _Error("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        tags = _tags(form)
        group = Group(
            name, f"pg-{secrets.token_hex(9)[:17]}", strategy, region, tags, int(count) if count else None
        )
        self._groups[(region, name)] = group
        body = f"<placementGroup>{_item_xml(group)}</placementGroup>"
        return wire.ec2_ok("CreatePlacementGroupResponse", body)

    def _describe(self, region: str, form: dict[str, list[str]]) -> wire.Reply:
        mine = [g for (r, _), g in sorted(self._groups.items()) if r == region]
        names, ids = wire.query_list(form, "GroupName"), wire.query_list(form, "GroupId")
        for name in names:
            if not any(g.name == name for g in mine):
                raise _Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        for gid in ids:
            if not any(g.id == gid for g in mine):
                raise _Error(
                    "InvalidPlacementGroupId.NotFound", f"The Placement Group ID '{gid}' does not exist."
                )
        found = [g for g in mine if (not names or g.name in names) and (not ids or g.id in ids)]
        for fname, values in _filters(form):
            found = [g for g in found if _matches(g, fname, values)]
        items = "".join(f"<item>{_item_xml(g)}</item>" for g in found)
        return wire.ec2_ok(
            "DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>"
        )

    def _delete(self, region: str, form: dict[str, list[str]]) -> wire.Reply:
        name = _one(form, "GroupName") or ""
        if (region, name) not in self._groups:
            raise _Error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        if _members(region, name):
            raise _Error(
                "InvalidPlacementGroup.InUse",
                f"The placement group '{name}' is in use and may not be deleted.",
            )
        del self._groups[(region, name)]
        return wire.ec2_ok("DeletePlacementGroupResponse", "<return>true</return>")

    def names(self, region: str) -> list[str]:
        """The region's group names (tests)."""
        with self._lock:
            return sorted(n for (r, n) in self._groups if r == region)


def put_in_group(region: str, name: str, instance_ids: list[str]) -> None:
    """Instances just launched into the group (moto's placement keeps the name; it has no groups)."""
    backend = ec2_backend(region)
    for iid in instance_ids:
        backend.get_instance(iid).placement.group_name = name


def _members(region: str, name: str) -> list[str]:
    """The group's instances that are not terminated yet."""
    return [
        inst.id
        for reservation in ec2_backend(region).all_reservations()
        for inst in list(reservation.instances)
        if inst.placement.group_name == name and inst.state != "terminated"
    ]


class _Error(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _one(form: dict[str, list[str]], key: str) -> str | None:
    values = form.get(key)
    return values[0] if values else None


def _tags(form: dict[str, list[str]]) -> dict[str, str]:
    tags: dict[str, str] = {}
    s = 1
    while (kind := _one(form, f"TagSpecification.{s}.ResourceType")) is not None:
        if kind != "placement-group":
            raise _Error(
                "InvalidParameterValue", f"'{kind}' is not a valid taggable resource type for this operation."
            )
        t = 1
        while (key := _one(form, f"TagSpecification.{s}.Tag.{t}.Key")) is not None:
            tags[key] = _one(form, f"TagSpecification.{s}.Tag.{t}.Value") or ""
            t += 1
        s += 1
    return tags


def _filters(form: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    out = []
    f = 1
    while (name := _one(form, f"Filter.{f}.Name")) is not None:
        out.append((name, wire.query_list(form, f"Filter.{f}.Value")))
        f += 1
    return out


def _matches(group: Group, name: str, values: list[str]) -> bool:
    if name.startswith("tag:"):
        return group.tags.get(name[4:]) in values
    if name == "tag-key":
        return any(k in values for k in group.tags)
    field_of = {
        "group-name": group.name,
        "group-id": group.id,
        "strategy": group.strategy,
        "state": "available",
    }
    if name not in field_of:
        raise _Error("InvalidParameterValue", f"The filter '{name}' is invalid")
    return field_of[name] in values


def _item_xml(group: Group) -> str:
    tags = "".join(
        f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>"
        for k, v in sorted(group.tags.items())
    )
    partitions = f"<partitionCount>{group.partitions}</partitionCount>" if group.partitions else ""
    arn = f"arn:aws:ec2:{group.region}:{ACCOUNT_ID}:placement-group/{group.name}"
    return (
        f"<groupName>{escape(group.name)}</groupName><groupId>{group.id}</groupId><state>available</state>"
        f"<strategy>{group.strategy}</strategy>{partitions}<groupArn>{escape(arn)}</groupArn>"
        f"<tagSet>{tags}</tagSet>"
    )

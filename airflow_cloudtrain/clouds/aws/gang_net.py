"""A gang's network on EC2: its nodes reach each other on every port, and nothing else reaches them.

Every node of a gang (``contract.gang``) gets the run's security group, made in the run's VPC (the
subnet's, else the region's default VPC) with one ingress rule: all traffic from members of the same
group (a self-referencing rule), plus the same from the user's own groups when given; no address
range at all, so not 0.0.0.0/0. EC2's default egress rule (all traffic out) stays: the agent needs
the way out. With ``placement="cluster"`` the run also gets a cluster placement group, which puts the
nodes close together in one zone (``catalog.rules.check_placement`` says which types can use one).

Both are resources of the run like any other: named from the run key (``ct-<digest>-gang``), tagged
with it at creation (``TagSpecifications``: a create killed halfway leaves a tagged resource the
sweep finds), made through ``ResourceLedger.ensure`` (found by name first, so a retried task
re-attaches; the intent written before the call), and deleted at teardown after the run's instances
(``RELEASE_LAST``): the deleter terminates any instance of the run still there and waits for them to
end, since EC2 refuses to delete a group in use (``DependencyViolation``, ``InvalidPlacementGroup.InUse``)
until their interfaces are gone, and retries that refusal for a while. The ledger kinds are
``security_group`` and ``placement_group``; a backend whose runs may be gangs lists them in
``GANG_KINDS`` for the tag sweep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.contract.errors import InvalidRequest
from airflow_cloudtrain.contract.runs import TAG_MANAGED, TAG_RUN_KEY
from airflow_cloudtrain.core.inventory import Tagged, register_lister
from airflow_cloudtrain.core.ledger import RELEASE_LAST, Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.core.cloud import Cloud
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.hooks.aws import CloudTrainAwsHook

log = logging.getLogger(__name__)

SG_KIND = "security_group"
PG_KIND = "placement_group"
GANG_KINDS = (SG_KIND, PG_KIND)
IN_USE_WAIT_S = 300.0  # EC2 detaches a terminated instance's interfaces within minutes
_IN_USE = ("DependencyViolation", "InvalidPlacementGroup.InUse")


class GangNetBackend(Protocol):
    """What these calls need of ``AwsRunBackend`` (the ledger hands its kinds the backend)."""

    hook: CloudTrainAwsHook

    @property
    def region(self) -> str | None: ...

    @property
    def cloud(self) -> Cloud: ...

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None: ...


@dataclass(frozen=True)
class GangNetwork:
    """What a gang's launch adds to each node: the run's group, and the placement group if any."""

    security_group_id: str
    placement_group: str | None = None


def resource_name(digest: str) -> str:
    return f"ct-{digest}-gang"


def _tags(digest: str, resource_type: str) -> list[dict[str, Any]]:
    tags = {TAG_RUN_KEY: digest, TAG_MANAGED: "true", "Name": resource_name(digest)}
    return [{"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


def _code(err: Exception) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))


def _ec2(backend: GangNetBackend, region: str | None = None) -> Any:
    return backend.hook.client("ec2", region=region or backend.region)


def vpc_of(ec2: Any, subnet_id: str | None) -> str:
    """The VPC the nodes launch in: the subnet's, else the region's default VPC."""
    if subnet_id:
        subnets = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"]
        return str(subnets[0]["VpcId"])
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise InvalidRequest(
            "this region has no default VPC: give subnet_id, so the gang's security group is made in its VPC",
            "MissingDefaultVpc",
        )
    return str(vpcs[0]["VpcId"])


def ensure_gang_network(
    backend: GangNetBackend,
    ledger: ResourceLedger,
    digest: str,
    *,
    subnet_id: str | None = None,
    peer_groups: list[str] | None = None,
    placement: str | None = None,
    check: Callable[[], None] = lambda: None,
    logger: logging.Logger | None = None,
) -> GangNetwork:
    """Make (or find) the run's security group and, with ``placement="cluster"``, its placement group,
    each through the ledger. ``peer_groups``: the user's ``security_group_ids``, also let in.
    ``check`` raises when the task was killed meanwhile (nothing is created after a kill)."""
    from airflow_cloudtrain.core.retry import call_with_retry

    logger = logger or log
    ec2 = _ec2(backend)
    region = backend.region
    name = resource_name(digest)
    vpc = call_with_retry(lambda: vpc_of(ec2, subnet_id))

    def find_group() -> str | None:
        filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
        groups = ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
        return str(groups[0]["GroupId"]) if groups else None

    def create_group() -> str:
        try:
            made = ec2.create_security_group(
                GroupName=name,
                Description=f"cloudtrain run {digest}: the gang's nodes reach each other, nothing else",
                VpcId=vpc,
                TagSpecifications=_tags(digest, "security-group"),
            )
        except Exception as err:
            if _code(err) == "InvalidGroup.Duplicate":  # a retried call whose answer was lost
                return find_group() or ""
            raise
        return str(made["GroupId"])

    group_id, made = ledger.ensure(
        SG_KIND, region, name, find=find_group, create=create_group, before_create=check
    )
    if made:
        logger.info("Created security group %s (%s) in %s for the gang", group_id, name, vpc)
    call_with_retry(lambda: allow_members(ec2, group_id, peer_groups or []))
    placement_group = None
    if placement == "cluster":
        placement_group = _ensure_placement(ec2, ledger, region, name, digest, check, logger)
    return GangNetwork(group_id, placement_group)


def allow_members(ec2: Any, group_id: str, peer_groups: list[str]) -> None:
    """The group's one kind of ingress: every protocol from its own members (and the peer groups).
    Authorized every time: a group made by a try killed before this call has no rule yet."""
    for source in dict.fromkeys([group_id, *peer_groups]):
        try:
            ec2.authorize_security_group_ingress(
                GroupId=group_id,
                IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": source}]}],
            )
        except Exception as err:
            if _code(err) != "InvalidPermission.Duplicate":
                raise


def _ensure_placement(
    ec2: Any,
    ledger: ResourceLedger,
    region: str | None,
    name: str,
    digest: str,
    check: Callable[[], None],
    logger: logging.Logger,
) -> str:
    def find() -> str | None:
        try:
            ec2.describe_placement_groups(GroupNames=[name])
        except Exception as err:
            if _code(err) == "InvalidPlacementGroup.Unknown":
                return None
            raise
        return name

    def create() -> str:
        try:
            ec2.create_placement_group(
                GroupName=name, Strategy="cluster", TagSpecifications=_tags(digest, "placement-group")
            )
        except Exception as err:
            if _code(err) != "InvalidPlacementGroup.Duplicate":  # a retried call whose answer was lost
                raise
        return name

    group, made = ledger.ensure(
        PG_KIND, region, name, find=find, create=create, before_create=check, record=name
    )
    if made:
        logger.info("Created cluster placement group %s for the gang", name)
    return group


# --- the ledger kinds: found by the run key tag, deleted once the run's instances are gone ----------


def _find_groups(backend: GangNetBackend, digest: str) -> list[Resource]:
    filters = [{"Name": f"tag:{TAG_RUN_KEY}", "Values": [digest]}]
    groups = _ec2(backend).describe_security_groups(Filters=filters)["SecurityGroups"]
    return [Resource(SG_KIND, str(g["GroupId"]), backend.region) for g in groups]


def _find_placements(backend: GangNetBackend, digest: str) -> list[Resource]:
    filters = [{"Name": f"tag:{TAG_RUN_KEY}", "Values": [digest]}]
    groups = _ec2(backend).describe_placement_groups(Filters=filters)["PlacementGroups"]
    return [Resource(PG_KIND, str(g["GroupName"]), backend.region) for g in groups]


def _instances_gone(backend: GangNetBackend, digests: set[str]) -> None:
    """Terminate any instance of these runs still there and wait (bounded) until all have ended."""
    from airflow_cloudtrain.core.cloud import ALIVE_STATES, SHUTTING_DOWN, STOPPING

    deadline = time.monotonic() + IN_USE_WAIT_S
    asked: set[str] = set()
    for digest in sorted(digests):
        while True:
            left = [
                i
                for i in backend.cloud.find(digest, ended=True)
                if i.state in ALIVE_STATES | {STOPPING, SHUTTING_DOWN}
            ]
            fresh = [i for i in left if i.state in ALIVE_STATES and i.id not in asked]
            if fresh:
                backend.terminate_instances([(i.id, backend.region) for i in fresh])
                asked.update(i.id for i in fresh)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(1.0)


def _group_digests(backend: GangNetBackend, resources: list[Resource]) -> set[str]:
    """The run key digests of security groups (from their tag; a group already gone has none)."""
    out: set[str] = set()
    for resource in resources:
        try:
            groups = _ec2(backend, resource.location).describe_security_groups(GroupIds=[resource.id])
        except Exception as err:
            if _code(err) == "InvalidGroup.NotFound":
                continue
            raise
        for group in groups["SecurityGroups"]:
            out |= {t["Value"] for t in group.get("Tags", []) if t["Key"] == TAG_RUN_KEY}
    return out


def _digest_of(name: str) -> str | None:
    """The run key digest of a placement group name of ours (None for a group id or any other name)."""
    return name[3:-5] if name.startswith("ct-") and name.endswith("-gang") else None


def _delete_each(
    backend: GangNetBackend, resources: list[Resource], delete: Callable[[Any, str], None]
) -> None:
    for resource in resources:
        ec2 = _ec2(backend, resource.location)
        deadline = time.monotonic() + IN_USE_WAIT_S
        while True:
            try:
                delete(ec2, resource.id or "")
                break
            except Exception as err:
                code = _code(err)
                if code in ("InvalidGroup.NotFound", "InvalidPlacementGroup.Unknown"):
                    break  # gone already
                if code not in _IN_USE or time.monotonic() > deadline:
                    raise
                time.sleep(2.0)  # a terminated instance's interface is still attached


def _delete_groups(backend: GangNetBackend, resources: list[Resource]) -> None:
    _wait_for_instances(backend, lambda: _group_digests(backend, resources))
    _delete_each(backend, resources, lambda ec2, gid: ec2.delete_security_group(GroupId=gid))


def _delete_placements(backend: GangNetBackend, resources: list[Resource]) -> None:
    _wait_for_instances(backend, lambda: {d for r in resources if (d := _digest_of(r.id or ""))})
    _delete_each(backend, resources, lambda ec2, name: ec2.delete_placement_group(GroupName=name))


def _wait_for_instances(backend: GangNetBackend, digests: Callable[[], set[str]]) -> None:
    try:
        _instances_gone(backend, digests())
    except Exception as err:  # the groups still go (or are retried while in use)
        log.warning("Could not check the run's instances before deleting its gang network: %s", err)


SECURITY_GROUP = register_kind(
    ResourceKind(SG_KIND, _find_groups, _delete_groups, release_order=RELEASE_LAST)
)
PLACEMENT_GROUP = register_kind(
    ResourceKind(PG_KIND, _find_placements, _delete_placements, release_order=RELEASE_LAST)
)


# --- cloudtrain gc: every gang network of ours in the region, whatever its run --------------------


def _run_tag(raw: dict[str, Any]) -> str | None:
    return next((t["Value"] for t in raw.get("Tags", []) if t.get("Key") == TAG_RUN_KEY), None)


def _list_groups(backend: GangNetBackend) -> list[Tagged]:
    """Security groups carrying the run key tag (EC2 keeps no creation time for a group)."""
    groups = _ec2(backend).describe_security_groups(Filters=[{"Name": "tag-key", "Values": [TAG_RUN_KEY]}])
    return [
        Tagged(SG_KIND, str(g["GroupId"]), backend.region, _run_tag(g), state=str(g.get("GroupName", "")))
        for g in groups["SecurityGroups"]
        if _run_tag(g)
    ]


def _list_placements(backend: GangNetBackend) -> list[Tagged]:
    groups = _ec2(backend).describe_placement_groups()["PlacementGroups"]
    return [
        Tagged(
            PG_KIND,
            str(g["GroupName"]),
            backend.region,
            _run_tag(g) or _digest_of(str(g["GroupName"])),
            state=f"{g.get('Strategy', '')} {g.get('State', '')}".strip(),
        )
        for g in groups
        if _run_tag(g) or _digest_of(str(g["GroupName"]))
    ]


register_lister("aws", SG_KIND, _list_groups)
register_lister("aws", PG_KIND, _list_placements)

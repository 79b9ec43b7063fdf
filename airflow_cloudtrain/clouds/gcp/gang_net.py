"""A gang's network on GCE: its nodes reach each other on every port, and nothing else reaches them.

Every VM of a run carries the run's network tag (``ct-<digest>``) and the run's deny rule keeps all
ingress out (``clouds.gcp.firewall``, priority 1000). A gang adds one rule on the VMs' network that
allows every protocol from that tag to that tag (``sourceTags`` = ``targetTags`` = the run's tag) at
priority 900, above the deny rule, which would otherwise block the nodes' traffic too (its source,
0.0.0.0/0, covers internal addresses). With ``placement="cluster"`` the run also gets a compact
placement policy in its region (``groupPlacementPolicy.collocation = COLLOCATED``) that its VMs name in
``resourcePolicies``: Compute Engine then puts them close together
(https://cloud.google.com/compute/docs/instances/define-instance-placement;
``catalog.rules.check_placement`` says which machine series can use one).

Both are resources of the run like any other. Neither kind has labels, so both are named from the
run key (``ct-<digest>-gang``) and found by that name (the rule in the network's project, the policy
in the run's region); made through ``ResourceLedger.ensure`` (found first: a retried task re-attaches;
the intent written before the call; a 409 is ours) and deleted at teardown after the run's VMs
(``RELEASE_LAST``: the deleter deletes any VM of the run still there and waits for them, as the deny
rule's does, since a policy that a VM names cannot be deleted). The ledger kinds are
``gang_firewall`` and ``placement_policy``; a backend whose runs may be gangs lists them in
``GANG_KINDS`` for the tag sweep.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.clouds.gcp import firewall as gcp_firewall
from airflow_cloudtrain.core.inventory import Tagged, register_lister, timestamp
from airflow_cloudtrain.core.ledger import RELEASE_LAST, Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.clouds.gcp.firewall import FirewallBackend
    from airflow_cloudtrain.core.ledger import ResourceLedger

log = logging.getLogger(__name__)

FW_KIND = "gang_firewall"
POLICY_KIND = "placement_policy"
GANG_KINDS = (FW_KIND, POLICY_KIND)
GANG_PRIORITY = 900  # above the run's deny rule (1000); lower numbers win


@dataclass(frozen=True)
class GangNetwork:
    """What a gang's launch adds to each VM: the run's tag is on it already; the policy, if any."""

    firewall_rule: str
    placement_policy: str | None = None  # the policy's URL path, for the VMs' ``resourcePolicies``


def resource_name(digest: str) -> str:
    return f"ct-{digest}-gang"


def rule_body(digest: str, network: str) -> dict[str, Any]:
    """The gang's allow rule as ``firewalls.insert`` takes it."""
    tag = gcp_firewall.network_tag(digest)
    return {
        "name": resource_name(digest),
        "description": f"cloudtrain run {digest}: the gang's nodes reach each other (deleted at teardown)",
        "network": network,
        "direction": "INGRESS",
        "priority": GANG_PRIORITY,
        "source_tags": [tag],
        "target_tags": [tag],
        "allowed": [{"I_p_protocol": "all"}],
    }


def _client(backend: FirewallBackend, name: str) -> Any:
    return backend.hook.compute_client(name)


def _policies_client(backend: FirewallBackend) -> Any:
    return _client(backend, "ResourcePoliciesClient")


def ensure_gang_network(
    backend: FirewallBackend,
    ledger: ResourceLedger,
    digest: str,
    region: str,
    *,
    network: str | None = None,
    subnetwork: str | None = None,
    placement: str | None = None,
    check: Callable[[], None] = lambda: None,
    logger: logging.Logger | None = None,
) -> GangNetwork:
    """Make (or find) the gang's allow rule and, with ``placement="cluster"``, its compact placement
    policy in ``region``, each through the ledger. ``check`` raises when the task was killed meanwhile."""
    from airflow_cloudtrain.core.retry import call_with_retry

    logger = logger or log
    rules = gcp_firewall.GcpFirewalls(backend.hook)
    project, net = call_with_retry(lambda: rules.network_of(network, subnetwork, region))
    if project != backend.hook.project:  # a teardown's sweep looks in the network's project too
        backend.firewall_projects = tuple(dict.fromkeys([*backend.firewall_projects, project]))
    name = resource_name(digest)
    body = rule_body(digest, net)

    def create_rule() -> str:
        rules.insert(project, body, str(uuid.uuid4()))  # 409: made by an earlier try
        return name

    _, made = ledger.ensure(
        FW_KIND,
        project,
        name,
        find=lambda: name if rules.get(project, name) else None,
        create=create_rule,
        before_create=check,
        record=name,
    )
    if made:
        logger.info("Created firewall rule %s (the gang's nodes, to each other) on %s", name, net)
    policy = None
    if placement == "cluster":
        policy = _ensure_policy(backend, ledger, digest, region, check, logger)
    return GangNetwork(name, policy)


def _ensure_policy(
    backend: FirewallBackend,
    ledger: ResourceLedger,
    digest: str,
    region: str,
    check: Callable[[], None],
    logger: logging.Logger,
) -> str:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    from airflow_cloudtrain.clouds.gcp.errors import map_api_error

    project, name = backend.hook.project, resource_name(digest)
    client = _policies_client(backend)

    def find() -> str | None:
        try:
            client.get(project=project, region=region, resource_policy=name)
        except gexc.NotFound:
            return None
        return name

    def create() -> str:
        policy = compute_v1.ResourcePolicy(
            name=name,
            description=f"cloudtrain run {digest}: the gang's VMs close together (deleted at teardown)",
            group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(collocation="COLLOCATED"),
        )
        request = compute_v1.InsertResourcePolicyRequest(
            project=project, region=region, resource_policy_resource=policy, request_id=str(uuid.uuid4())
        )
        try:
            op = client.insert(request=request)
        except gexc.Conflict:  # made by an earlier try (or this call's lost answer)
            return name
        except gexc.GoogleAPICallError as err:
            raise map_api_error(err) from err
        _done(backend, project, region, op)
        return name

    _, made = ledger.ensure(
        POLICY_KIND, region, name, find=find, create=create, before_create=check, record=name
    )
    if made:
        logger.info("Created compact placement policy %s in %s for the gang", name, region)
    return f"projects/{project}/regions/{region}/resourcePolicies/{name}"


def _done(backend: FirewallBackend, project: str, region: str, op: Any, timeout: float = 300) -> None:
    from airflow_cloudtrain.clouds.gcp.errors import map_code

    deadline = time.monotonic() + timeout
    ops = None
    while str(getattr(op.status, "name", op.status)) != "DONE" and time.monotonic() < deadline:
        ops = ops or _client(backend, "RegionOperationsClient")
        op = ops.wait(project=project, region=region, operation=op.name)
    code = getattr(op, "error_code", None)
    if code:
        raise map_code(str(code), str(getattr(op, "error_message", "") or code))


# --- the ledger kinds: found by name from the run key, deleted once the run's VMs are gone ----------


def _digest_of(name: str) -> str | None:
    return name[3:-5] if name.startswith("ct-") and name.endswith("-gang") else None


def _find_rules(backend: FirewallBackend, digest: str) -> list[Resource]:
    from google.cloud import compute_v1

    name, out = resource_name(digest), []
    projects = dict.fromkeys([backend.hook.project, *getattr(backend, "firewall_projects", ())])
    for project in projects:
        request = compute_v1.ListFirewallsRequest(project=project, filter=f'name eq "{name}"')
        out += [
            Resource(FW_KIND, str(r.name), project)
            for r in _client(backend, "FirewallsClient").list(request=request)
        ]
    return out


def _find_policies(backend: FirewallBackend, digest: str) -> list[Resource]:
    from google.cloud import compute_v1

    region = getattr(backend, "region", None)
    if not region:
        return []
    request = compute_v1.ListResourcePoliciesRequest(
        project=backend.hook.project, region=region, filter=f'name eq "{resource_name(digest)}"'
    )
    return [
        Resource(POLICY_KIND, str(p.name), region) for p in _policies_client(backend).list(request=request)
    ]


def _vms_gone(backend: FirewallBackend, resources: list[Resource]) -> None:
    for digest in dict.fromkeys(d for r in resources if (d := _digest_of(r.id or ""))):
        try:
            gcp_firewall._vms_gone(backend, digest)  # the deny rule's wait: the same VMs, the same bound
        except Exception as err:  # the resource still goes (a policy in use is retried below)
            log.warning("Could not check the VMs of run %s before deleting its gang network: %s", digest, err)


def _delete_rules(backend: FirewallBackend, resources: list[Resource]) -> None:
    _vms_gone(backend, resources)
    rules = gcp_firewall.GcpFirewalls(backend.hook)
    for resource in resources:
        rules.delete(resource.location or backend.hook.project, resource.id or "")


def _delete_policies(backend: FirewallBackend, resources: list[Resource]) -> None:
    from google.api_core import exceptions as gexc

    _vms_gone(backend, resources)
    client, project = _policies_client(backend), backend.hook.project
    for resource in resources:
        region = resource.location or ""
        deadline = time.monotonic() + gcp_firewall.VM_GONE_WAIT_S
        while True:
            try:
                op = client.delete(project=project, region=region, resource_policy=resource.id or "")
            except gexc.NotFound:
                break
            except gexc.BadRequest as err:  # resourceInUseByAnotherResource: a VM still shutting down
                if "resourceInUse" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(2.0)
                continue
            _done(backend, project, region, op)
            break


GANG_FIREWALL = register_kind(ResourceKind(FW_KIND, _find_rules, _delete_rules, release_order=RELEASE_LAST))
PLACEMENT_POLICY = register_kind(
    ResourceKind(POLICY_KIND, _find_policies, _delete_policies, release_order=RELEASE_LAST)
)


# --- cloudtrain gc: every gang's rule and policy, whatever its run -----------------------------------


def _list_rules(backend: FirewallBackend) -> list[Tagged]:
    project = backend.hook.project
    return [
        Tagged(
            FW_KIND, str(r.name), project, digest, created_at=timestamp(r.creation_timestamp), state="rule"
        )
        for r in _client(backend, "FirewallsClient").list(project=project)
        if (digest := _digest_of(str(r.name)))
    ]


def _list_policies(backend: FirewallBackend) -> list[Tagged]:
    region = getattr(backend, "region", None)
    if not region:
        return []
    return [
        Tagged(POLICY_KIND, str(p.name), region, digest, created_at=timestamp(p.creation_timestamp))
        for p in _policies_client(backend).list(project=backend.hook.project, region=region)
        if (digest := _digest_of(str(p.name)))
    ]


register_lister("gcp", FW_KIND, _list_rules)
register_lister("gcp", POLICY_KIND, _list_policies)

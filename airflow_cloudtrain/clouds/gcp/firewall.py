"""The run's VPC firewall rules on GCE: no ingress from anywhere to the run's VMs, SSH only when asked.

A GCE VM on a project's ``default`` network is reachable from the internet: that network carries
``default-allow-ssh`` (tcp:22 from 0.0.0.0/0), ``default-allow-rdp`` and ``default-allow-icmp`` at
priority 65534, and our VMs get an external IP (the agent's way out). EC2 instances of ours are never
reachable (no security group opened, no key pair), so GCE runs are made the same: every VM of a run
carries the run's network tag (``ct-<digest>``, ``clouds.gcp.instance_properties``) and, before the
first VM is launched, the run makes a rule on the VM's network that denies all ingress from
``0.0.0.0/0`` to that tag at priority 1000 (lower numbers win: it overrides the default allow rules;
egress, which no ingress rule touches, stays open). Our VMs are IPv4-only (no IPv6 access config), so
an IPv4 rule covers them; GCE allows IPv4 or IPv6 ranges in one rule, not both.

``ssh_source_ranges`` (``operators.network_config``) adds an allow rule for tcp:22 from those ranges at
priority 900, which beats the deny rule (the one IPv6 ranges get a rule of their own). GCE has no
"except" for source ranges, so a higher-priority allow is how an exception is written.

The rules are resources of the run like any other: written to the ledger before the create call
(write-ahead), named from the run key (``ct-<digest>-deny``, ``-ssh``, ``-ssh6``; firewall rules have no
labels, so the sweep finds them by that name, and the description carries the run key for a human),
created idempotently (found by name first; a ``requestId`` per create, resent by its retries; 409
alreadyExists is ours), and deleted at
teardown, after the run's VMs are gone: the kind is released after every other (``release_last``),
and its deleter deletes any VM of the run still there and waits (within ``VM_GONE_WAIT_S``) for them
to go, so no VM of a run outlives its deny rule, whatever a rebuilt ledger holds. The create waits for its operation: a rule is in force once DONE,
and only then does the VM start. A rule lives in its network's project (a Shared VPC host project for
a network path naming another project); the ledger entry's location is that project.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from airflow_cloudtrain.contract.errors import CloudError, InvalidRequest
from airflow_cloudtrain.core.inventory import Tagged, register_lister, timestamp
from airflow_cloudtrain.core.ledger import Resource, ResourceKind, register_kind

if TYPE_CHECKING:
    from airflow_cloudtrain.core.cloud import Cloud
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.hooks.gcp import CloudTrainGcpHook


class FirewallBackend(Protocol):
    """What these calls need of ``GcpRunBackend`` (the ledger hands its kinds the backend)."""

    hook: CloudTrainGcpHook
    firewall_projects: tuple[str, ...]

    @property
    def cloud(self) -> Cloud: ...

    def terminate_instances(self, instances: list[tuple[str, str | None]]) -> None: ...


log = logging.getLogger(__name__)

KIND = "firewall"
DENY_PRIORITY = 1000  # above the default network's allow rules (65534); lower numbers win
SSH_PRIORITY = 900  # above our deny rule
OUTSIDE = "0.0.0.0/0"
VM_GONE_WAIT_S = 60.0  # a deleted GCE VM shuts down (STOPPING) before it is gone; then the rule goes anyway
_SUFFIXES = ("deny", "ssh", "ssh6")


def network_tag(digest: str) -> str:
    """The network tag every VM of the run carries (a name: lowercase, starts with a letter)."""
    return f"ct-{digest}"


def rule_name(digest: str, suffix: str) -> str:
    return f"ct-{digest}-{suffix}"


def digest_of(name: str) -> str | None:
    """The run key digest of one of our rule names (None for any other name)."""
    head, _, suffix = name.rpartition("-")
    return head[3:] if head.startswith("ct-") and suffix in _SUFFIXES else None


def rule_bodies(digest: str, network: str, ssh_ranges: list[str] | None) -> list[dict[str, Any]]:
    """The deny rule, and the SSH allow rule(s) when ranges are given, as ``firewalls.insert`` takes them."""
    tag = network_tag(digest)
    common = {"network": network, "direction": "INGRESS", "target_tags": [tag]}
    bodies: list[dict[str, Any]] = [
        {
            **common,
            "name": rule_name(digest, "deny"),
            "description": f"cloudtrain run {digest}: no ingress to the run's VMs (deleted at teardown)",
            "priority": DENY_PRIORITY,
            "source_ranges": [OUTSIDE],
            "denied": [{"I_p_protocol": "all"}],
        }
    ]
    v4 = [r for r in ssh_ranges or [] if ":" not in r]
    v6 = [r for r in ssh_ranges or [] if ":" in r]
    for suffix, ranges in (("ssh", v4), ("ssh6", v6)):
        if ranges:
            bodies.append(
                {
                    **common,
                    "name": rule_name(digest, suffix),
                    "description": f"cloudtrain run {digest}: SSH from ssh_source_ranges (deleted at teardown)",
                    "priority": SSH_PRIORITY,
                    "source_ranges": list(ranges),
                    "allowed": [{"I_p_protocol": "tcp", "ports": ["22"]}],
                }
            )
    return bodies


def _network_project(path: str) -> str | None:
    parts = path.split("/")
    return parts[parts.index("projects") + 1] if "projects" in parts else None


class GcpFirewalls:
    """Firewall rules (global) of the projects one connection reaches."""

    def __init__(self, hook: CloudTrainGcpHook) -> None:
        self.hook = hook
        self._clients: dict[str, Any] = {}

    def _client(self, name: str) -> Any:
        if name not in self._clients:
            self._clients[name] = self.hook.compute_client(name)
        return self._clients[name]

    def network_of(self, network: str | None, subnetwork: str | None, region: str | None) -> tuple[str, str]:
        """(project of the rule, network path) of a VM launched with these arguments: ``network``, else
        the network of ``subnetwork`` (asked of the API), else the project's ``default`` network."""
        project = self.hook.project
        if network:
            return _network_project(network) or project, network
        if subnetwork:
            named = "/" not in subnetwork
            sub_project = project if named else _network_project(subnetwork) or project
            sub_region = region if named else subnetwork.split("/regions/", 1)[-1].split("/", 1)[0]
            name = subnetwork.rsplit("/", 1)[-1]
            from google.api_core import exceptions as gexc

            try:
                found = self._client("SubnetworksClient").get(
                    project=sub_project, region=sub_region, subnetwork=name
                )
            except gexc.NotFound as err:
                raise InvalidRequest(
                    f"subnetwork={subnetwork!r} was not found in project {sub_project!r}, region "
                    f"{sub_region!r}: the run's firewall rule needs its network ({err.message})",
                    "notFound",
                ) from err
            link = str(found.network)
            return _network_project(link) or sub_project, link
        return project, "global/networks/default"

    def get(self, project: str, name: str) -> Any | None:
        from google.api_core import exceptions as gexc

        try:
            return self._client("FirewallsClient").get(project=project, firewall=name)
        except gexc.NotFound:
            return None

    def names(self, project: str, digest: str) -> list[str]:
        """Our rules of this run in ``project``: one list call, by name."""
        from google.cloud import compute_v1

        request = compute_v1.ListFirewallsRequest(
            project=project, filter=f'name eq "ct-{digest}-({"|".join(_SUFFIXES)})"'
        )
        return [str(r.name) for r in self._client("FirewallsClient").list(request=request)]

    def insert(self, project: str, body: dict[str, Any], request_id: str) -> None:
        """Create the rule and wait until it is in force; an identical earlier create is ours.

        ``request_id``: one per create (its retries resend it). Not one per rule name: GCE replays
        the first operation of a requestId for an hour without doing anything, and a resume loop
        makes the same rule again after each attempt's teardown."""
        from google.api_core import exceptions as gexc
        from google.cloud import compute_v1

        from airflow_cloudtrain.clouds.gcp.errors import map_api_error

        try:
            request = compute_v1.InsertFirewallRequest(
                project=project, firewall_resource=compute_v1.Firewall(body), request_id=request_id
            )
            op = self._client("FirewallsClient").insert(request=request)
        except gexc.Conflict:  # made by an earlier try (or this call's lost answer)
            return
        except gexc.GoogleAPICallError as err:
            raise map_api_error(err) from err
        self._done(project, op)

    def delete(self, project: str, name: str) -> None:
        """Delete the rule and wait for it; "not found" is done."""
        from google.api_core import exceptions as gexc

        try:
            op = self._client("FirewallsClient").delete(project=project, firewall=name)
        except gexc.NotFound:
            return
        self._done(project, op)

    def _done(self, project: str, op: Any, timeout: float = 300) -> None:
        from airflow_cloudtrain.clouds.gcp.errors import map_code

        deadline = time.monotonic() + timeout
        while str(getattr(op.status, "name", op.status)) != "DONE" and time.monotonic() < deadline:
            op = self._client("GlobalOperationsClient").wait(project=project, operation=op.name)
        code = getattr(op, "error_code", None)
        if code:
            raise map_code(str(code), str(getattr(op, "error_message", "") or code))


def protect_run(
    backend: FirewallBackend,
    ledger: ResourceLedger,
    digest: str,
    options: Any,
    region: str | None,
    check: Callable[[], None],
    logger: logging.Logger | None = None,
) -> None:
    """Make (or find) the run's rules before its first VM, each written to the ledger first.

    ``options``: the run's ``LaunchOptions`` (``network``, ``subnetwork``, ``ssh_source_ranges``);
    ``check`` raises when the task was killed meanwhile (nothing is created after a kill)."""
    from airflow_cloudtrain.core.retry import call_with_retry

    logger = logger or log
    rules = GcpFirewalls(backend.hook)
    project, network = call_with_retry(lambda: rules.network_of(options.network, options.subnetwork, region))
    if project != backend.hook.project:  # a teardown's sweep looks in the network's project too
        known = getattr(backend, "firewall_projects", ())  # the ledger may hand its kinds any backend
        backend.firewall_projects = tuple(dict.fromkeys([*known, project]))
    for body in rule_bodies(digest, network, getattr(options, "ssh_source_ranges", None)):
        name = body["name"]
        if call_with_retry(lambda: rules.get(project, name)) is not None:  # noqa: B023 - called here
            ledger.add(KIND, name, project)
            continue
        check()
        request_id = str(uuid.uuid4())
        entry = ledger.intend(KIND, project, id=name, token=request_id)
        try:
            call_with_retry(lambda: rules.insert(project, body, request_id))  # noqa: B023 - called here
        except CloudError:  # refused: nothing was made
            ledger.discard(entry)
            raise
        logger.info("Created firewall rule %s on %s (project %s)", name, network, project)


# --- the ledger kind: found by name from the run key, deleted once the run's VMs are gone ----------


def _projects(backend: FirewallBackend) -> list[str]:
    return list(dict.fromkeys([backend.hook.project, *getattr(backend, "firewall_projects", ())]))


def _find(backend: FirewallBackend, digest: str) -> list[Resource]:
    rules = GcpFirewalls(backend.hook)
    return [
        Resource(KIND, name, project)
        for project in _projects(backend)
        for name in rules.names(project, digest)
    ]


def _vms_gone(backend: FirewallBackend, digest: str) -> None:
    """Delete any VM of the run still there and wait (bounded) until none is: the rule goes last."""
    from airflow_cloudtrain.core.cloud import ALIVE_STATES, STOPPING

    deadline = time.monotonic() + VM_GONE_WAIT_S
    asked: set[str] = set()
    while True:
        left = [i for i in backend.cloud.find(digest, ended=True) if i.state in ALIVE_STATES | {STOPPING}]
        fresh = [i for i in left if i.state in ALIVE_STATES and i.id not in asked]
        if fresh:
            backend.terminate_instances([(i.id, i.zone) for i in fresh])
            asked.update(i.id for i in fresh)
        if not left:
            return
        if time.monotonic() > deadline:
            log.warning(
                "VMs of run %s still shutting down (%s); deleting its firewall rules",
                digest,
                ", ".join(i.id for i in left),
            )
            return
        time.sleep(1.0)


def _delete(backend: FirewallBackend, resources: list[Resource]) -> None:
    rules = GcpFirewalls(backend.hook)
    for digest in dict.fromkeys(d for r in resources if (d := digest_of(r.id or ""))):
        try:
            _vms_gone(backend, digest)
        except Exception as err:  # the rule still goes: a leaked rule is a leak too
            log.warning(
                "Could not check the VMs of run %s before deleting its firewall rules: %s", digest, err
            )
    for resource in resources:
        rules.delete(resource.location or backend.hook.project, resource.id or "")


FIREWALL = register_kind(ResourceKind(KIND, _find, _delete, release_last=True))


# --- cloudtrain gc: every run's rules in the connection's project -------------------------------


def _list_tagged(backend: FirewallBackend) -> list[Tagged]:
    """Every rule named ``ct-<digest>-deny|ssh|ssh6`` in the connection's project (one list call)."""
    project = backend.hook.project
    return [
        Tagged(KIND, str(r.name), project, digest, created_at=timestamp(r.creation_timestamp), state="rule")
        for r in GcpFirewalls(backend.hook)._client("FirewallsClient").list(project=project)
        if (digest := digest_of(str(r.name)))
    ]


register_lister("gcp", KIND, _list_tagged)

"""GCE networking arguments (``network``, ``subnetwork``, ``external_ip``, ``ssh_source_ranges``),
checked at DAG parse time.

Every GCE VM used to get an external IP on the ``default`` network. These arguments put it on the
user's VPC and, with ``external_ip=False``, give it no public address at all: the agent then reaches
Cloud Storage (and anything else) only through Cloud NAT or Private Google Access on the subnetwork,
which the user sets up (see the README). Local and cheap, like ``operators.config``.

Whatever the network, a run's VMs are unreachable from outside: a firewall rule of the run denies all
ingress to them (``clouds.gcp_firewall``). ``ssh_source_ranges`` is how a user who wants SSH says from
where (a list of CIDRs), as ``key_name``/``security_group_ids`` say it on EC2.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.operators.config import is_templated

GCE_CLOUDS = ("gcloud", "gcspot")
_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PROJECT = r"(?:[a-z][-a-z0-9.]*:)?[a-z][-a-z0-9]{4,28}[a-z0-9]"
_REGION = r"[a-z]+-[a-z]+[0-9]+"
_API = r"https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta|alpha)/"
NETWORK_RE = re.compile(
    rf"^(?:{_API})?(?:projects/(?P<project>{_PROJECT})/)?global/networks/(?P<name>{_NAME})$"
)
SUBNETWORK_RE = re.compile(
    rf"^(?:{_API})?(?:projects/(?P<project>{_PROJECT})/)?regions/(?P<region>{_REGION})/subnetworks/(?P<name>{_NAME})$"
)
NETWORK_FORMS = (
    "a network name ('my-vpc'), 'projects/PROJECT/global/networks/NAME' or its full "
    "https://www.googleapis.com/compute/v1/... URL"
)
SUBNETWORK_FORMS = (
    "a subnetwork name ('my-subnet', taken in the run's region), "
    "'projects/PROJECT/regions/REGION/subnetworks/NAME' or its full https://www.googleapis.com/compute/v1/... URL"
)


@dataclass(frozen=True)
class GceNetwork:
    """The parsed arguments: ``network`` as a path GCE takes, ``subnetwork`` as a bare name (resolved
    in the region of the launch) or a path; ``region`` is the region a subnetwork path names."""

    network: str | None = None
    subnetwork: str | None = None
    external_ip: bool = True
    region: str | None = None


def _zone_region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def parse_network(value: Any) -> tuple[str | None, str | None]:
    """(path GCE takes, project the value names or None)."""
    if value is None or value == "":
        return None, None
    if isinstance(value, str):
        if re.fullmatch(_NAME, value):
            return f"global/networks/{value}", None
        if m := NETWORK_RE.match(value):
            return value, m.group("project")
    raise ValueError(f"network={value!r} is not valid: use {NETWORK_FORMS}")


def parse_subnetwork(value: Any) -> tuple[str | None, str | None, str | None]:
    """(name or path, region, project) of a subnetwork argument."""
    if value is None or value == "":
        return None, None, None
    if isinstance(value, str):
        if re.fullmatch(_NAME, value):
            return value, None, None
        if m := SUBNETWORK_RE.match(value):
            return value, m.group("region"), m.group("project")
    raise ValueError(f"subnetwork={value!r} is not valid: use {SUBNETWORK_FORMS}")


def parse_network_args(
    cloud: Any, network: Any, subnetwork: Any, external_ip: Any, region: Any = None, zone: Any = None
) -> GceNetwork:
    """Raises ValueError naming the field, the value and the accepted forms. A templated ``cloud``,
    ``region`` or ``zone`` skips the checks that need it (they are known only when the task runs)."""
    given = {
        name: value
        for name, value in (("network", network), ("subnetwork", subnetwork))
        if value not in (None, "")
    }
    if external_ip is not True:
        given["external_ip"] = external_ip
    if not isinstance(external_ip, bool):
        raise ValueError(
            f"external_ip={external_ip!r} is not valid: use True (the VM gets a public IP, the default) "
            "or False (no public IP: the subnetwork needs Cloud NAT or Private Google Access)"
        )
    if given and isinstance(cloud, str) and not is_templated(cloud) and cloud not in GCE_CLOUDS:
        name, value = next(iter(given.items()))
        raise ValueError(
            f"{name}={value!r} is not valid with cloud={cloud!r}: network, subnetwork and external_ip are "
            "GCE arguments (cloud='gcloud' or 'gcspot'); on EC2 use subnet_id and security_group_ids "
            "(a subnet without auto-assigned public IPs keeps the instance private)"
        )
    net_path, net_project = parse_network(network)
    sub_path, sub_region, sub_project = parse_subnetwork(subnetwork)
    if net_project and sub_project and net_project != sub_project:
        raise ValueError(
            f"subnetwork={subnetwork!r} is not valid with network={network!r}: they name different projects "
            f"({sub_project!r} and {net_project!r}); a subnetwork belongs to its network's project"
        )
    if sub_region:
        for field, value, its_region in (
            ("region", region, region),
            ("zone", zone, _zone_region(zone) if isinstance(zone, str) else None),
        ):
            if isinstance(value, str) and value and not is_templated(value) and its_region != sub_region:
                raise ValueError(
                    f"subnetwork={subnetwork!r} is not valid with {field}={value!r}: the subnetwork is in "
                    f"region {sub_region!r}; use a subnetwork of region {its_region!r}, or run in "
                    f"region {sub_region!r}"
                )
    return GceNetwork(net_path, sub_path, external_ip, sub_region)


SSH_FORMS = (
    "a list of IPv4 or IPv6 CIDR ranges, e.g. ['203.0.113.0/24', '2001:db8::/32'] (for IAP TCP forwarding: "
    "['35.235.240.0/20'])"
)


def parse_ssh_source_ranges(cloud: Any, value: Any) -> list[str]:
    """The ranges SSH (tcp:22) is allowed from on a GCE run's VMs: [] (the default: none) or CIDRs,
    normalised (``203.0.113.7/24`` -> ``203.0.113.0/24``, a bare address -> ``/32`` or ``/128``)."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return []
    if isinstance(cloud, str) and not is_templated(cloud) and cloud not in GCE_CLOUDS:
        raise ValueError(
            f"ssh_source_ranges={value!r} is not valid with cloud={cloud!r}: it opens SSH on GCE VMs "
            "(cloud='gcloud' or 'gcspot'); on EC2 use key_name and security_group_ids (a security group "
            "that allows tcp:22 from your ranges)"
        )
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"ssh_source_ranges={value!r} is not valid: use {SSH_FORMS}")
    out: list[str] = []
    for item in value:
        try:
            if not isinstance(item, str) or not item.strip():
                raise ValueError(item)
            out.append(str(ipaddress.ip_network(item.strip(), strict=False)))
        except ValueError:
            raise ValueError(
                f"ssh_source_ranges={list(value)!r} is not valid: {item!r} is not an IP range; use {SSH_FORMS}"
            ) from None
    return list(dict.fromkeys(out))


def check_network_for_run(config: Any, options: Any) -> None:
    """Once the templates are rendered: the same checks against the run's cloud, region and zone."""
    parse_network_args(
        config.cloud, options.network, options.subnetwork, options.external_ip, config.region, config.zone
    )
    parse_ssh_source_ranges(config.cloud, getattr(options, "ssh_source_ranges", None))


def apply_network_args(
    operator: Any, network: Any, subnetwork: Any, external_ip: Any, ssh_source_ranges: Any = None
) -> None:
    """Check the arguments and put them on the operator's launch options; a subnetwork path with no
    ``region``/``zone`` given also chooses the region (the VM must be where its subnetwork is)."""
    parsed = parse_network_args(
        operator.cloud, network, subnetwork, external_ip, operator.region, operator.zone
    )
    options = operator.launch_options
    options.ssh_source_ranges = parse_ssh_source_ranges(operator.cloud, ssh_source_ranges)
    options.network, options.subnetwork, options.external_ip = (
        parsed.network,
        parsed.subnetwork,
        parsed.external_ip,
    )
    if parsed.region and not operator.region and not operator.zone:
        operator.region = parsed.region

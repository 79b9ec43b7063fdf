"""VPC firewall rules (global): ``firewalls.insert/get/list/delete``, checked as the real API checks them.

A run's VMs on GCE carry a network tag and the run makes a rule that denies ingress to that tag
(``clouds.gcp_firewall``); the emulator keeps the rules so a test can see the rule while the run lives
and see it gone after. Rules are not enforced (no packets flow here): what is mimicked is the API.

The rules of the real API: a name like any resource's; ``network`` a partial or full URL of a network
of the same project (``global/networks/default`` when absent; "Cross project referencing is not
allowed" otherwise); ``priority`` 0-65535 (1000 when absent); ``direction`` INGRESS (default) or
EGRESS; exactly one of ``allowed`` and ``denied``, each entry with an ``IPProtocol`` (a name or a
number 0-255) and ``ports`` only for tcp/udp/sctp; ``sourceRanges`` only on INGRESS and
``destinationRanges`` only on EGRESS, valid CIDRs, IPv4 or IPv6 but not both in one rule (an INGRESS
rule with no source at all gets ``0.0.0.0/0``); ``targetTags`` network-tag names, not together with
``targetServiceAccounts``. A duplicate name is 409 alreadyExists. Mutations answer with a global
operation, as templates' do (DONE after ``firewall_op_delay``, not ``op_delay``: a test that slows
instance inserts is not slowed before them), and a replayed ``requestId`` does nothing twice.

Networks are not modelled (an instance may name any network or subnetwork, as elsewhere in the
emulator): ``subnetworks.get`` answers for any subnetwork of a known region, on the project's
``default`` network (the network an instance without ``network`` shows), so a client that resolves a
subnetwork's network for its firewall rule gets an answer.
"""

from __future__ import annotations

import ipaddress
import re
import time
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_catalog as cat
from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError, numeric_id, rfc3339
from airflow_cloudtrain.emulator.gcp.gce_groups import GroupApi
from airflow_cloudtrain.emulator.gcp.gce_state import GLOBAL

_NETWORK_URL = re.compile(
    r"(?:https?://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/(?P<project>[^/]+)/)?global/networks/"
    r"(?P<name>[^/]+)"
)
_PROTOCOLS = ("tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all")
_WITH_PORTS = ("tcp", "udp", "sctp", "6", "17", "132")
_PORT = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?")
MAX_TAGS = 64  # network tags per rule (and per instance)


def firewall_rules(project: str) -> list[Rule]:
    """The routes of the firewall calls under the ``projects/<project>`` path prefix."""
    fw = f"{project}/global/firewalls"
    return [
        Rule(fw, endpoint="firewalls.list", methods=["GET"]),
        Rule(fw, endpoint="firewalls.insert", methods=["POST"]),
        Rule(f"{fw}/<name>", endpoint="firewalls.get", methods=["GET"]),
        Rule(f"{fw}/<name>", endpoint="firewalls.delete", methods=["DELETE"]),
        Rule(f"{project}/regions/<region>/subnetworks/<name>", endpoint="subnetworks.get", methods=["GET"]),
    ]


def check_tags(field: str, tags: Any) -> list[str]:
    """Network tags (an instance's ``tags.items``, a rule's ``targetTags``/``sourceTags``): names."""
    if tags is None:
        return []
    if not isinstance(tags, list):
        raise v.invalid(field, tags, "Must be a list of network tags.")
    if len(tags) > MAX_TAGS:
        raise v.invalid(field, len(tags), f"At most {MAX_TAGS} tags are allowed.")
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not v.NAME_RE.fullmatch(tag):
            raise v.invalid(
                f"{field}[{i}]",
                tag,
                "Must be a match of regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?' (a network tag).",
            )
    return list(dict.fromkeys(tags))


def _ranges(field: str, ranges: Any) -> list[str]:
    if not ranges:
        return []
    if not isinstance(ranges, list):
        raise v.invalid(field, ranges, "Must be a list of IP ranges.")
    families = set()
    for i, text in enumerate(ranges):
        try:
            families.add(ipaddress.ip_network(str(text), strict=False).version)
        except ValueError:
            raise v.invalid(f"{field}[{i}]", text, "Must be a valid IPv4 or IPv6 CIDR range.") from None
    if len(families) > 1:
        raise v.invalid(field, ",".join(ranges), "A firewall rule can contain IPv4 or IPv6 ranges, not both.")
    return [str(r) for r in ranges]


def _entries(field: str, entries: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("IPProtocol"):
            raise v.required(f"{field}[{i}].IPProtocol")
        proto = str(entry["IPProtocol"]).lower()
        if proto not in _PROTOCOLS and not (proto.isdigit() and 0 <= int(proto) <= 255):
            raise v.invalid(
                f"{field}[{i}].IPProtocol",
                entry["IPProtocol"],
                f"Must be one of {', '.join(_PROTOCOLS)} or a protocol number 0-255.",
            )
        ports = entry.get("ports") or []
        if ports and proto not in _WITH_PORTS:
            raise v.invalid(f"{field}[{i}].ports", ports, "Ports can only be given for tcp, udp or sctp.")
        for port in ports:
            m = _PORT.fullmatch(str(port))
            low, high = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else (0, -1)
            if not m or high > 65535 or low > high:
                raise v.invalid(
                    f"{field}[{i}].ports", port, "Must be a port or a range PORT-PORT in 0-65535."
                )
        out.append({"IPProtocol": proto, **({"ports": [str(p) for p in ports]} if ports else {})})
    return out


def build_firewall(project: str, body: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``firewalls.insert`` body; the rule as ``get`` shows it."""
    name = v.check_name(body.get("name"))
    network = body.get("network") or "global/networks/default"
    m = _NETWORK_URL.fullmatch(network)
    if not m:
        raise v.invalid("resource.network", network, "The URL is malformed.")
    if (m.group("project") or project) != project:
        raise v.invalid(
            "resource.network", network, "Cross project referencing is not allowed for this resource."
        )
    try:
        priority = int(body.get("priority", 1000))
    except (TypeError, ValueError):
        raise v.invalid("resource.priority", body.get("priority"), "Must be an integer.") from None
    if not 0 <= priority <= 65535:
        raise v.invalid("resource.priority", priority, "Must be between 0 and 65535.")
    direction = body.get("direction") or "INGRESS"
    if direction not in ("INGRESS", "EGRESS"):
        raise v.invalid("resource.direction", direction, "Must be INGRESS or EGRESS.")
    allowed, denied = body.get("allowed") or [], body.get("denied") or []
    if allowed and denied:
        raise v.bad_request("A firewall rule has either allowed or denied entries, not both.")
    if not allowed and not denied:
        raise v.required("resource.allowed")
    sources = _ranges("resource.sourceRanges", body.get("sourceRanges"))
    destinations = _ranges("resource.destinationRanges", body.get("destinationRanges"))
    source_tags = check_tags("resource.sourceTags", body.get("sourceTags"))
    if direction == "EGRESS" and (sources or source_tags):
        raise v.invalid("resource.sourceRanges", sources or source_tags, "An EGRESS rule has no sources.")
    if direction == "INGRESS" and destinations:
        raise v.invalid("resource.destinationRanges", destinations, "An INGRESS rule has no destinations.")
    if direction == "INGRESS" and not sources and not source_tags and not body.get("sourceServiceAccounts"):
        sources = ["0.0.0.0/0"]  # the real API's default source
    target_tags = check_tags("resource.targetTags", body.get("targetTags"))
    if target_tags and body.get("targetServiceAccounts"):
        raise v.bad_request("targetTags and targetServiceAccounts cannot be used together.")
    res: dict[str, Any] = {
        "kind": "compute#firewall",
        "id": numeric_id(),
        "creationTimestamp": rfc3339(time.time()),
        "name": name,
        "description": body.get("description", ""),
        "network": f"{API}/projects/{project}/global/networks/{m.group('name')}",
        "priority": priority,
        "direction": direction,
        ("allowed" if allowed else "denied"): _entries(
            "resource.allowed" if allowed else "resource.denied", allowed or denied
        ),
        "logConfig": {"enable": bool((body.get("logConfig") or {}).get("enable"))},
        "disabled": bool(body.get("disabled")),
        "selfLink": f"{API}/projects/{project}/global/firewalls/{name}",
    }
    for key, value in (
        ("sourceRanges", sources),
        ("destinationRanges", destinations),
        ("sourceTags", source_tags),
        ("targetTags", target_tags),
        ("targetServiceAccounts", body.get("targetServiceAccounts")),
        ("sourceServiceAccounts", body.get("sourceServiceAccounts")),
    ):
        if value:
            res[key] = value
    return res


class FirewallApi(GroupApi):
    """A project's firewall rules and the handlers of their calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._firewalls: dict[str, dict[str, Any]] = {}
        self.firewall_op_delay = 0.0  # their own: a test slowing instance inserts leaves rules alone

    def firewalls(self) -> list[dict[str, Any]]:
        """Every rule, as ``get`` shows it (tests)."""
        with self._lock:
            return [dict(r) for _, r in sorted(self._firewalls.items())]

    def _firewall(self, name: str) -> dict[str, Any]:
        found = self._firewalls.get(name)
        if found is None:
            raise v.not_found(f"projects/{self.project}/global/firewalls/{name}")
        return found

    def _h_firewalls_insert(self, req: Request) -> dict[str, Any]:
        request_id = req.args.get("requestId")
        with self._lock:
            if replay := self._replay(GLOBAL, "firewalls.insert", request_id):
                return replay
            res = build_firewall(self.project, req.get_json(force=True, silent=True) or {})
            if res["name"] in self._firewalls:
                path = f"projects/{self.project}/global/firewalls/{res['name']}"
                raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
            self._firewalls[res["name"]] = res
            return self._started(
                GLOBAL, "insert", res, "firewalls.insert", request_id, self.firewall_op_delay
            )

    def _h_firewalls_get(self, req: Request, name: str) -> dict[str, Any]:
        with self._lock:
            return self._firewall(name)

    def _h_firewalls_delete(self, req: Request, name: str) -> dict[str, Any]:
        request_id = req.args.get("requestId")
        with self._lock:
            if replay := self._replay(GLOBAL, "firewalls.delete", request_id):
                return replay
            res = self._firewall(name)
            del self._firewalls[name]
            return self._started(
                GLOBAL, "delete", res, "firewalls.delete", request_id, self.firewall_op_delay
            )

    def _h_subnetworks_get(self, req: Request, region: str, name: str) -> dict[str, Any]:
        if region not in set(cat.catalog().zones.values()):
            raise v.not_found(f"projects/{self.project}/regions/{region}/subnetworks/{name}")
        v.check_name(name)
        link = f"{API}/projects/{self.project}"
        return {
            "kind": "compute#subnetwork",
            "id": numeric_id(),
            "name": name,
            "network": f"{link}/global/networks/default",
            "region": f"{link}/regions/{region}",
            "ipCidrRange": "10.128.0.0/20",
            "stackType": "IPV4_ONLY",
            "selfLink": f"{link}/regions/{region}/subnetworks/{name}",
        }

    def _h_firewalls_list(self, req: Request) -> dict[str, Any]:
        with self._lock:
            items = list(self._firewalls.values())
        link = f"{API}/projects/{self.project}/global/firewalls"
        return api.listing("compute#firewallList", link, items, req.args)

"""Resource policies (regional): ``resourcePolicies.insert/get/list/delete`` for group placement
policies, checked as the real API checks them, and the regional operations they answer with.

A gang on GCE may ask for a compact placement policy (``clouds.gcp.gang_net``): a policy with
``groupPlacementPolicy.collocation = COLLOCATED`` that the run's VMs name in ``resourcePolicies``. The
emulator keeps the policies so a test sees them while the run lives and gone after; placement itself
is not played (every VM of a zone is as close as any other here).

The rules of the real API kept here: a name like any resource's, unique in its region (409
alreadyExists); a region that exists; exactly one kind of policy, and of the kinds only
``groupPlacementPolicy`` is served (others are refused as unsupported by the emulator);
``collocation`` ``COLLOCATED`` or ``UNSPECIFIED_COLLOCATION``; ``vmCount`` and
``availabilityDomainCount`` positive integers (``availabilityDomainCount`` 1-8, a spread policy's,
not with ``COLLOCATED``). A policy that a VM still names cannot be deleted (400
``resourceInUseByAnotherResource``). Mutations answer with a regional operation (DONE after
``policy_op_delay``); a replayed ``requestId`` does nothing twice.
"""

from __future__ import annotations

import time
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_catalog as cat
from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError, numeric_id, rfc3339
from airflow_cloudtrain.emulator.gcp.gce_firewalls import FirewallApi

_KINDS = (
    "groupPlacementPolicy",
    "snapshotSchedulePolicy",
    "instanceSchedulePolicy",
    "diskConsistencyGroupPolicy",
    "workloadPolicy",
)
_COLLOCATIONS = ("COLLOCATED", "UNSPECIFIED_COLLOCATION")


def policy_rules(project: str) -> list[Rule]:
    """The routes of the resource policy calls and regional operations under ``projects/<project>``."""
    r = f"{project}/regions/<region>"
    return [
        Rule(f"{r}/resourcePolicies", endpoint="resourcePolicies.list", methods=["GET"]),
        Rule(f"{r}/resourcePolicies", endpoint="resourcePolicies.insert", methods=["POST"]),
        Rule(f"{r}/resourcePolicies/<name>", endpoint="resourcePolicies.get", methods=["GET"]),
        Rule(f"{r}/resourcePolicies/<name>", endpoint="resourcePolicies.delete", methods=["DELETE"]),
        Rule(f"{r}/operations/<op>", endpoint="regionOperations.get", methods=["GET"]),
        Rule(f"{r}/operations/<op>/wait", endpoint="regionOperations.wait", methods=["POST"]),
    ]


def _count(field: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high and value > high):
        rule = f"between {low} and {high}" if high else f"at least {low}"
        raise v.invalid(field, value, f"Must be an integer {rule}.")
    return value


def build_policy(project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
    """Validate a ``resourcePolicies.insert`` body; the policy as ``get`` shows it."""
    name = v.check_name(body.get("name"))
    kinds = [k for k in _KINDS if body.get(k)]
    if len(kinds) != 1:
        raise api.bad_request("Exactly one policy type must be specified in a resource policy.")
    if kinds != ["groupPlacementPolicy"]:
        raise api.bad_request(f"{kinds[0]} is not served by the emulator (only groupPlacementPolicy).")
    group = dict(body["groupPlacementPolicy"])
    collocation = group.get("collocation", "UNSPECIFIED_COLLOCATION")
    if collocation not in _COLLOCATIONS:
        raise v.invalid(
            "resource.groupPlacementPolicy.collocation", collocation, f"Must be one of {_COLLOCATIONS}."
        )
    placement: dict[str, Any] = {"collocation": collocation}
    if "vmCount" in group:
        placement["vmCount"] = _count("resource.groupPlacementPolicy.vmCount", group["vmCount"], 1)
    if "availabilityDomainCount" in group:
        if collocation == "COLLOCATED":
            raise api.bad_request("availabilityDomainCount cannot be set on a COLLOCATED placement policy.")
        field = "resource.groupPlacementPolicy.availabilityDomainCount"
        placement["availabilityDomainCount"] = _count(field, group["availabilityDomainCount"], 1, 8)
    link = f"{API}/projects/{project}/regions/{region}"
    return {
        "kind": "compute#resourcePolicy",
        "id": numeric_id(),
        "creationTimestamp": rfc3339(time.time()),
        "name": name,
        "description": body.get("description", ""),
        "region": link,
        "selfLink": f"{link}/resourcePolicies/{name}",
        "groupPlacementPolicy": placement,
        "status": "READY",
    }


class PolicyApi(FirewallApi):
    """A project's resource policies and the handlers of their calls and regional operations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._policies: dict[tuple[str, str], dict[str, Any]] = {}  # (region, name) -> policy
        self.policy_op_delay = 0.0

    def policies(self) -> list[dict[str, Any]]:
        """Every policy of every region, as ``get`` shows it (tests)."""
        with self._lock:
            return [dict(p) for _, p in sorted(self._policies.items())]

    def _region(self, region: str) -> str:
        if region not in set(cat.catalog().zones.values()):
            raise v.not_found(f"projects/{self.project}/regions/{region}")
        return region

    def _policy(self, region: str, name: str) -> dict[str, Any]:
        found = self._policies.get((region, name))
        if found is None:
            raise v.not_found(f"projects/{self.project}/regions/{region}/resourcePolicies/{name}")
        return found

    def _region_op(
        self, region: str, kind: str, res: dict[str, Any], method: str, request_id: str | None
    ) -> dict[str, Any]:
        """A regional operation (``zone`` replaced by ``region``), remembered for replays and waits."""
        now = time.time()
        scope = f"regions/{region}"
        op = self._new_op(scope, kind, res, now, done_at=now + self.policy_op_delay)
        op.res.pop("zone", None)
        link = f"{API}/projects/{self.project}/regions/{region}"
        op.res["region"] = link
        op.res["selfLink"] = f"{link}/operations/{op.res['name']}"
        if request_id:
            self._requests[(scope, method, request_id)] = op.res["name"]
        return self._show_op(op, now)

    def _users(self, policy: dict[str, Any]) -> list[str]:
        """Self links of the VMs (not yet gone) that name this policy."""
        link, now = policy["selfLink"], time.time()
        return [
            i.res["selfLink"]
            for i in self._instances.values()
            if (i.gone_at is None or now < i.gone_at)
            and any(p == link or link.endswith("/" + p) for p in i.res.get("resourcePolicies", []))
        ]

    # --- HTTP handlers ---------------------------------------------------------------------------------

    def _h_resourcePolicies_insert(self, req: Request, region: str) -> dict[str, Any]:
        request_id = req.args.get("requestId")
        scope = f"regions/{self._region(region)}"
        with self._lock:
            if replay := self._replay(scope, "resourcePolicies.insert", request_id):
                return replay
            res = build_policy(self.project, region, req.get_json(force=True, silent=True) or {})
            if (region, res["name"]) in self._policies:
                path = f"projects/{self.project}/regions/{region}/resourcePolicies/{res['name']}"
                raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
            self._policies[(region, res["name"])] = res
            return self._region_op(region, "insert", res, "resourcePolicies.insert", request_id)

    def _h_resourcePolicies_get(self, req: Request, region: str, name: str) -> dict[str, Any]:
        with self._lock:
            return self._policy(self._region(region), name)

    def _h_resourcePolicies_delete(self, req: Request, region: str, name: str) -> dict[str, Any]:
        request_id = req.args.get("requestId")
        scope = f"regions/{self._region(region)}"
        with self._lock:
            if replay := self._replay(scope, "resourcePolicies.delete", request_id):
                return replay
            res = self._policy(region, name)
            users = self._users(res)
            if users:
                raise ApiError(
                    400,
                    "resourceInUseByAnotherResource",
                    f"The resource_policy resource '{res['selfLink']}' is already being used by '{users[0]}'",
                )
            del self._policies[(region, name)]
            return self._region_op(region, "delete", res, "resourcePolicies.delete", request_id)

    def _h_resourcePolicies_list(self, req: Request, region: str) -> dict[str, Any]:
        with self._lock:
            items = [p for (r, _), p in sorted(self._policies.items()) if r == self._region(region)]
        link = f"{API}/projects/{self.project}/regions/{region}/resourcePolicies"
        return api.listing("compute#resourcePolicyList", link, items, req.args)

    def _h_regionOperations_get(self, req: Request, region: str, op: str) -> dict[str, Any]:
        with self._lock:
            return self._show_op(self._get_op(f"regions/{region}", op), time.time())

    def _h_regionOperations_wait(self, req: Request, region: str, op: str) -> dict[str, Any]:
        return self._wait_op(f"regions/{region}", op)

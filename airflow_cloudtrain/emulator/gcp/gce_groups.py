"""The Compute Engine API's calls on instance templates (global), zonal managed instance groups and
global operations: what each checks and changes (state and group manager: ``gce_manager``), and their
HTTP handlers, which ``GceServer`` routes (``group_rules``).

The checks are the real API's: a template's ``properties`` as ``gce_templates`` says; a duplicate name
409 alreadyExists; deleting a template a group uses 400 resourceInUseByAnotherResource; a group's
``instanceTemplate`` a full or partial URL (a bare name is malformed, an unknown template 404
notFound); ``targetSize`` and ``resize``'s ``size`` at least 0; ``deleteInstances`` as its doc says. A
replayed ``requestId`` returns the same operation and does nothing twice. Mutations answer with an
operation, DONE after ``op_delay`` like the zonal ones (template operations are global).
``listManagedInstances`` lists every member at once (the API's default ``PAGELESS`` results).
"""

from __future__ import annotations

import re
import time
from typing import Any

from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_templates as tpl
from airflow_cloudtrain.emulator.gcp import gce_validate as v
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError, fingerprint, numeric_id, rfc3339
from airflow_cloudtrain.emulator.gcp.gce_manager import Group, GroupManager, Member
from airflow_cloudtrain.emulator.gcp.gce_state import GLOBAL

_BASE_NAME = r"[a-z][-a-z0-9]{0,57}"


def group_rules(project: str, zone: str) -> list[Rule]:
    """The routes of templates, global operations and groups, under these path prefixes."""
    g, igm = f"{project}/global", f"{zone}/instanceGroupManagers"
    return [
        Rule(f"{g}/instanceTemplates", endpoint="instanceTemplates.list", methods=["GET"]),
        Rule(f"{g}/instanceTemplates", endpoint="instanceTemplates.insert", methods=["POST"]),
        Rule(f"{g}/instanceTemplates/<name>", endpoint="instanceTemplates.get", methods=["GET"]),
        Rule(f"{g}/instanceTemplates/<name>", endpoint="instanceTemplates.delete", methods=["DELETE"]),
        Rule(f"{g}/operations", endpoint="globalOperations.list", methods=["GET"]),
        Rule(f"{g}/operations/<op>", endpoint="globalOperations.get", methods=["GET"]),
        Rule(f"{g}/operations/<op>/wait", endpoint="globalOperations.wait", methods=["POST"]),
        Rule(igm, endpoint="instanceGroupManagers.list", methods=["GET"]),
        Rule(igm, endpoint="instanceGroupManagers.insert", methods=["POST"]),
        Rule(f"{igm}/<name>", endpoint="instanceGroupManagers.get", methods=["GET"]),
        Rule(f"{igm}/<name>", endpoint="instanceGroupManagers.delete", methods=["DELETE"]),
        Rule(f"{igm}/<name>/resize", endpoint="instanceGroupManagers.resize", methods=["POST"]),
        Rule(
            f"{igm}/<name>/deleteInstances",
            endpoint="instanceGroupManagers.deleteInstances",
            methods=["POST"],
        ),
        Rule(
            f"{igm}/<name>/recreateInstances",
            endpoint="instanceGroupManagers.recreateInstances",
            methods=["POST"],
        ),
        Rule(
            f"{igm}/<name>/listManagedInstances",
            endpoint="instanceGroupManagers.listManagedInstances",
            methods=["POST"],
        ),
    ]


class GroupApi(GroupManager):
    """The API's calls on templates, groups and global operations; ``_h_*`` are the HTTP handlers."""

    # --- instance templates ----------------------------------------------------------------------

    def _template_insert(self, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        with self._lock:
            if replay := self._replay(GLOBAL, "instanceTemplates.insert", request_id):
                return replay
            res = tpl.build_template(self.project, body)
            if res["name"] in self._templates:
                path = f"projects/{self.project}/global/instanceTemplates/{res['name']}"
                raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
            self._templates[res["name"]] = res
            return self._started(GLOBAL, "insert", res, "instanceTemplates.insert", request_id)

    def _template(self, name: str) -> dict[str, Any]:
        found = self._templates.get(name)
        if found is None:
            raise v.not_found(f"projects/{self.project}/global/instanceTemplates/{name}")
        return found

    def _template_delete(self, name: str, request_id: str | None) -> dict[str, Any]:
        """The real API refuses while a group uses the template (resourceInUseByAnotherResource)."""
        with self._lock:
            if replay := self._replay(GLOBAL, "instanceTemplates.delete", request_id):
                return replay
            res = self._template(name)
            user = next((g for g in self._groups.values() if g.template == name), None)
            if user is not None:
                raise ApiError(
                    400,
                    "resourceInUseByAnotherResource",
                    f"The instance_template resource 'projects/{self.project}/global/instanceTemplates/"
                    f"{name}' is already being used by 'projects/{self.project}/zones/{user.zone}/"
                    f"instanceGroupManagers/{user.res['name']}'",
                )
            del self._templates[name]
            return self._started(GLOBAL, "delete", res, "instanceTemplates.delete", request_id)

    # --- groups: the API's mutations -------------------------------------------------------------

    def _group_insert(self, zone: str, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        with self._lock:
            if replay := self._replay(zone, "instanceGroupManagers.insert", request_id):
                return replay
            now = self._advance()
            name = v.check_name(body.get("name"))
            base = body.get("baseInstanceName")
            if not base:
                raise v.required("resource.baseInstanceName")
            if not re.fullmatch(_BASE_NAME, base):
                raise v.invalid("resource.baseInstanceName", base, f"Must be a match of regex '{_BASE_NAME}'")
            template = self._template_of(body)
            size = int(body.get("targetSize") or 0)
            if size < 0:
                raise v.invalid("resource.targetSize", size, "Must be greater than or equal to 0.")
            if (zone, name) in self._groups:
                path = f"projects/{self.project}/zones/{zone}/instanceGroupManagers/{name}"
                raise ApiError(409, "alreadyExists", f"The resource '{path}' already exists")
            link = f"{API}/projects/{self.project}/zones/{zone}"
            res: dict[str, Any] = {
                "kind": "compute#instanceGroupManager",
                "id": numeric_id(),
                "creationTimestamp": rfc3339(now),
                "name": name,
                "description": body.get("description", ""),
                "zone": link,
                "instanceTemplate": tpl.template_link(self.project, template),
                "instanceGroup": f"{link}/instanceGroups/{name}",
                "baseInstanceName": base,
                "fingerprint": fingerprint(),
                **{k: body[k] for k in ("namedPorts", "autoHealingPolicies") if k in body},
                "updatePolicy": {
                    "type": "OPPORTUNISTIC",
                    "minimalAction": "REPLACE",
                    "maxSurge": {"fixed": 1, "calculated": 1},
                    "maxUnavailable": {"fixed": 1, "calculated": 1},
                    "replacementMethod": "SUBSTITUTE",
                },
                "instanceLifecyclePolicy": {"forceUpdateOnRepair": "NO", "defaultActionOnFailure": "REPAIR"},
                "listManagedInstancesResults": body.get("listManagedInstancesResults", "PAGELESS"),
                "selfLink": f"{link}/instanceGroupManagers/{name}",
            }
            group = self._groups[(zone, name)] = Group(res, zone, template, size)
            self._reconcile(group, now)
            return self._started(zone, "insert", res, "instanceGroupManagers.insert", request_id)

    def _group_resize(self, zone: str, name: str, size: str | None, request_id: str | None) -> dict[str, Any]:
        with self._lock:
            if replay := self._replay(zone, "instanceGroupManagers.resize", request_id):
                return replay
            if size is None:
                raise v.required("size")
            try:
                target = int(size)
            except ValueError:
                raise v.invalid("size", size, "Must be an integer.") from None
            if target < 0:
                raise v.invalid("size", size, "Must be greater than or equal to 0.")
            now = self._advance()
            group = self._group(zone, name)
            group.target = target
            self._reconcile(group, now)
            kind = "compute.instanceGroupManagers.resize"
            return self._started(zone, kind, group.res, "instanceGroupManagers.resize", request_id)

    def _group_delete_instances(
        self, zone: str, name: str, body: dict[str, Any], request_id: str | None
    ) -> dict[str, Any]:
        """Delete the named members and lower targetSize by their number. A malformed URL or one in
        another zone always fails the request; a non-member or a member already being deleted fails it
        unless ``skipInstancesOnValidationError``, which skips it."""
        with self._lock:
            if replay := self._replay(zone, "instanceGroupManagers.deleteInstances", request_id):
                return replay
            now = self._advance()
            group = self._group(zone, name)
            skip = bool(body.get("skipInstancesOnValidationError"))
            chosen = self._members_named(group, zone, name, body, skip)
            for member in chosen:
                self._drop(group, member, now)
            group.target = max(0, group.target - len(chosen))
            self._reconcile(group, now)
            kind = "compute.instanceGroupManagers.deleteInstances"
            return self._started(zone, kind, group.res, "instanceGroupManagers.deleteInstances", request_id)

    def _members_named(
        self, group: Group, zone: str, name: str, body: dict[str, Any], skip: bool
    ) -> list[Member]:
        """The members ``body["instances"]`` names (partial or full URLs), each once. A malformed URL
        or one in another zone fails the request; a non-member or a member already being deleted
        fails it too, unless ``skip``."""
        chosen: list[Member] = []
        for i, url in enumerate(body.get("instances") or []):
            field, parsed = f"resource.instances[{i}]", v.parse_zonal(url, "instances")
            if parsed is None:
                raise v.invalid(field, url, "The URL is malformed.")
            if parsed[0] != zone:
                raise v.invalid(field, url, f"The instance must be in the group's zone '{zone}'.")
            member = group.members.get(parsed[1])
            if member is None or member.action == "DELETING":
                if skip:
                    continue
                why = "is not a member of" if member is None else "is already being deleted from"
                raise v.invalid(field, url, f"The instance {why} the instance group manager '{name}'.")
            if member not in chosen:
                chosen.append(member)
        return chosen

    def _group_recreate_instances(
        self, zone: str, name: str, body: dict[str, Any], request_id: str | None
    ) -> dict[str, Any]:
        """Delete the named members' VMs and make them again under the same names (RECREATING until
        then); targetSize is kept. URLs are checked as ``deleteInstances`` checks them."""
        with self._lock:
            if replay := self._replay(zone, "instanceGroupManagers.recreateInstances", request_id):
                return replay
            now = self._advance()
            group = self._group(zone, name)
            for member in self._members_named(group, zone, name, body, skip=False):
                inst = self._vm(group, member)
                member.action = "RECREATING"
                if inst is not None and inst.gone_at is None:
                    self._remove_vm(inst, now)  # the member stays: made again once its VM is gone
            self._reconcile(group, now)
            kind = "compute.instanceGroupManagers.recreateInstances"
            return self._started(zone, kind, group.res, "instanceGroupManagers.recreateInstances", request_id)

    def _group_delete(self, zone: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self._lock:
            if replay := self._replay(zone, "instanceGroupManagers.delete", request_id):
                return replay
            now = self._advance()
            group = self._group(zone, name)
            for member in list(group.members.values()):
                self._drop(group, member, now)
            del self._groups[(zone, name)]
            return self._started(zone, "delete", group.res, "instanceGroupManagers.delete", request_id)

    def _group(self, zone: str, name: str) -> Group:
        found = self._groups.get((zone, name))
        if found is None:
            raise v.not_found(f"projects/{self.project}/zones/{zone}/instanceGroupManagers/{name}")
        return found

    def _template_of(self, body: dict[str, Any]) -> str:
        """The name of the group's template (``instanceTemplate``, else the first version's): a URL."""
        given, field = body.get("instanceTemplate"), "resource.instanceTemplate"
        if not given and body.get("versions"):
            given, field = (
                body["versions"][0].get("instanceTemplate"),
                "resource.versions[0].instanceTemplate",
            )
        if not given:
            raise v.required("instanceTemplate")
        parsed = tpl.parse_template_url(given)
        if parsed is None:
            raise v.invalid(field, given, "The URL is malformed.")
        project, name = parsed[0] or self.project, parsed[1]
        if project != self.project or name not in self._templates:
            raise v.not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return name

    def _started(
        self,
        scope: str,
        kind: str,
        res: dict[str, Any],
        method: str,
        request_id: str | None,
        delay: float | None = None,
    ) -> dict[str, Any]:
        """The operation of a mutation just made (DONE after ``delay``, default ``op_delay``),
        remembered under its requestId for replays."""
        now = time.time()
        op = self._new_op(scope, kind, res, now, done_at=now + (self.op_delay if delay is None else delay))
        if request_id:
            self._requests[(scope, method, request_id)] = op.res["name"]
        return self._show_op(op, now)

    # --- HTTP handlers: one per API method (the route endpoint name) ------------------------------

    def _h_instanceTemplates_insert(self, req: Request) -> dict[str, Any]:
        return self._template_insert(_body(req), req.args.get("requestId"))

    def _h_instanceTemplates_get(self, req: Request, name: str) -> dict[str, Any]:
        with self._lock:
            return self._template(name)

    def _h_instanceTemplates_delete(self, req: Request, name: str) -> dict[str, Any]:
        return self._template_delete(name, req.args.get("requestId"))

    def _h_instanceTemplates_list(self, req: Request) -> dict[str, Any]:
        with self._lock:
            items = list(self._templates.values())
        link = f"{API}/projects/{self.project}/global/instanceTemplates"
        return api.listing("compute#instanceTemplateList", link, items, req.args)

    def _h_globalOperations_get(self, req: Request, op: str) -> dict[str, Any]:
        with self._lock:
            return self._show_op(self._get_op(GLOBAL, op), time.time())

    def _h_globalOperations_wait(self, req: Request, op: str) -> dict[str, Any]:
        return self._wait_op(GLOBAL, op)

    def _h_globalOperations_list(self, req: Request) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            items = [self._show_op(o, now) for (scope, _), o in self._ops.items() if scope == GLOBAL]
        link = f"{API}/projects/{self.project}/global/operations"
        return api.listing("compute#operationList", link, items, req.args)

    def _h_instanceGroupManagers_insert(self, req: Request, zone: str) -> dict[str, Any]:
        return self._group_insert(zone, _body(req), req.args.get("requestId"))

    def _h_instanceGroupManagers_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            group = self._group(zone, name)
            self._reconcile(group, self._advance())  # as current as the instances it is read with
            return self._show_group(group)

    def _h_instanceGroupManagers_list(self, req: Request, zone: str) -> dict[str, Any]:
        with self._lock:
            self.reconcile()
            items = [self._show_group(g) for g in self._groups.values() if g.zone == zone]
        link = f"{API}/projects/{self.project}/zones/{zone}/instanceGroupManagers"
        return api.listing("compute#instanceGroupManagerList", link, items, req.args)

    def _h_instanceGroupManagers_resize(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._group_resize(zone, name, req.args.get("size"), req.args.get("requestId"))

    def _h_instanceGroupManagers_deleteInstances(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._group_delete_instances(zone, name, _body(req), req.args.get("requestId"))

    def _h_instanceGroupManagers_recreateInstances(
        self, req: Request, zone: str, name: str
    ) -> dict[str, Any]:
        return self._group_recreate_instances(zone, name, _body(req), req.args.get("requestId"))

    def _h_instanceGroupManagers_listManagedInstances(
        self, req: Request, zone: str, name: str
    ) -> dict[str, Any]:
        with self._lock:
            group = self._group(zone, name)
            now = self._advance()
            self._reconcile(group, now)
            members = self._managed(group, now)
        return {"managedInstances": members} if members else {}

    def _h_instanceGroupManagers_delete(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._group_delete(zone, name, req.args.get("requestId"))


def _body(req: Request) -> dict[str, Any]:
    return req.get_json(force=True, silent=True) or {}

"""One project of the emulated Compute Engine: its instances, operations, templates and groups
(``PolicyApi`` on ``FirewallApi`` on ``GroupApi`` on ``GroupManager`` on ``ComputeState``), and the HTTP handlers of the instance, operation
and catalog calls, one per API method (the route endpoint name). ``GceServer`` (``gce``) routes each
request to the project its path names, made on first use: the emulator serves any project id."""

from __future__ import annotations

import time
from typing import Any

from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.gcp import gce_api as api
from airflow_cloudtrain.emulator.gcp import gce_catalog as cat
from airflow_cloudtrain.emulator.gcp.gce_api import API, ApiError
from airflow_cloudtrain.emulator.gcp.gce_policies import PolicyApi
from airflow_cloudtrain.emulator.gcp.gce_state import GLOBAL


class GceProject(PolicyApi):
    """A project's Compute Engine state and the handlers that read and change it."""

    def _list(self, kind: str, self_link: str, items: list[dict[str, Any]], req: Request) -> dict[str, Any]:
        return api.listing(kind, self_link, items, req.args)

    def _aggregated(
        self, kind: str, key: str, per_zone: dict[str, list[dict[str, Any]]], req: Request
    ) -> dict[str, Any]:
        predicate = api.compile_filter(req.args.get("filter"))
        flat = [
            (z, r)
            for z in sorted(per_zone)
            for r in sorted(per_zone[z], key=lambda r: r["name"])
            if predicate(r)
        ]
        chunk, token = api.page(flat, req.args.get("maxResults"), req.args.get("pageToken"))
        items: dict[str, Any] = {}
        for zone in ([GLOBAL] if GLOBAL in per_zone else []) + sorted(cat.catalog().zones):
            found = [r for z, r in chunk if z == zone]
            scope = GLOBAL if zone == GLOBAL else f"zones/{zone}"
            items[scope] = (
                {key: found}
                if found
                else {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
            )
        link = f"{API}/projects/{self.project}/aggregated/{key}"
        out = {
            "kind": kind,
            "id": f"projects/{self.project}/aggregated/{key}",
            "items": items,
            "selfLink": link,
        }
        return {**out, "nextPageToken": token} if token else out

    # --- handlers: one per API method (the route endpoint name) ------------------------------------

    def _h_instances_insert(self, req: Request, zone: str) -> dict[str, Any]:
        return self._insert(zone, req.get_json(force=True, silent=True) or {}, req.args.get("requestId"))

    def _h_instances_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            return self._show(self._get_instance(zone, name), now)

    def _h_instances_delete(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(zone, name, "delete", req.args.get("requestId"))

    def _h_instances_stop(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        return self._stop_or_delete(zone, name, "stop", req.args.get("requestId"))

    def _h_instances_list(self, req: Request, zone: str) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            items = [self._show(i, now) for i in self._instances.values() if i.zone == zone]
        link = f"{API}/projects/{self.project}/zones/{zone}/instances"
        return self._list("compute#instanceList", link, items, req)

    def _h_instances_aggregatedList(self, req: Request) -> dict[str, Any]:
        with self._lock:
            now = self._advance()
            per_zone: dict[str, list[dict[str, Any]]] = {}
            for inst in self._instances.values():
                per_zone.setdefault(inst.zone, []).append(self._show(inst, now))
        return self._aggregated("compute#instanceAggregatedList", "instances", per_zone, req)

    def _h_zoneOperations_get(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        with self._lock:
            return self._show_op(self._get_op(zone, op), time.time())

    def _h_zoneOperations_wait(self, req: Request, zone: str, op: str) -> dict[str, Any]:
        return self._wait_op(zone, op)

    def _h_zoneOperations_list(self, req: Request, zone: str) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            items = [self._show_op(o, now) for (z, _), o in self._ops.items() if z == zone]
        link = f"{API}/projects/{self.project}/zones/{zone}/operations"
        return self._list("compute#operationList", link, items, req)

    def _h_globalOperations_aggregatedList(self, req: Request) -> dict[str, Any]:
        with self._lock:
            now = time.time()
            per_zone: dict[str, list[dict[str, Any]]] = {}
            for (zone, _), op in self._ops.items():
                per_zone.setdefault(zone, []).append(self._show_op(op, now))
        return self._aggregated("compute#operationAggregatedList", "operations", per_zone, req)

    # --- the catalog side ------------------------------------------------------------------------

    def _h_zones_list(self, req: Request) -> dict[str, Any]:
        items = [cat.zone_resource(self.project, z) for z in cat.catalog().zones]
        return self._list("compute#zoneList", f"{API}/projects/{self.project}/zones", items, req)

    def _h_zones_get(self, req: Request, zone: str) -> dict[str, Any]:
        return cat.zone_resource(self.project, zone)

    def _h_machineTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        items = [
            cat.machine_type_resource(self.project, zone, s)
            for s in cat.catalog().machines.get(zone, {}).values()
        ]
        link = f"{API}/projects/{self.project}/zones/{zone}/machineTypes"
        return self._list("compute#machineTypeList", link, items, req)

    def _h_machineTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        shape = cat.catalog().machines.get(zone, {}).get(name)
        try:
            shape = shape or cat.catalog().custom(zone, name, name)
        except ApiError:
            shape = None
        if shape is None:
            raise api.not_found(f"projects/{self.project}/zones/{zone}/machineTypes/{name}")
        return cat.machine_type_resource(self.project, zone, shape)

    def _h_acceleratorTypes_list(self, req: Request, zone: str) -> dict[str, Any]:
        types = cat.catalog().accelerators.get(zone, {})
        items = [cat.accelerator_type_resource(self.project, zone, n, c) for n, c in types.items()]
        link = f"{API}/projects/{self.project}/zones/{zone}/acceleratorTypes"
        return self._list("compute#acceleratorTypeList", link, items, req)

    def _h_acceleratorTypes_get(self, req: Request, zone: str, name: str) -> dict[str, Any]:
        cards = cat.catalog().accelerators.get(zone, {}).get(name)
        if cards is None:
            raise api.not_found(f"projects/{self.project}/zones/{zone}/acceleratorTypes/{name}")
        return cat.accelerator_type_resource(self.project, zone, name, cards)

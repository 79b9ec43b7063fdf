"""moto's server on loopback, behind a WSGI layer that adds what moto cannot do by itself.

The layer records which side made which call (``emulator.calls``), counts requests per operation (``DescribeInstances``, ``GetObject``, ...; the emulator's own
excluded), answers the Pricing API and DescribeSpotPriceHistory from the price snapshot (``pricing``),
refuses a share of them as throttled when asked (``RequestLimitExceeded`` for EC2,
``SlowDown`` for S3, ``Throttling``/``ThrottlingException`` elsewhere), with the service's server error,
or (a run folder's writes, ``fail_writes``) with S3's 403 ``AccessDenied`` (``wire.refused``), answers RunInstances of a type
without capacity with ``InsufficientInstanceCapacity``, serves the placement groups and the Spot placement scores moto lacks
(``placement``, ``spot_scores``), and sends one ``Server`` header, not moto's
``amazon.com`` on top of Werkzeug's (aiohttp rejects a repeated one in debug mode). Requests that
may change Auto Scaling groups (every Auto Scaling request, and EC2 TerminateInstances, whose handler
replaces members) go through ``groups.request``: one at a time with the emulator's group reconcile,
new members placed on their market before the answer (``groups``); where moto fails on a group or
instance that is not there (KeyError, StopIteration: an HTTP 500 and a traceback) they get Auto
Scaling's ValidationError. Ranged GetObject is answered from the object's buffer (``ranges``), and a
completed multipart upload is streamed into its object's spooled file, not joined in memory
(``bigkeys``, installed at start). That copy takes a while for a big object (16 GB: about a minute
here), longer than boto3's 60 s read timeout, and boto3 then sends the same CompleteMultipartUpload
again; moto answers a repeated one from the finished object, but one that runs beside the first
reads parts the first has just disposed of (a 500). So completions run one at a time: the retry
waits for the first and gets its object.
"""

from __future__ import annotations

import functools
import io
import re
import threading
import urllib.parse
from collections import Counter
from typing import Any

from airflow_cloudtrain.emulator import calls
from airflow_cloudtrain.emulator.aws import (
    backend,
    bigkeys,
    groups,
    placement,
    pricing,
    ranges,
    spot_scores,
    sqs_receive,
    wire,
)
from airflow_cloudtrain.emulator.faults import Throttle, is_own
from airflow_cloudtrain.emulator.serving import InThread, keep_alive_handler


def _read_body(environ: dict[str, Any]) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        return environ["wsgi.input"].read(length)
    if environ.get("wsgi.input_terminated"):  # chunked: the server's stream ends with the body
        return environ["wsgi.input"].read()
    return b""


class FaultsAndCounts:
    """WSGI middleware in front of moto: counts, throttling, capacity faults (see the module doc)."""

    def __init__(self, app: Any, throttle: Throttle | None = None) -> None:
        self.app = app
        self.throttle = throttle or Throttle()
        self.lock = threading.Lock()
        self.capacity_faults: set[tuple[str, str | None]] = set()
        self.capacity_after: dict[tuple[str, str | None], int] = {}  # launches still let through
        self.spot_capacity_faults: set[tuple[str, str | None]] = set()  # spot launches only
        self.placement_groups = placement.PlacementGroups()  # moto has none (``placement``)
        self.spot_prices = pricing.SpotPrices()  # ``Emulator.set_spot_price``
        self.spot_scores = spot_scores.SpotPlacementScores()  # moto has none (``spot_scores``)
        self.counts: Counter[str] = Counter()
        self.completing = threading.Lock()  # CompleteMultipartUpload (see the module doc)

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        form: dict[str, list[str]] = {}
        body = b""
        if environ.get("REQUEST_METHOD") == "POST":  # read it once, hand moto a fresh copy
            body = _read_body(environ)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
            if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
                form = urllib.parse.parse_qs(body.decode(errors="replace"))
        call = wire.classify(environ, form)
        if not is_own(environ.get("HTTP_USER_AGENT")):
            side = calls.aws_side(environ.get("HTTP_AUTHORIZATION", ""), environ.get("QUERY_STRING", ""))
            calls.record("aws", side, call.service, call.operation)  # which side calls what (``calls``)
            obj = environ.get("PATH_INFO", "").lstrip("/") if call.service == "s3" else None
            fault = self.throttle.draw(call.service, call.operation, obj, side)
            with self.lock:
                self.counts[call.operation] += 1
                if fault:
                    self.counts[f"{fault}:{call.operation}"] += 1
            if fault:
                _read_body(environ)  # drain what the client sends before answering
                return self._send(
                    start_response, wire.refused(call, environ.get("REQUEST_METHOD", ""), fault)
                )
        if call.protocol == "json" and environ.get("HTTP_X_AMZ_TARGET", "").startswith(
            "AWSPriceListService."
        ):
            return self._send(
                start_response, pricing.pricing(call.operation, body)
            )  # moto has no Pricing API
        if call.operation == "DescribeSpotPriceHistory" and call.protocol == "ec2":
            return self._send(
                start_response, pricing.spot_price_history(_region(environ), form, self.spot_prices)
            )
        if call.operation == "DescribeInstanceTypeOfferings" and pricing.wants_zone_offerings(form):
            return self._send(start_response, pricing.zone_offerings(_region(environ), form))
        if call.protocol == "ec2" and call.operation == spot_scores.OPERATION:
            return self._send(start_response, self.spot_scores.answer(_region(environ) or "us-east-1", form))
        if call.protocol == "ec2" and call.operation in placement.OPERATIONS:
            region = _region(environ) or "us-east-1"
            return self._send(start_response, self.placement_groups.answer(call.operation, region, form))
        if call.operation == "RunInstances" and call.protocol == "ec2":
            unknown = self.placement_groups.check_launch(_region(environ) or "us-east-1", form)
            if unknown is not None:
                return self._send(start_response, unknown)
            itype = (form.get("InstanceType") or [""])[0]
            zone = next(iter(form.get("Placement.AvailabilityZone") or []), None)
            with self.lock:
                keys = [k for k in ((itype, zone), (itype, None)) if k in self.capacity_faults]
                hit = bool(keys)
                if hit and self.capacity_after.get(keys[0], 0) > 0:  # room for a few more first
                    self.capacity_after[keys[0]] -= 1
                    hit = False
                spot = (form.get("InstanceMarketOptions.MarketType") or [""])[0] == "spot"
                if spot and any(k in self.spot_capacity_faults for k in ((itype, zone), (itype, None))):
                    hit = True
            if hit:
                return self._send(start_response, wire.capacity_error(itype, zone))
            group = next(iter(form.get("Placement.GroupName") or []), None)
            if group:  # moto keeps no placement group: the launched instances are put in it here
                return self._launch_into(environ, start_response, _region(environ) or "us-east-1", group)
        if call.operation == "GetObject" and environ.get("HTTP_RANGE"):  # O(range), not O(object)
            ranged = ranges.ranged_get(environ)
            if ranged is not None:
                return self._send(start_response, ranged)
        terminate = call.operation == "TerminateInstances" and call.protocol == "ec2"
        if call.service == "autoscaling" or terminate:
            with groups.request(_region(environ), call.operation, form):
                try:
                    return self.app(environ, _one_server_header(start_response))
                except KeyError as err:  # moto, on some calls naming a group that is gone
                    if call.service != "autoscaling":
                        raise
                    return self._send(start_response, wire.group_not_found(str(err.args[0])))
                except StopIteration:  # moto, on calls naming an instance that is in no group
                    if call.service != "autoscaling":
                        raise
                    instance = (form.get("InstanceId") or ["?"])[0]
                    return self._send(start_response, wire.instance_not_in_group(instance))
        if call.operation == "CompleteMultipartUpload":  # one at a time: a retry waits for the first
            with self.completing:
                return self.app(environ, _one_server_header(start_response))
        if call.protocol == "ec2" and call.operation in ("DescribeInstances", "DescribeInstanceStatus"):
            with backend.ENDING:  # never an ending's state with the reason before it (``backend.ENDING``)
                return self.app(environ, _one_server_header(start_response))
        return self.app(environ, _one_server_header(start_response))

    def _launch_into(self, environ: dict[str, Any], start_response: Any, region: str, group: str) -> Any:
        """RunInstances into a placement group: moto's answer, its instances recorded as the group's."""
        captured: list[Any] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured[:] = [status, headers, exc_info]
            return lambda data: None

        body = b"".join(self.app(environ, _one_server_header(start)))
        ids = re.findall(r"<instanceId>(i-[0-9a-f]+)</instanceId>", body.decode(errors="replace"))
        placement.put_in_group(region, group, ids)
        start_response(*captured[:2])
        return [body]

    @staticmethod
    def _send(start_response: Any, reply: wire.Reply) -> list[bytes]:
        status, headers, body = reply
        start_response(status, headers)
        return [body]


_REGION = re.compile(r"Credential=[^/,\s]+/\d{8}/([^/]+)/")


def _region(environ: dict[str, Any]) -> str | None:
    """The region a SigV4-signed request is for (its credential scope)."""
    found = _REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
    return found.group(1) if found else None


def _one_server_header(start_response: Any) -> Any:
    """Drop moto's ``Server: amazon.com``: the HTTP server sends its own."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [(k, v) for k, v in headers if k.lower() != "server"], exc_info)

    return start


def _cache_moto_lookups() -> None:
    """Two lookups moto repeats for every request, cached, since what they read does not change while
    the process runs. Its dispatcher asks (under one lock for all requests) whether the host names one
    of moto's packages by listing moto's folder and testing each of its 180 entries for a folder: 0.7 ms
    of CPU per request. Its handlers list their own class's methods with ``inspect.getmembers`` to find
    the action's. Together about a seventh of a describe's server-side CPU."""
    from moto import backends
    from moto.core import responses

    if getattr(backends.list_of_moto_modules, "cached", False):
        return
    modules = frozenset(backends.list_of_moto_modules())

    def listed_modules() -> frozenset[str]:
        return modules

    listed_modules.cached = True  # type: ignore[attr-defined]
    backends.list_of_moto_modules = listed_modules
    responses.method_names_from_class = functools.cache(responses.method_names_from_class)
    _tags_by_resource_id()


# sha256 of inspect.getsource(...) of the moto 5.2.5 code ``_tags_by_resource_id`` stands in for
_TAG_CODE = {
    "TaggedEC2Resource.get_tags": "73ba6daeb7cb331e12f50ef0808a3668d1744ddc368bc7fac962182903edbd5c",
    "TagBackend.describe_tags": "2a65a6b5f69a78e99f5d99277578a75c3416c5db3ef28db20a869e03eff1a03b",
}


def _tags_by_resource_id() -> None:
    """One EC2 resource's tags read from moto's tag table by its id, not by a scan of every tag.

    moto answers ``TaggedEC2Resource.get_tags`` (read several times per instance in every
    DescribeInstances, and per instance for every tag filter) with ``describe_tags`` filtered on the
    resource id: a regular expression matched against every tag of every resource the region ever
    tagged. Terminated instances stay in moto, so over a test session each describe grew with all the
    runs before it (4.6 % of the test workers' CPU in a profile of ``make test``). The answer here is
    the same list in the same order (``describe_tags`` yields a resource's tags in its table's order,
    and its id filter is an exact match: ``fnmatch`` pattern, ids have no wildcard). Applied only to the
    moto code it was checked against (digests above); other versions keep moto's own."""
    from moto.ec2.models import core, tags
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    scan = core.TaggedEC2Resource.get_tags
    if getattr(scan, "by_id", False):
        return
    found = {
        "TaggedEC2Resource.get_tags": bigkeys.source_digest(scan),
        "TagBackend.describe_tags": bigkeys.source_digest(tags.TagBackend.describe_tags),
    }
    if found != _TAG_CODE:
        return

    def get_tags(self: Any) -> list[dict[str, str]]:
        rid = self.id
        if not rid or any(c in rid for c in "*?["):
            return scan(self)
        table = self.ec2_backend.tags.get(rid) or {}
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(rid), "")
        return [
            {"resource_id": rid, "key": k, "value": v, "resource_type": kind} for k, v in list(table.items())
        ]

    get_tags.by_id = True  # type: ignore[attr-defined]
    setattr(core.TaggedEC2Resource, "get_tags", get_tags)  # noqa: B010 (typed as moto's own method)


class MotoServer:
    """moto's WSGI app in a thread on 127.0.0.1 with the middleware above."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        _cache_moto_lookups()
        sqs_receive.one_receive_at_a_time()  # one message never goes to two workers at once
        self.middleware = FaultsAndCounts(DomainDispatcherApplication(create_backend_app), throttle)
        self._serving: InThread | None = None

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:``port`` (0: a free port)."""
        import logging

        from moto.moto_server.werkzeug_app import MotoRequestHandler
        from werkzeug.serving import make_server

        bigkeys.install()  # before any request: big objects on disk, or no start (``MotoChanged``)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request drowns the task log
        handler = keep_alive_handler(MotoRequestHandler)
        server = make_server("127.0.0.1", port, self.middleware, threaded=True, request_handler=handler)
        self._serving = InThread(server, "moto-server")
        return self._serving.endpoint

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.stop()
            self._serving = None

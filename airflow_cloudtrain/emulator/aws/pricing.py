"""What the emulated AWS answers for prices, from the shipped snapshot (``catalog/data/aws.csv``), so a
run's live catalog refresh (``catalog.live.refresh_aws``) succeeds against the emulator and finds the
prices the snapshot has.

- The Price List Query API (``AWSPriceListService.*``, JSON 1.1), which moto lacks: ``GetProducts``
  for ``AmazonEC2`` (one Linux, shared-tenancy, no pre-installed software, ``Used`` product per
  instance type and region of the snapshot, with its on-demand ``OnDemand`` term), ``TERM_MATCH``
  filters on any attribute (case-insensitive, as AWS matches), ``MaxResults`` (1..100, default 100)
  and ``NextToken`` paging; ``DescribeServices``. Another operation is answered as the service
  does not know it.
- EC2 ``DescribeSpotPriceHistory``, whose moto answer is a placeholder price for every type: one
  Linux/UNIX record per zone of the snapshot's row (the first zone at ``SpotMin``, the others at
  ``SpotMax``), stamped when this module was loaded less an hour, then the changes a test made
  (``SpotPrices``, ``Emulator.set_spot_price``), filtered as EC2 filters them: ``InstanceType.N``,
  ``ProductDescription.N``, ``AvailabilityZone``, and ``StartTime``/``EndTime`` (a record counts when
  its price was in effect at some moment of the window: the last one before ``StartTime`` too, which
  is how a caller learns the price at its window's start).
- EC2 ``DescribeInstanceTypeOfferings`` by zone id (``LocationType=availability-zone-id``, what the
  refresh asks): the snapshot's zones of each type, filtered by ``instance-type`` (moto's own list
  differs from the snapshot's, and lacks some types); other location types are moto's.

So an emulated refresh writes the snapshot's rows again (prices, spot prices, zones), and the emulated
world stays the one the snapshot describes.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from functools import cache, lru_cache
from typing import Any
from xml.sax.saxutils import escape

from airflow_cloudtrain.emulator.aws.wire import Reply, _reply

PRODUCT_DESCRIPTION = "Linux/UNIX"
_MAX_RESULTS = 100


@lru_cache(maxsize=1)
def _products() -> tuple[dict[str, Any], ...]:
    from airflow_cloudtrain.catalog.live import AWS_LOCATIONS
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    out = []
    for row in snapshot_rows("aws"):
        if row.price is None:
            continue
        sku = f"EMU{zlib.crc32(f'{row.instance_type} {row.region}'.encode()):012d}"
        term = f"{sku}.JRTCKXETXF"
        out.append(
            {
                "product": {
                    "productFamily": "Compute Instance",
                    "attributes": {
                        "servicecode": "AmazonEC2",
                        "instanceType": row.instance_type,
                        "location": AWS_LOCATIONS.get(row.region, row.region),
                        "regionCode": row.region,
                        "operatingSystem": "Linux",
                        "tenancy": "Shared",
                        "preInstalledSw": "NA",
                        "capacitystatus": "Used",
                        "vcpu": f"{row.vcpus:g}",
                        "memory": f"{row.memory_gib:g} GiB",
                        **({"gpu": str(row.accelerator_count)} if row.accelerator_count else {}),
                    },
                    "sku": sku,
                },
                "serviceCode": "AmazonEC2",
                "terms": {
                    "OnDemand": {
                        term: {
                            "priceDimensions": {
                                f"{term}.6YS6EN2CT7": {
                                    "unit": "Hrs",
                                    "pricePerUnit": {"USD": f"{row.price:.10f}"},
                                    "description": f"${row.price} per On Demand Linux {row.instance_type} Instance Hour",
                                }
                            },
                            "sku": sku,
                            "effectiveDate": "2026-11-01T00:00:00Z",
                        }
                    }
                },
                "version": "20261122000000",
            }
        )
    return tuple(out)


def _json(status: str, body: dict[str, Any]) -> Reply:
    headers = ("x-amzn-RequestId", str(uuid.uuid4()))
    return _reply(status, "application/x-amz-json-1.1", json.dumps(body).encode(), headers)


def _error(kind: str, message: str) -> Reply:
    return _json("400 Bad Request", {"__type": kind, "Message": message})


def pricing(operation: str, body: bytes) -> Reply:
    """The Price List Query API's answer to ``operation`` with this JSON request body."""
    try:
        request = json.loads(body or b"{}")
    except ValueError:
        return _error("InvalidParameterException", "The request body is not JSON.")
    if operation == "DescribeServices":
        return _json(
            "200 OK", {"Services": [{"ServiceCode": "AmazonEC2", "AttributeNames": ["instanceType"]}]}
        )
    if operation != "GetProducts":
        return _error(
            "InvalidParameterException", f"The emulator does not serve {operation} (only GetProducts)."
        )
    try:
        size = int(request.get("MaxResults") or _MAX_RESULTS)
        start = int(request.get("NextToken") or 0)
    except (TypeError, ValueError):
        return _error("InvalidNextTokenException", "Invalid MaxResults or NextToken.")
    if not 1 <= size <= _MAX_RESULTS:
        return _error("InvalidParameterException", f"MaxResults must be 1..{_MAX_RESULTS}.")
    wanted = []
    for f in request.get("Filters") or []:
        if f.get("Type") != "TERM_MATCH":
            return _error("InvalidParameterException", f"Unsupported filter type {f.get('Type')!r}.")
        wanted.append((f.get("Field", ""), str(f.get("Value", "")).lower()))
    found = []
    if request.get("ServiceCode") == "AmazonEC2":
        for product in _products():
            attrs = {k.lower(): str(v).lower() for k, v in product["product"]["attributes"].items()}
            if all(attrs.get(field.lower()) == value for field, value in wanted):
                found.append(product)
    page = found[start : start + size]
    out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
    if start + size < len(found):
        out["NextToken"] = str(start + size)
    return _json("200 OK", out)


def _zone_name(region: str, zone: str) -> str:
    """The zone name in the region for a snapshot zone id, as moto's DescribeAvailabilityZones maps it
    (``use1-az1`` -> ``us-east-1b``), so a price's zone is the zone an instance launched there reports;
    a zone id moto does not know: by its number (``use1-az4`` -> ``us-east-1d``)."""
    name = _moto_zone_names(region).get(zone)
    if name:
        return name
    digits = zone.rsplit("az", 1)[-1]
    return region + chr(ord("a") + int(digits) - 1) if digits.isdigit() else zone


@cache
def _moto_zone_names(region: str) -> dict[str, str]:
    """Zone id -> zone name in ``region``, moto's fixed mapping (empty where moto has none)."""
    from moto.ec2.models.availability_zones_and_regions import RegionsAndZonesBackend

    return {z.zone_id: z.name for z in RegionsAndZonesBackend.zones.get(region, [])}


BASE_PRICES_AT = time.time() - 3600.0  # the snapshot's prices were in effect before anything ran


class SpotPrices:
    """Spot price changes made during a run (``Emulator.set_spot_price``): per (type, zone name), the
    prices in effect from each moment on, after the snapshot's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changes: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def set(self, instance_type: str, zone: str, usd_per_hour: float, at: float | None = None) -> float:
        """From ``at`` (now) on, ``instance_type`` costs ``usd_per_hour`` on spot in ``zone``; returns ``at``."""
        moment = time.time() if at is None else float(at)
        with self.lock:
            points = self.changes.setdefault((instance_type, zone), [])
            points.append((moment, float(usd_per_hour)))
            points.sort()
        return moment

    def of(self, instance_type: str, zone: str) -> list[tuple[float, float]]:
        with self.lock:
            return list(self.changes.get((instance_type, zone), []))


def spot_price_history(
    region: str | None, form: dict[str, list[str]], changes: SpotPrices | None = None
) -> Reply:
    """EC2's DescribeSpotPriceHistory in ``region`` from the snapshot and ``changes`` (module doc)."""
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    region = region or "us-east-1"
    types = {v for k, vs in form.items() if k.startswith("InstanceType.") for v in vs}
    products = {v for k, vs in form.items() if k.startswith("ProductDescription.") for v in vs}
    wanted_zone = next(iter(form.get("AvailabilityZone") or []), None)
    start = _form_time(form, "StartTime")
    end = _form_time(form, "EndTime")
    items = []
    if not products or PRODUCT_DESCRIPTION in products:
        for row in snapshot_rows("aws"):
            if row.region != region or row.spot_min is None or (types and row.instance_type not in types):
                continue
            for i, zone in enumerate(row.zones or (f"{region}a",)):
                name = _zone_name(region, zone)
                if wanted_zone and name != wanted_zone:
                    continue
                price = row.spot_min if i == 0 or row.spot_max is None else row.spot_max
                points = [(BASE_PRICES_AT, price)]
                if changes is not None:
                    points += changes.of(row.instance_type, name)
                for at, usd in _in_window(points, start, end):
                    stamp = (
                        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"
                    )
                    items.append(
                        f"<item><instanceType>{escape(row.instance_type)}</instanceType>"
                        f"<productDescription>{PRODUCT_DESCRIPTION}</productDescription>"
                        f"<spotPrice>{usd:.6f}</spotPrice><timestamp>{stamp}</timestamp>"
                        f"<availabilityZone>{escape(name)}</availabilityZone></item>"
                    )
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DescribeSpotPriceHistoryResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><spotPriceHistorySet>{''.join(items)}</spotPriceHistorySet>"
        "</DescribeSpotPriceHistoryResponse>"
    )
    return _reply("200 OK", "text/xml;charset=UTF-8", body.encode())


def _form_time(form: dict[str, list[str]], name: str) -> float | None:
    """A query timestamp (ISO 8601, as botocore sends it) as unix time."""
    from datetime import datetime, timezone

    raw = next(iter(form.get(name) or []), None)
    if not raw:
        return None
    moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _in_window(
    points: list[tuple[float, float]], start: float | None, end: float | None
) -> list[tuple[float, float]]:
    """The records in effect at some moment of [start, end]: those inside it, and the last before it."""
    ordered = sorted(points)
    if end is not None:
        ordered = [p for p in ordered if p[0] <= end]
    if start is None:
        return ordered
    before = [p for p in ordered if p[0] <= start]
    return before[-1:] + [p for p in ordered if p[0] > start]


def _filter_values(form: dict[str, list[str]], name: str) -> set[str]:
    """The values of EC2 query filter ``name`` (``Filter.N.Name`` / ``Filter.N.Value.M``)."""
    out: set[str] = set()
    for key, values in form.items():
        if key.startswith("Filter.") and key.endswith(".Name") and values == [name]:
            prefix = key[: -len("Name")] + "Value."
            out |= {v for k, vs in form.items() if k.startswith(prefix) for v in vs}
    return out


def wants_zone_offerings(form: dict[str, list[str]]) -> bool:
    return (form.get("LocationType") or [""])[0] == "availability-zone-id"


def zone_offerings(region: str | None, form: dict[str, list[str]]) -> Reply:
    """EC2's DescribeInstanceTypeOfferings by zone id in ``region``, from the snapshot (module doc)."""
    from airflow_cloudtrain.catalog.snapshot import snapshot_rows

    region = region or "us-east-1"
    types = _filter_values(form, "instance-type")
    items = [
        f"<item><instanceType>{escape(row.instance_type)}</instanceType>"
        f"<locationType>availability-zone-id</locationType><location>{escape(zone)}</location></item>"
        for row in snapshot_rows("aws")
        if row.region == region and (not types or row.instance_type in types)
        for zone in row.zones
    ]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<DescribeInstanceTypeOfferingsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><instanceTypeOfferingSet>{''.join(items)}"
        "</instanceTypeOfferingSet></DescribeInstanceTypeOfferingsResponse>"
    )
    return _reply("200 OK", "text/xml;charset=UTF-8", body.encode())

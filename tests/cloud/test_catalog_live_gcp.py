"""Live GCE catalog refresh, over the wire: machineTypes/acceleratorTypes from the GCE emulator through the
real google-cloud-compute clients; the Cloud Billing Catalog from a local HTTP server that answers with
real-shaped ``services.skus.list`` pages, read through google-auth's AuthorizedSession. What a failed or
hanging refresh may cost a run is tested on both clouds in ``test_catalog_refresh.py`` (with the
fixtures of this file)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1

from airflow_cloudtrain.catalog import choose_offer, live, live_gcp, rank_offers
from airflow_cloudtrain.catalog.snapshot import snapshot_rows
from airflow_cloudtrain.clouds.gcp.gce import zones_of
from airflow_cloudtrain.emulator.gcp import gce_validate
from airflow_cloudtrain.emulator.gcp.gce import GceServer, compute_client_kwargs
from airflow_cloudtrain.spec import Hardware

REGION = "us-central1"
AMERICAS = [
    "us-central1",
    "us-east1",
    "us-east4",
    "us-east5",
    "us-south1",
    "us-west1",
    "us-west2",
    "us-west3",
    "us-west4",
    "northamerica-northeast1",
    "northamerica-northeast2",
]

# The rates recorded below, USD per vCPU-hour / GiB-hour / GPU-hour (units + nanos in the JSON).
N1_CORE, N1_RAM, N1_SPOT_CORE, N1_SPOT_RAM = 0.031611, 0.004237, 0.006655, 0.000892
N2_CORE, N2_RAM, N2_SPOT_CORE, N2_SPOT_RAM = 0.031611, 0.004237, 0.007594, 0.001017
T4, T4_SPOT, A100 = 0.35, 0.0875, 2.933908


def _sku(
    sku_id: str,
    description: str,
    group: str,
    usage: str,
    regions: list[str],
    price: float,
    unit: str = "h",
    family: str = "Compute",
) -> dict[str, Any]:
    """One SKU as ``GET /v1/services/6F81-5844-456A/skus`` returns it (units is an int64 string)."""
    units, nanos = int(price), round((price - int(price)) * 1e9)
    ram = unit == "GiBy.h"
    return {
        "name": f"services/6F81-5844-456A/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": family,
            "resourceGroup": group,
            "usageType": usage,
        },
        "serviceRegions": regions,
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "usageUnitDescription": "gibibyte hour"
                    if ram
                    else ("gibibyte month" if "mo" in unit else "hour"),
                    "baseUnit": "By.s" if "By" in unit else "s",
                    "baseUnitDescription": "byte second" if "By" in unit else "second",
                    "baseUnitConversionFactor": 3865470566400 if ram else 3600,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos},
                        }
                    ],
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-11-24T09:14:47.263Z",
            }
        ],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "MULTI_REGIONAL" if len(regions) > 1 else "REGIONAL", "regions": regions},
    }


# Two pages, trimmed to a handful of SKUs each: what must match, and what must not.
PAGES: dict[str, dict[str, Any]] = {
    "": {
        "skus": [
            _sku(
                "A1B4-2C3D-9E0F",
                "Storage PD Capacity",
                "PDStandard",
                "OnDemand",
                [REGION],
                0.04,
                unit="GiBy.mo",
                family="Storage",
            ),
            # same series, another region (and dearer): never for us-central1
            _sku(
                "0E0F-6BBD-5C5A",
                "N1 Predefined Instance Core running in Sao Paulo",
                "N1Standard",
                "OnDemand",
                ["southamerica-east1"],
                0.050229,
            ),
            _sku(
                "2E27-4F75-95CD",
                "N1 Predefined Instance Core running in Americas",
                "N1Standard",
                "OnDemand",
                AMERICAS,
                N1_CORE,
            ),
            _sku(
                "6C71-E844-38BC",
                "N1 Predefined Instance Ram running in Americas",
                "N1Standard",
                "OnDemand",
                AMERICAS,
                N1_RAM,
                unit="GiBy.h",
            ),
            _sku(
                "1425-0532-6B33",
                "Spot Preemptible N1 Predefined Instance Core running in Americas",
                "N1Standard",
                "Preemptible",
                AMERICAS,
                N1_SPOT_CORE,
            ),
            _sku(
                "939B-3A4D-7F3F",
                "Spot Preemptible N1 Predefined Instance Ram running in Americas",
                "N1Standard",
                "Preemptible",
                AMERICAS,
                N1_SPOT_RAM,
                unit="GiBy.h",
            ),
            _sku(
                "7C8B-2E6D-2D6A",
                "Commitment v1: N1 Predefined Instance Core in Americas for 1 Year",
                "CPU",
                "Commit1Yr",
                AMERICAS,
                0.019915,
            ),
            _sku(
                "0039-3C45-6C8B", "Nvidia Tesla T4 GPU running in Americas", "GPU", "OnDemand", AMERICAS, T4
            ),
        ],
        "nextPageToken": "CiQxNDc2LTk0MTQtQkQ1QQ",
    },
    "CiQxNDc2LTk0MTQtQkQ1QQ": {
        "skus": [
            _sku(
                "F449-33EC-A5EF",
                "Spot Preemptible Nvidia Tesla T4 GPU running in Americas",
                "GPU",
                "Preemptible",
                AMERICAS,
                T4_SPOT,
            ),
            _sku(
                "E8B0-1A63-2C7C",
                "Nvidia Tesla T4 Virtual Workstation GPU running in Americas",
                "GPU",
                "OnDemand",
                AMERICAS,
                0.55,
            ),
            _sku(
                "039F-D0DA-4055",
                "Nvidia Tesla A100 GPU running in Americas",
                "GPU",
                "OnDemand",
                AMERICAS,
                A100,
            ),
            _sku(
                "BB77-5FDA-69D9", "N2 Instance Core running in Americas", "CPU", "OnDemand", AMERICAS, N2_CORE
            ),
            _sku(
                "5B01-D157-A097",
                "N2 Instance Ram running in Americas",
                "RAM",
                "OnDemand",
                AMERICAS,
                N2_RAM,
                unit="GiBy.h",
            ),
            _sku(
                "2D9A-2BE3-B6E4",
                "Spot Preemptible N2 Instance Core running in Americas",
                "CPU",
                "Preemptible",
                AMERICAS,
                N2_SPOT_CORE,
            ),
            _sku(
                "8B26-0D1F-7E2A",
                "Spot Preemptible N2 Instance Ram running in Americas",
                "RAM",
                "Preemptible",
                AMERICAS,
                N2_SPOT_RAM,
                unit="GiBy.h",
            ),
            # custom shapes have their own (dearer) SKUs: the catalog derives them from predefined ones
            _sku(
                "D0CC-50DF-59D2",
                "N2 Custom Instance Core running in Americas",
                "CPU",
                "OnDemand",
                AMERICAS,
                0.033191,
            ),
        ],
        "nextPageToken": "",
    },
}


class _Billing(BaseHTTPRequestHandler):
    requests: list[tuple[str, dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        type(self).requests.append((url.path, query))
        page = PAGES.get(query.get("pageToken", [""])[0])
        if url.path.startswith("/broken/"):
            status, body = (
                500,
                {"error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}},
            )
        elif url.path != f"/v1/services/{live_gcp.GCE_SERVICE_ID}/skus" or page is None:
            status, body = 404, {"error": {"code": 404, "message": "Not found", "status": "NOT_FOUND"}}
        else:
            status, body = 200, page
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


# Compute Engine offers N2 in every us-central1 zone; the emulator lists only the snapshot's types
# (no N2), so its inventory gets the predefined N2 shapes for this module.
N2_SHAPES = [(f"n2-standard-{n}", n, 4 * n) for n in (2, 4, 8, 16, 32)] + [
    (f"n2-highmem-{n}", n, 8 * n) for n in (2, 4, 8, 16)
]


@pytest.fixture(scope="module")
def gce() -> Iterator[GceServer]:
    machines = gce_validate.catalog().machines
    added = []
    for zone in zones_of(REGION):
        for name, cpus, gib in N2_SHAPES:
            if name not in machines.setdefault(zone, {}):
                machines[zone][name] = gce_validate.Shape(name, cpus, gib * 1024)
                added.append((zone, name))
    server = GceServer()
    server.start()
    yield server
    server.stop()
    for zone, name in added:
        machines[zone].pop(name, None)


@pytest.fixture(scope="module")
def billing() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Billing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def refresh(gce: GceServer, billing: str, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDTRAIN_CACHE_DIR", str(tmp_path))
    live._memo.clear()
    _Billing.requests.clear()
    kwargs = compute_client_kwargs(gce.endpoint)
    mt, at = compute_v1.MachineTypesClient(**kwargs), compute_v1.AcceleratorTypesClient(**kwargs)
    session = AuthorizedSession(AnonymousCredentials())

    def run(base: str = billing) -> list:
        return live_gcp.refresh_gcp(REGION, mt, at, session, zones_of(REGION), gce.project, billing_url=base)

    yield run
    session.close()
    live._memo.clear()


def test_refresh_prices_machines_and_gpus_from_billing_skus(refresh) -> None:
    rows = refresh()
    machines = {r.instance_type: r for r in rows if r.instance_type}
    gpus = {(r.accelerator, r.accelerator_count): r for r in rows if not r.instance_type}

    n1 = machines["n1-standard-8"]
    assert (n1.vcpus, n1.memory_gib, n1.accelerator, n1.region) == (8.0, 30.0, None, REGION)
    assert n1.price == pytest.approx(8 * N1_CORE + 30 * N1_RAM, abs=1e-6)  # Americas, not Sao Paulo
    assert n1.spot_min == n1.spot_max == pytest.approx(8 * N1_SPOT_CORE + 30 * N1_SPOT_RAM, abs=1e-6)
    assert n1.zones == tuple(zones_of(REGION))

    assert sorted(c for g, c in gpus if g == "T4") == [1, 2, 4]  # powers of two up to maximumCardsPerInstance
    for count in (1, 2, 4):
        t4 = gpus[("T4", count)]
        assert t4.price == pytest.approx(count * T4) and t4.spot_min == pytest.approx(count * T4_SPOT)
        assert not t4.instance_type and t4.zones
    assert gpus[("A100", 16)].price == pytest.approx(16 * A100)  # units "2" + nanos

    n2 = machines["n2-highmem-8"]
    assert n2.price == pytest.approx(8 * N2_CORE + 64 * N2_RAM, abs=1e-6)
    assert n2.spot_min == pytest.approx(8 * N2_SPOT_CORE + 64 * N2_SPOT_RAM, abs=1e-6)

    # No A2 SKU in the sample: its machine rows keep the snapshot's price (as refresh_aws does).
    snap = {(r.instance_type, r.region): r for r in snapshot_rows("gcp")}
    assert machines["a2-highgpu-1g"].price == snap[("a2-highgpu-1g", REGION)].price

    # Both pages were read, in USD.
    assert [q.get("pageToken") for _, q in _Billing.requests] == [None, ["CiQxNDc2LTk0MTQtQkQ1QQ"]]
    assert all(q["currencyCode"] == ["USD"] for _, q in _Billing.requests)

    # The cache now answers for us-central1; the other regions stay on the snapshot.
    current = live.current_rows("gcp")
    assert {r for r in current if r.region == REGION} == set(rows)
    others = [r for r in snapshot_rows("gcp") if r.region != REGION]
    assert [r for r in current if r.region != REGION] == others
    assert (live.cache_dir() / "catalog" / f"gcp-{REGION}.csv").is_file()


def test_n2_rows_make_n2_custom_shapes_priceable(refresh) -> None:
    hw = Hardware(cpus=8, ram="64g")
    before = rank_offers("gcloud", hw, region=REGION, rows=snapshot_rows("gcp"))
    assert not any(o.instance_type.startswith("n2-") for o in before)
    refresh()
    after = rank_offers("gcloud", hw, region=REGION)
    custom = next(o for o in after if o.instance_type.startswith("n2-custom-"))
    assert custom.instance_type == "n2-custom-8-65536" and custom.derived
    assert custom.price == pytest.approx(8 * N2_CORE + 64 * N2_RAM, abs=1e-5)
    assert choose_offer("gcloud", hw, region=REGION).instance_type.startswith("n2-")


def test_failing_billing_endpoint_warns_and_keeps_the_snapshot(refresh, billing: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=live_gcp.__name__):
        assert refresh(f"{billing}/broken") == []
    assert f"Live catalog refresh for gcp/{REGION} failed, using the snapshot" in caplog.text
    assert "500" in caplog.text
    assert live.current_rows("gcp") == snapshot_rows("gcp")
    assert not (live.cache_dir() / "catalog" / f"gcp-{REGION}.csv").exists()


# --- against the emulator, and what a refresh may cost ----------------------------------------------


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_emulators_billing_catalog_gives_the_snapshot_prices(refresh, gce: GceServer, caplog) -> None:
    """The GCE emulator serves ``services.skus.list`` (its ``billing_endpoint``) from the snapshot: the
    refresh succeeds without a warning and finds the snapshot's prices; a second run asks nothing."""
    asked = gce.counts().get("services.skus.list", 0)
    with caplog.at_level(logging.INFO):
        rows = refresh(gce.endpoint)
    assert _warnings(caplog) == []
    assert gce.counts()["services.skus.list"] > asked
    live_rows = {(r.instance_type, r.accelerator, r.accelerator_count): r for r in rows}
    snap = {
        (r.instance_type, r.accelerator, r.accelerator_count): r
        for r in snapshot_rows("gcp")
        if r.region == REGION
    }
    assert set(live_rows) == set(snap)  # no N2 SKU: the emulated catalog stays the snapshot's
    for key, row in snap.items():
        got = live_rows[key]
        assert got.price == pytest.approx(row.price, abs=1e-4), key
        assert got.spot_min == pytest.approx(row.spot_min, abs=1e-4), key

    asked = gce.counts()["services.skus.list"]
    assert refresh(gce.endpoint) == rows  # fresh in the cache
    assert gce.counts()["services.skus.list"] == asked


def test_a_run_against_the_emulator_in_a_users_project_refreshes_without_a_warning(
    emu, tmp_path, monkeypatch, caplog
) -> None:
    from airflow_cloudtrain.clouds.gcp.backend import GcpRunBackend

    monkeypatch.setenv("CLOUDTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(
        "CLOUDTRAIN_CATALOG_BUDGET_S", "300"
    )  # a loaded machine: what it answers, not how fast
    from airflow_cloudtrain.catalog import live_gcp
    from airflow_cloudtrain.emulator import calls

    live._memo.clear()
    calls.take()
    try:
        with caplog.at_level(logging.INFO):
            GcpRunBackend("google_cloud_default", "my-project", "us-east1").refresh_catalog()
        assert _warnings(caplog) == []
        # exactly the calls the permission documents grant every operator that refreshes (catalog_calls)
        made = {(c.service, c.operation) for c in calls.take() if c.side == "airflow"}
        assert made == set(live_gcp.CALLS)
        assert (tmp_path / "catalog" / "gcp-us-east1.csv").is_file()
    finally:
        live._memo.clear()

"""Live catalog refresh: the real boto3 EC2 client against moto's server; Pricing (which moto does not
implement) from a recorded, real-shaped GetProducts response through botocore's Stubber. What a failed or
hanging refresh may cost a run is tested on both clouds in ``test_catalog_refresh.py``."""

from __future__ import annotations

import json
import logging
import os
import time

import boto3
import pytest
from botocore.stub import ANY, Stubber

from airflow_cloudtrain.catalog import choose_offer, live
from airflow_cloudtrain.catalog.snapshot import snapshot_rows
from airflow_cloudtrain.spec import Hardware


def _product(instance_type: str, usd: str) -> str:
    """One PriceList entry as the Pricing API returns it (a JSON string), trimmed to what we read."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "location": "US West (Oregon)",
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                },
                "sku": "ABCDEFGH12345678",
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    "ABCDEFGH12345678.JRTCKXETXF": {
                        "priceDimensions": {
                            "ABCDEFGH12345678.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                                "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                            }
                        },
                        "sku": "ABCDEFGH12345678",
                        "effectiveDate": "2026-11-01T00:00:00Z",
                    }
                }
            },
            "version": "20261101000000",
        }
    )


@pytest.fixture()
def clients(moto_endpoint: str, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDTRAIN_CACHE_DIR", str(tmp_path))
    # what moto answers is checked, not how fast: on a loaded machine its first answers can take longer
    # than the 10 s default budget (the budget has its own test, in test_catalog_refresh.py)
    monkeypatch.setenv("CLOUDTRAIN_CATALOG_BUDGET_S", "300")
    live._memo.clear()
    kw = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    ec2 = boto3.client("ec2", region_name="us-west-2", endpoint_url=moto_endpoint, **kw)
    pricing = boto3.client("pricing", region_name="us-east-1", **kw)
    yield ec2, pricing
    live._memo.clear()


def test_refresh_uses_live_prices_and_caches_them(clients) -> None:
    ec2, pricing = clients
    stub = Stubber(pricing)
    page = {
        "PriceList": [_product("g4dn.2xlarge", "0.0100000000"), _product("t3.micro", "0.0104000000")],
        "FormatVersion": "aws_v1",
    }
    stub.add_response("get_products", page, {"ServiceCode": "AmazonEC2", "Filters": ANY, "MaxResults": 100})
    with stub:
        rows = live.refresh_aws("us-west-2", ec2, pricing)
    stub.assert_no_pending_responses()
    by_type = {r.instance_type: r for r in rows}
    assert by_type["g4dn.2xlarge"].price == 0.01  # from Pricing
    assert by_type["g4dn.2xlarge"].vcpus == 8 and by_type["g4dn.2xlarge"].accelerator == "T4"  # from moto
    assert by_type["g4dn.2xlarge"].spot_min == pytest.approx(0.00001)  # moto's spot price history
    assert by_type["g4dn.2xlarge"].zones  # DescribeInstanceTypeOfferings
    # Live rows now win over the snapshot for us-west-2, on-demand and spot alike.
    offer = choose_offer("ec2", Hardware(cpus=8, gpus=1, ram="32g"), region="us-west-2")
    assert (offer.instance_type, offer.price) == ("g4dn.2xlarge", 0.01)
    assert list((live.cache_dir() / "catalog").glob("aws-us-west-2.csv"))


def test_stale_cache_is_ignored(clients, monkeypatch) -> None:
    ec2, _ = clients
    live.refresh_aws("us-west-2", ec2, None)
    path = live.cache_dir() / "catalog" / "aws-us-west-2.csv"
    old = time.time() - live.DEFAULT_TTL_S - 60
    os.utime(path, (old, old))
    live._memo.clear()
    snap = {(r.instance_type, r.region): r for r in snapshot_rows("aws")}
    offer = choose_offer("ec2spot", Hardware(cpus=8, gpus=1, ram="32g"), region="us-west-2")
    assert offer.spot_price == snap[(offer.instance_type, "us-west-2")].spot_min


def test_failed_refresh_warns_and_keeps_snapshot(clients, caplog) -> None:
    ec2, pricing = clients
    stub = Stubber(pricing)
    stub.add_client_error("get_products", service_error_code="ThrottlingException", http_status_code=400)
    with stub, caplog.at_level(logging.WARNING):
        assert live.refresh_aws("us-west-2", ec2, pricing) == []
    assert "Live catalog refresh for aws/us-west-2 failed, using the snapshot" in caplog.text
    assert live.current_rows("aws") == snapshot_rows("aws")


# --- against the emulator, and what a refresh may cost ----------------------------------------------


@pytest.fixture()
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDTRAIN_CACHE_DIR", str(tmp_path))
    live._memo.clear()
    yield tmp_path / "catalog"
    live._memo.clear()


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_run_against_the_emulator_refreshes_to_the_snapshot_prices_without_a_warning(
    emu, own_cache, caplog, monkeypatch
) -> None:
    """The emulator serves Pricing GetProducts, spot price history and zone offerings from the snapshot:
    the refresh a run makes (its backend's) succeeds, warns about nothing, and finds the snapshot's
    prices; a second run finds the cache fresh and asks nothing."""
    # what is checked is what the emulator answers, not how fast: a loaded machine may take longer than
    # the 10 s default budget (the budget has its own test below)
    monkeypatch.setenv("CLOUDTRAIN_CATALOG_BUDGET_S", "300")
    from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend
    from airflow_cloudtrain.emulator import calls

    before = emu.request_counts()
    calls.take()
    with caplog.at_level(logging.INFO):
        AwsRunBackend("aws_default", "us-west-2").refresh_catalog()
    assert _warnings(caplog) == []
    # exactly the calls the permission documents grant every operator that refreshes (catalog_calls)
    assert {(c.service, c.operation) for c in calls.take() if c.side == "airflow"} == set(live.CALLS)
    counts = emu.request_counts()
    for op in ("GetProducts", "DescribeSpotPriceHistory", "DescribeInstanceTypes"):
        assert counts.get(op, 0) > before.get(op, 0), op
    assert (own_cache / "aws-us-west-2.csv").is_file()
    live._memo.clear()
    fresh = {r for r in live.current_rows("aws") if r.region == "us-west-2"}
    assert fresh == {r for r in snapshot_rows("aws") if r.region == "us-west-2"}

    AwsRunBackend("aws_default", "us-west-2").refresh_catalog()
    assert emu.request_counts().get("GetProducts") == counts["GetProducts"]  # the cache answered

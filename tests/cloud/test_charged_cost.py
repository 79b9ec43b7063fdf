"""A run's ``cost_usd`` is what the cloud charged: an EC2 spot instance at its zone's spot price history
over its lifetime (the price doubles halfway through the run here), a GCE Spot VM at the Billing
catalog's Spot SKU price; each with its root volume; the ``cost_basis`` says which prices were used.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from dag_helpers import task_states, xcom
from test_runs import REGION, launched, scenario
from waiting import wait_for

from airflow_cloudtrain.catalog.volumes import root_volume_price

JOB = """
import pathlib, sys, time
flags = pathlib.Path(sys.argv[1])
(flags / "halfway").write_text("x")
print("halfway", flush=True)
while not (flags / "go").exists():
    time.sleep(0.1)
print("done", flush=True)
"""


def job(tmp_path: Path) -> str:
    script = tmp_path / "halfway.py"
    script.write_text(JOB)
    return f"exec {sys.executable} {script} {tmp_path}"


def spot_price_now(instance_type: str, zone: str) -> float:
    """What DescribeSpotPriceHistory says the price is now (as a user would look it up)."""
    ec2 = boto3.client("ec2", region_name=REGION["aws"])
    now = datetime.now(timezone.utc)
    records = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type],
        ProductDescriptions=["Linux/UNIX"],
        AvailabilityZone=zone,
        StartTime=now,
        EndTime=now,
    )["SpotPriceHistory"]
    return float(max(records, key=lambda r: r["Timestamp"])["SpotPrice"])


def billed_s(duration: float) -> float:
    return max(60.0, float(math.ceil(duration)))


def test_ec2_spot_cost_follows_the_price_history(emu: Any, airflow_db: Any, tmp_path: Path) -> None:
    changed: dict[str, Any] = {}

    def double_halfway() -> None:
        wait_for(lambda: (tmp_path / "halfway").exists() and emu.running_instances(), timeout=300)
        (inst,) = [i for i in emu.running_instances() if i["cloud"] == "aws"]
        base = spot_price_now(inst["instance_type"], inst["zone"])
        changed.update(base=base, at=emu.set_spot_price(inst["instance_type"], inst["zone"], 2 * base))
        (tmp_path / "go").write_text("x")

    helper = threading.Thread(target=double_halfway, daemon=True)
    helper.start()
    run = scenario("charged_ec2", "aws", job(tmp_path)).test()
    helper.join(timeout=60)
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    assert changed, "the price never changed: the job did not run"
    start, billed = float(result["launched_at"]), billed_s(result["duration_s"])
    base, at = changed["base"], changed["at"]
    assert start < at < start + billed  # the change fell inside the billed lifetime
    compute = (base * (at - start) + 2 * base * (start + billed - at)) / 3600.0
    disk = 50 * root_volume_price("aws", REGION["aws"]) * billed / (730 * 3600.0)
    assert result["cost_usd"] == pytest.approx(compute + disk, rel=0.01)
    flat = base * billed / 3600.0 + disk  # the launch price alone: what the cost was before
    assert abs(result["cost_usd"] - flat) > 0.05 * flat
    assert "EC2 spot price history" in result["cost_basis"] and "root volume" in result["cost_basis"]
    assert launched("aws", "charged_ec2", run) == [result["instance_id"]]


def test_gce_spot_cost_from_the_billing_catalog(emu: Any, airflow_db: Any, tmp_path: Path) -> None:
    (tmp_path / "go").write_text("x")  # no waiting halfway
    run = scenario("charged_gce", "gcp", job(tmp_path)).test()
    assert task_states(run) == {"train": "success"}
    result = xcom(run, "train")
    from airflow_cloudtrain.catalog import rank_offers
    from airflow_cloudtrain.spec import Hardware

    offer = rank_offers("gcspot", Hardware(2, 0, "4g"), region=REGION["gcp"])[0]  # the scenario's cpus, ram
    assert offer.instance_type == result["instance_type"] and offer.spot_price is not None
    billed = billed_s(result["duration_s"])
    disk = 50 * root_volume_price("gcp", REGION["gcp"]) * billed / (730 * 3600.0)
    assert result["cost_usd"] == pytest.approx(offer.spot_price * billed / 3600.0 + disk, rel=0.01)
    assert "GCE Spot SKU prices (Cloud Billing Catalog)" in result["cost_basis"]
    assert launched("gcp", "charged_gce", run) == [result["instance_id"]]


def test_cloudtrain_costs_adds_up_what_the_runs_cost(
    emu: Any, airflow_db: Any, tmp_path: Path, capsys: Any
) -> None:
    import json as jsonlib

    from test_runs import BUCKET

    from airflow_cloudtrain.cli import main

    costs = {}
    for dag_id in ("costs_a", "costs_b"):
        run = scenario(dag_id, "aws", "echo trained").test()
        assert task_states(run) == {"train": "success"}
        costs[dag_id] = xcom(run, "train")["cost_usd"]
    capsys.readouterr()
    assert main(["costs", "--bucket", BUCKET["aws"], "--by", "dag", "--json"]) == 0
    report = jsonlib.loads(capsys.readouterr().out)
    rows = {row["dag"]: row for row in report["rows"]}
    for dag_id, cost in costs.items():  # other tests of this session may have runs in the bucket too
        assert rows[dag_id]["cost_usd"] == pytest.approx(cost, abs=1e-6)
        assert rows[dag_id]["runs"] == rows[dag_id]["attempts"] == 1
    assert report["total"]["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in report["rows"]), abs=1e-5)
    assert main(["costs", "--bucket", BUCKET["aws"], "--by", "day", "--since", "1d"]) == 0
    table = capsys.readouterr().out
    assert "TOTAL" in table and time_day() in table
    assert main(["costs", "--bucket", BUCKET["aws"], "--by", "cloud", "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "cloud,runs,attempts,interruptions,cost_usd"
    # one DAG's runs, per ISO week: that DAG's cost alone
    assert main(["costs", "--bucket", BUCKET["aws"], "--by", "week", "--dag", "costs_a", "--json"]) == 0
    week = jsonlib.loads(capsys.readouterr().out)
    assert week["total"]["cost_usd"] == pytest.approx(costs["costs_a"], abs=1e-6)
    assert [row["week"] for row in week["rows"]] == [time.strftime("%G-W%V", time.gmtime())]
    assert main(["costs", "--bucket", BUCKET["aws"], "--dag", "costs_a", "--state", "failed", "--json"]) == 0
    assert jsonlib.loads(capsys.readouterr().out)["total"]["runs"] == 0  # it succeeded


def time_day() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())

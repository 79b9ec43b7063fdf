"""What a Vertex AI training cluster's machines cost, from the catalog's Compute Engine snapshot.

Vertex AI bills custom training at its own per-machine rates, which are the Compute Engine list
price of the machine and its accelerators plus a training charge that the snapshot does not hold.
So the numbers here are an *estimate*, a floor on the bill, and say so: good enough to compare
clusters and to notice that PREMIUM_1 is thirty-one machines, not to reconcile an invoice.

Prices only: a job's cost (replicas x run time, through ``core.billing.billed_usd`` like every other
engine's) is ``lifecycle.vertex.cost.estimate_cost``, a floor above the billing function.
"""

from __future__ import annotations

from airflow_cloudtrain.catalog.gce import family_rates
from airflow_cloudtrain.catalog.snapshot import Row, snapshot_rows
from airflow_cloudtrain.mlengine.accelerators import ACCELERATORS
from airflow_cloudtrain.mlengine.machines import N1_GIB_PER_VCPU, MachineSpec, series_of


def _price(row: Row | None, spot: bool) -> float | None:
    if row is None:
        return None
    return row.spot_min if spot else row.price


def _machine_price(rows: tuple[Row, ...], machine_type: str, region: str, spot: bool) -> float | None:
    """The machine alone: its snapshot row, or for n1-highcpu-N (absent from the snapshot) the
    N1 family's least-squares per-vCPU and per-GiB rates times N vCPUs and 0.9 N GiB."""
    prices = [
        p
        for r in rows
        if r.instance_type == machine_type and r.region == region and (p := _price(r, spot)) is not None
    ]
    if prices:
        return min(prices)
    series = series_of(machine_type)
    if series is None or series[0] != "n1-highcpu":
        return None
    rates = family_rates(rows).get(("N1", region))
    if rates is None:
        return None
    vcpu, gib = (rates.spot_vcpu, rates.spot_gib) if spot else (rates.vcpu, rates.gib)
    if vcpu is None or gib is None:
        return None
    n = series[1]
    return round(vcpu * n + gib * N1_GIB_PER_VCPU["n1-highcpu"] * n, 6)


def _accelerator_price(rows: tuple[Row, ...], machine: MachineSpec, region: str, spot: bool) -> float | None:
    """Accelerators are their own snapshot rows (no machine type), priced per (model, count,
    region); ``catalog.gce.predefined_offers`` adds them to N1 and to A2/G2/A3 machine rows alike."""
    name = ACCELERATORS.get(machine.accelerator_type or "")
    if name is None:
        return None
    prices = [
        p
        for r in rows
        if not r.instance_type
        and r.accelerator == name
        and r.accelerator_count == machine.accelerator_count
        and r.region == region
        and (p := _price(r, spot)) is not None
    ]
    return min(prices) if prices else None


def hourly_price(machine: MachineSpec, region: str, spot: bool = False) -> float | None:
    """USD per replica-hour (machine + its accelerators) from the catalog snapshot, Spot = the
    row's SpotMin; None when the snapshot cannot price it (TPUs, a region or type it lacks)."""
    rows = snapshot_rows("gcp")
    base = _machine_price(rows, machine.machine_type, region, spot)
    if base is None or not machine.accelerator_type:
        return base
    extra = _accelerator_price(rows, machine, region, spot)
    return None if extra is None else round(base + extra, 6)

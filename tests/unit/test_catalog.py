"""choose_offer / rank_offers against brute-force scans of the shipped snapshot, and the GCE rules."""

from __future__ import annotations

import itertools
import warnings

import pytest

from airflow_cloudtrain.catalog import NoOfferError, Offer, choose_offer, rank_offers
from airflow_cloudtrain.catalog import select as select_mod
from airflow_cloudtrain.catalog.gce import CUSTOM_FAMILIES, bundled_gpus, custom_shape
from airflow_cloudtrain.catalog.snapshot import snapshot_rows
from airflow_cloudtrain.spec import Bid, Hardware

AWS = snapshot_rows("aws")
GCP = snapshot_rows("gcp")


def brute_force_aws(
    spot: bool, cpus: int, gpus: int, ram_gib: float, region: str | None = None, bid: Bid | None = None
) -> tuple[float, str, str]:
    """Independent scan of the raw rows: the cheapest (price, type, region) that satisfies."""
    best = None
    for r in AWS:
        price = r.spot_min if spot else r.price
        if price is None or r.vcpus < cpus or r.accelerator_count < gpus or r.memory_gib < ram_gib:
            continue
        if region and r.region != region:
            continue
        if bid is not None and (
            r.price is None and bid.percent is not None or price > bid.max_price(r.price)
        ):
            continue
        if best is None or price < best[0]:
            best = (price, r.instance_type, r.region)
    assert best is not None
    return best


def test_plan_example_matches_brute_force() -> None:
    offer = choose_offer("ec2", Hardware(cpus=8, gpus=1, ram="32g"))
    price, itype, _ = brute_force_aws(False, 8, 1, 32)
    assert (offer.price, offer.instance_type) == (price, itype)
    assert offer.vcpus >= 8 and offer.gpus >= 1 and offer.memory_gib >= 32


@pytest.mark.parametrize(
    ("spot", "cpus", "gpus", "ram", "region", "bid"),
    [
        (spot, cpus, gpus, ram, region, bid)
        for spot, (cpus, gpus, ram), region, bid in itertools.product(
            (False, True),
            [(1, 0, 1), (2, 0, 8), (16, 0, 128), (8, 1, 32), (4, 4, 64), (48, 8, 700), (96, 0, 384)],
            (None, "us-west-2", "eu-west-1"),
            (None, "60%", "2.5"),
        )
        if spot or bid is None
    ],
)
def test_aws_cheapest_matches_brute_force(
    spot: bool, cpus: int, gpus: int, ram: int, region: str | None, bid: str | None
) -> None:
    cloud = "ec2spot" if spot else "ec2"
    b = Bid(bid) if bid else None
    try:
        expected = brute_force_aws(spot, cpus, gpus, ram, region, b)
    except AssertionError:
        with pytest.raises(NoOfferError):
            choose_offer(cloud, Hardware(cpus, gpus, f"{ram}g"), region=region, bid=b)
        return
    offer = choose_offer(cloud, Hardware(cpus, gpus, f"{ram}g"), region=region, bid=b)
    assert offer.hourly == expected[0]
    assert offer.cloud == cloud


def test_rank_is_sorted_and_all_fit() -> None:
    hw = Hardware(cpus=4, ram="16g")
    ranked = rank_offers("ec2spot", hw)
    prices = [o.spot_price for o in ranked]
    assert prices == sorted(prices) and len(ranked) > 20
    assert all(o.vcpus >= 4 and o.memory_gib >= 16 for o in ranked)
    fitting_rows = [r for r in AWS if r.vcpus >= 4 and r.memory_gib >= 16 and r.spot_min is not None]
    assert len(ranked) == len(fitting_rows)


def test_exclude_moves_to_next_offer() -> None:
    hw = Hardware(cpus=8, gpus=1, ram="32g")
    first, second = rank_offers("ec2", hw)[:2]
    assert choose_offer("ec2", hw, exclude=[first.instance_type]).instance_type != first.instance_type
    assert choose_offer("ec2", hw, exclude=[f"{first.instance_type}@{first.region}"]) == second


def test_bid_filters_offers_above_it() -> None:
    hw = Hardware(cpus=8, gpus=1, ram="32g")
    everything = rank_offers("ec2spot", hw)
    cap = round((everything[0].spot_price + everything[3].spot_price) / 2, 4)
    within = rank_offers("ec2spot", hw, bid=str(cap))
    assert within == [o for o in everything if o.spot_price <= cap]
    assert 1 <= len(within) < len(everything)
    with pytest.raises(NoOfferError, match=r"spot price within bid=\$0.01"):
        choose_offer("ec2spot", hw, bid="0.01")


def test_ec2_nothing_fits_names_largest_offers() -> None:
    with pytest.raises(NoOfferError) as err:
        choose_offer("ec2", Hardware(cpus=500))
    msg = str(err.value)
    assert "500 vCPUs" in msg and "Largest offers" in msg and "p5en.48xlarge (192 vCPUs" in msg
    with pytest.raises(NoOfferError, match="gpu_type='K80' is not offered; known: .*A10G"):
        choose_offer("ec2", Hardware(gpus=1, gpu_type="K80"))


def test_zone_implies_region() -> None:
    assert choose_offer("ec2", Hardware(), zone="eu-west-1b").region == "eu-west-1"
    assert choose_offer("gcloud", Hardware(), zone="us-east1-c").region == "us-east1"
    assert "us-east1-c" in choose_offer("gcloud", Hardware(), zone="us-east1-c").zones


# --- GCE ------------------------------------------------------------------------------------------


def test_custom_shapes_stay_in_family_range() -> None:
    for fam in CUSTOM_FAMILIES:
        for cpus in (1, 2, 3, 7, 8, 31, 33, 64):
            for ram_gib in (None, 0.25, 1, 4, 16, 64, 300, 600):
                shape = custom_shape(fam, cpus, None if ram_gib is None else int(ram_gib * 1024))
                if shape is None:
                    continue
                n, mib = shape
                assert fam.valid_vcpus(n) and n >= cpus and mib % 256 == 0
                assert fam.min_gib_per_vcpu <= mib / 1024 / n <= fam.max_gib_per_vcpu, (fam.name, n, mib)
                if ram_gib:
                    assert mib >= ram_gib * 1024


def test_gce_memory_heavy_request_adds_vcpus_instead_of_extended_memory() -> None:
    offer = choose_offer("gcloud", Hardware(cpus=2, ram="64g"), region="us-central1")
    assert offer.memory_gib >= 64
    assert offer.memory_gib / offer.vcpus <= 6.5


def test_gce_custom_offer_is_derived_and_cheaper_than_overprovisioning() -> None:
    offer = choose_offer("gcloud", Hardware(cpus=8, ram="32g"), region="us-central1")
    assert offer.instance_type == "custom-8-32768" and offer.derived
    n1_std_8 = next(r for r in GCP if r.instance_type == "n1-standard-8" and r.region == "us-central1")
    n1_hm_8 = next(r for r in GCP if r.instance_type == "n1-highmem-8" and r.region == "us-central1")
    # interpolated between the two predefined shapes it is derived from
    assert n1_std_8.price < offer.price < n1_hm_8.price


def test_gce_gpus_only_on_families_that_take_them() -> None:
    for cloud in ("gcloud", "gcspot"):
        for o in rank_offers(cloud, Hardware(cpus=4, gpus=1)):
            family = o.instance_type.split("-")[0]
            if o.attach_gpus:
                assert o.gpu_type in {"T4", "V100", "P100", "P4"}
                assert family in {"n1", "custom"}
            else:
                assert bundled_gpus(o.instance_type) == (o.gpu_type, o.gpus)
    l4 = choose_offer("gcloud", Hardware(gpus=1, gpu_type="L4"))
    assert l4.instance_type.startswith("g2-") and not l4.attach_gpus
    a100 = choose_offer("gcloud", Hardware(gpus=2, gpu_type="A100"))
    assert a100.instance_type == "a2-highgpu-2g"
    v100 = choose_offer("gcloud", Hardware(cpus=16, gpus=1, gpu_type="V100"), region="us-central1")
    assert v100.gpus == 2  # one V100 allows at most 12 vCPUs on N1


def test_gce_bundled_gpu_price_includes_accelerators() -> None:
    a2 = choose_offer("gcloud", Hardware(gpus=1, gpu_type="A100"), region="us-central1")
    host = next(r for r in GCP if r.instance_type == "a2-highgpu-1g" and r.region == "us-central1")
    gpu = next(
        r for r in GCP if r.accelerator == "A100" and r.accelerator_count == 1 and r.region == "us-central1"
    )
    assert a2.price == pytest.approx(host.price + gpu.price)


def test_gce_request_no_family_can_serve_says_why() -> None:
    with pytest.raises(NoOfferError) as err:
        choose_offer("gcloud", Hardware(cpus=8, ram="4000g"))
    msg = str(err.value)
    assert "No GCE family can serve it" in msg and "0.9-6.5 GiB per vCPU" in msg and "Largest offers" in msg
    with pytest.raises(NoOfferError, match="Largest offers"):
        choose_offer("gcspot", Hardware(gpus=16))


def test_gcspot_bid_has_no_effect_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select_mod, "_warned_gcspot_bid", False)
    hw = Hardware(cpus=4)
    with pytest.warns(UserWarning, match="no effect on cloud='gcspot'"):
        with_bid = choose_offer("gcspot", hw, bid="0.0001")
    assert with_bid == choose_offer("gcspot", hw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choose_offer("gcspot", hw, bid="50%")


def test_offer_record_attributes() -> None:
    o = choose_offer("ec2spot", Hardware(cpus=2))
    assert isinstance(o, Offer)
    for name in (
        "cloud",
        "instance_type",
        "vcpus",
        "memory_gib",
        "gpus",
        "gpu_type",
        "region",
        "zones",
        "price",
        "spot_price",
    ):
        assert hasattr(o, name)
    assert o.to_dict()["zones"] == list(o.zones)

"""Hardware and Bid parsing: every accepted form and every rejected input of the foundation issue."""

from __future__ import annotations

import warnings

import pytest

from airflow_cloudtrain.spec import Bid, Hardware, parse_cloud


@pytest.mark.parametrize(
    ("ram", "mib"),
    [
        (1000, 1024),
        (512, 512),
        (513, 768),
        ("16g", 16384),
        ("16G", 16384),
        ("16Gb", 16384),
        ("16GB", 16384),
        ("16GiB", 16384),
        ("512m", 512),
        ("512M", 512),
        ("512MB", 512),
        ("512MiB", 512),
        ("1.5g", 1536),
        ("1.5GiB", 1536),
        ("600m", 768),
        ("1.1g", 1280),
        ("3000", 3072),
    ],
)
def test_ram_forms_and_256_mib_rounding(ram: object, mib: int) -> None:
    assert Hardware(ram=ram).ram_mib == mib


@pytest.mark.parametrize(
    ("hdd", "gib"), [(200, 200), ("200g", 200), ("1.5GiB", 2), ("512m", 1), ("100", 100)]
)
def test_hdd_forms_in_gib(hdd: object, gib: int) -> None:
    assert Hardware(hdd=hdd).hdd_gib == gib


@pytest.mark.parametrize("ram", ["abc", "-1g", "0", "12q", "", 0, -5, True, "1.5.2g"])
def test_bad_ram_names_field_value_and_forms(ram: object) -> None:
    with pytest.raises(ValueError) as err:
        Hardware(ram=ram)
    msg = str(err.value)
    assert msg.startswith(f"ram={ram!r}")
    assert "'16g'" in msg and "GiB" in msg


@pytest.mark.parametrize("cpus", [0, -2, "many", 1.5, "", None])
def test_bad_cpus(cpus: object) -> None:
    with pytest.raises(ValueError, match=r"^cpus=.*whole number >= 1"):
        Hardware(cpus=cpus)


def test_bad_gpus_and_hdd() -> None:
    with pytest.raises(ValueError, match=r"^gpus=-1 .*whole number >= 0"):
        Hardware(gpus=-1)
    with pytest.raises(ValueError, match=r"^hdd='tiny' .*'16g'"):
        Hardware(hdd="tiny")


def test_hardware_attributes_and_string_counts_from_ui_params() -> None:
    hw = Hardware(cpus="8", gpus="1", ram="30g", hdd="100g", gpu_type="a10g")
    assert (hw.cpus, hw.gpus, hw.gpu_type, hw.ram_mib, hw.hdd_gib) == (8, 1, "A10G", 30720, 100)
    assert Hardware().to_dict() == {"cpus": 1, "gpus": 0, "gpu_type": None, "ram_mib": None, "hdd_gib": None}
    assert Hardware(gpu_type="T4").gpus == 1


@pytest.mark.parametrize(
    ("value", "usd"), [("0.45", 0.45), (0.45, 0.45), ("$0.45", 0.45), (2, 2.0), (" $1.5 ", 1.5)]
)
def test_bid_usd(value: object, usd: float) -> None:
    bid = Bid(value)
    assert bid.usd == usd and bid.percent is None
    assert bid.max_price(10.0) == usd


def test_bid_percent_is_of_on_demand() -> None:
    bid = Bid("60%")
    assert bid.percent == 60 and bid.usd is None
    assert bid.max_price(3.06) == pytest.approx(1.836)
    with pytest.raises(ValueError, match="no on-demand price"):
        bid.max_price(None)


def test_bid_above_100_percent_warns_but_is_allowed() -> None:
    with pytest.warns(UserWarning, match="above 100% of on-demand"):
        bid = Bid("150%")
    assert bid.max_price(1.0) == 1.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Bid("100%")


@pytest.mark.parametrize("value", ["", "abc", "-5", "0%", 0, -1, "60%%", "$", None, True])
def test_bad_bids(value: object) -> None:
    with pytest.raises(ValueError) as err:
        Bid(value)
    assert str(err.value).startswith(f"bid={value!r}")
    assert "'60%'" in str(err.value) and "USD" in str(err.value)


def test_cloud_names() -> None:
    assert [parse_cloud(c) for c in ("ec2", "EC2spot", "gcloud", "gcspot")] == [
        "ec2",
        "ec2spot",
        "gcloud",
        "gcspot",
    ]
    with pytest.raises(
        ValueError, match=r"cloud='azure' is not supported: use one of ec2, ec2spot, gcloud, gcspot"
    ):
        parse_cloud("azure")

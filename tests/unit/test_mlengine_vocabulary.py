"""ML Engine vocabulary -> Vertex AI worker pools: tiers, machine names, parse-time rules, prices.

The expected tables here are written out independently of ``airflow_cloudtrain.mlengine`` (from
ML Engine's and AI Platform Training's published tables), so a slip in the package's data shows.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_cloudtrain.catalog.snapshot import snapshot_rows
from airflow_cloudtrain.core.billing import VERTEX_MINIMUM_S, billed_usd
from airflow_cloudtrain.lifecycle.vertex.cost import estimate_cost
from airflow_cloudtrain.mlengine import (
    K80_REPLACEMENT_NOTE,
    LEGACY_MACHINES,
    ROLES,
    SCALE_TIERS,
    MachineSpec,
    ReplicaPool,
    hourly_price,
    parse_accelerator,
    resolve_pools,
    worker_pool_specs,
)

T4, V100, P100, P4 = "NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4"
REGION = "us-central1"

LEGACY = {
    "standard": MachineSpec("n1-standard-4"),
    "large_model": MachineSpec("n1-highmem-8"),
    "complex_model_s": MachineSpec("n1-highcpu-8"),
    "complex_model_m": MachineSpec("n1-highcpu-16"),
    "complex_model_l": MachineSpec("n1-highcpu-32"),
    "standard_gpu": MachineSpec("n1-standard-8", T4, 1),
    "complex_model_m_gpu": MachineSpec("n1-standard-16", T4, 4),
    "complex_model_l_gpu": MachineSpec("n1-standard-32", T4, 4),
    "standard_p100": MachineSpec("n1-standard-8", P100, 1),
    "complex_model_m_p100": MachineSpec("n1-standard-16", P100, 4),
    "standard_v100": MachineSpec("n1-standard-8", V100, 1),
    "large_model_v100": MachineSpec("n1-highmem-8", V100, 1),
    "complex_model_m_v100": MachineSpec("n1-standard-16", V100, 4),
    "complex_model_l_v100": MachineSpec("n1-standard-32", V100, 8),
}

TIERS = {
    "BASIC": [("chief", "standard", 1)],
    "STANDARD_1": [
        ("chief", "complex_model_s", 1),
        ("worker", "complex_model_s", 4),
        ("parameter_server", "standard", 3),
    ],
    "PREMIUM_1": [
        ("chief", "complex_model_l", 1),
        ("worker", "complex_model_m", 19),
        ("parameter_server", "large_model", 11),
    ],
    "BASIC_GPU": [("chief", "standard_gpu", 1)],
}

# Max vCPUs of an N1 machine per (GPU, count), from Compute Engine's GPU documentation.
N1_MAX_VCPUS = {
    T4: {1: 48, 2: 48, 4: 96},
    P4: {1: 24, 2: 48, 4: 96},
    P100: {1: 16, 2: 32, 4: 96},
    V100: {1: 12, 2: 24, 4: 48, 8: 96},
}
N1_SIZES = {
    "n1-standard": (1, 2, 4, 8, 16, 32, 64, 96),
    "n1-highmem": (2, 4, 8, 16, 32, 64, 96),
    "n1-highcpu": (2, 4, 8, 16, 32, 64, 96),
}


def custom(**kw: object) -> list[ReplicaPool]:
    return resolve_pools("CUSTOM", **kw)


def error(**kw: object) -> str:
    with pytest.raises(ValueError) as exc:
        resolve_pools(**kw)
    return str(exc.value)


# --- scale tiers -----------------------------------------------------------------------------


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_tier_maps_to_its_pools(tier: str) -> None:
    pools = resolve_pools(tier)
    assert [(p.role, p.machine, p.count, p.requested) for p in pools] == [
        (role, LEGACY[name], count, name) for role, name, count in TIERS[tier]
    ]
    assert [p.index for p in pools] == sorted(p.index for p in pools)


def test_basic_tpu_is_a_chief_and_one_tpu_worker() -> None:
    chief, worker = resolve_pools("BASIC_TPU")
    assert (chief.role, chief.machine, chief.count) == ("chief", MachineSpec("n1-standard-4"), 1)
    assert (worker.role, worker.machine, worker.count) == ("worker", MachineSpec("cloud-tpu", "TPU_V2", 8), 1)


def test_tier_table_covers_every_tier_and_default_is_basic_gpu() -> None:
    assert set(SCALE_TIERS) == {*TIERS, "BASIC_TPU", "CUSTOM"}
    assert resolve_pools() == resolve_pools("BASIC_GPU")
    assert resolve_pools(" basic_gpu ") == resolve_pools("BASIC_GPU")
    assert resolve_pools("Standard_1") == resolve_pools("STANDARD_1")


# --- machine names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_name_maps_to_compute_engine(name: str) -> None:
    assert LEGACY_MACHINES[name] == LEGACY[name]
    [pool] = custom(master_type=name)
    assert (pool.machine, pool.requested) == (LEGACY[name], name)


def test_legacy_table_is_complete_and_k80s_are_t4() -> None:
    assert set(LEGACY_MACHINES) == set(LEGACY)
    assert all(
        LEGACY_MACHINES[n].accelerator_type == T4
        for n in ("standard_gpu", "complex_model_m_gpu", "complex_model_l_gpu")
    )
    assert not any("K80" in (m.accelerator_type or "") for m in LEGACY_MACHINES.values())
    for text in ("K80", "NVIDIA_TESLA_T4", "16 GB", "12 GB", "4 T4", "complex_model_l_gpu"):
        assert text in K80_REPLACEMENT_NOTE


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_gpu_machines_pass_the_compatibility_rules(name: str) -> None:
    spec = LEGACY[name]
    acc = f"{spec.accelerator_type}:{spec.accelerator_count}" if spec.accelerator_type else None
    [pool] = custom(master_type=spec.machine_type, master_accelerator=acc)
    assert pool.machine == spec


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("a2-highgpu-1g", MachineSpec("a2-highgpu-1g", "NVIDIA_TESLA_A100", 1)),
        ("a2-highgpu-8g", MachineSpec("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)),
        ("a2-ultragpu-4g", MachineSpec("a2-ultragpu-4g", "NVIDIA_A100_80GB", 4)),
        ("a2-megagpu-16g", MachineSpec("a2-megagpu-16g", "NVIDIA_TESLA_A100", 16)),
        ("g2-standard-4", MachineSpec("g2-standard-4", "NVIDIA_L4", 1)),
        ("g2-standard-32", MachineSpec("g2-standard-32", "NVIDIA_L4", 1)),
        ("g2-standard-24", MachineSpec("g2-standard-24", "NVIDIA_L4", 2)),
        ("g2-standard-48", MachineSpec("g2-standard-48", "NVIDIA_L4", 4)),
        ("g2-standard-96", MachineSpec("g2-standard-96", "NVIDIA_L4", 8)),
        ("a3-highgpu-8g", MachineSpec("a3-highgpu-8g", "NVIDIA_H100_80GB", 8)),
        ("n2-highmem-32", MachineSpec("n2-highmem-32")),
        ("e2-standard-8", MachineSpec("e2-standard-8")),
        ("c2-standard-30", MachineSpec("c2-standard-30")),
        ("N1-HighCPU-96", MachineSpec("n1-highcpu-96")),
    ],
)
def test_compute_engine_names_with_bundled_gpus(name: str, spec: MachineSpec) -> None:
    [pool] = custom(master_type=name)
    assert (pool.machine, pool.requested) == (spec, name)
    if spec.accelerator_type:  # the same accelerator, given explicitly, is fine
        acc = {"type": spec.accelerator_type, "count": spec.accelerator_count}
        assert custom(master_type=name, master_accelerator=acc)[0].machine == spec


def test_cloud_tpu_worker_goes_with_either_naming() -> None:
    for master in ("standard", "n1-standard-8"):
        pools = custom(master_type=master, worker_type="cloud_tpu", worker_count="1")
        assert pools[1].machine == MachineSpec("cloud-tpu", "TPU_V2", 8)
    v3 = custom(
        master_type="n1-standard-8", worker_type="cloud-tpu", worker_count=1, worker_accelerator="TPU_V3:8"
    )
    assert v3[1].machine == MachineSpec("cloud-tpu", "TPU_V3", 8)


@pytest.mark.parametrize("series", sorted(N1_SIZES))
def test_n1_gpu_limits_follow_the_compute_engine_table(series: str) -> None:
    for gpu, caps in N1_MAX_VCPUS.items():
        for count in (1, 2, 3, 4, 8):
            for size in N1_SIZES[series]:
                kw = {"master_type": f"{series}-{size}", "master_accelerator": f"{gpu}:{count}"}
                if count in caps and size <= caps[count]:
                    assert custom(**kw)[0].machine == MachineSpec(f"{series}-{size}", gpu, count)
                else:
                    msg = error(scale_tier="CUSTOM", **kw)
                    assert "master_accelerator" in msg and gpu in msg


def test_n1_gpu_vcpu_error_says_which_sizes_work() -> None:
    msg = error(scale_tier="CUSTOM", master_type="n1-standard-32", master_accelerator="V100")
    assert "master_type='n1-standard-32'" in msg and "at most 12 vCPUs" in msg
    assert (
        "n1-standard-8" in msg
        and "n1-standard-16" not in msg.split("machine sizes that work:")[1].split(";")[0]
    )
    assert "NVIDIA_TESLA_V100:4" in msg  # or more V100 on the same machine
    msg = error(scale_tier="CUSTOM", master_type="n1-standard-64", master_accelerator="T4:2")
    assert "n1-standard-32" in msg and "NVIDIA_TESLA_T4:4" in msg


# --- worker pool specs -----------------------------------------------------------------------


def test_worker_pool_specs_in_index_order_with_placeholders() -> None:
    chief, ps = custom(
        master_type="n1-standard-8", parameter_server_type="n1-highmem-8", parameter_server_count=2
    )
    assert worker_pool_specs([ps, chief]) == [
        {"machine_spec": {"machine_type": "n1-standard-8"}, "replica_count": 1},
        {},
        {"machine_spec": {"machine_type": "n1-highmem-8"}, "replica_count": 2},
    ]
    chief, evaluator = custom(master_type="standard_gpu", evaluator_type="standard", evaluator_count=1)
    specs = worker_pool_specs([chief, evaluator])
    assert specs[1:3] == [{}, {}] and specs[3] == {
        "machine_spec": {"machine_type": "n1-standard-4"},
        "replica_count": 1,
    }
    assert specs[0]["machine_spec"] == {
        "machine_type": "n1-standard-8",
        "accelerator_type": T4,
        "accelerator_count": 1,
    }
    assert worker_pool_specs(resolve_pools("BASIC")) == [
        {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1}
    ]
    assert len(worker_pool_specs(resolve_pools("STANDARD_1"))) == 3  # no trailing evaluator placeholder
    assert worker_pool_specs([]) == []
    with pytest.raises(ValueError, match="share a role"):
        worker_pool_specs([chief, chief])


def test_custom_cluster_pools_and_xcom() -> None:
    pools = custom(
        master_type="n1-standard-16",
        master_accelerator="nvidia-tesla-v100:2",
        worker_type="n1-standard-16",
        worker_count="3",
        worker_accelerator={"type": "V100", "count": 2},
        parameter_server_type="n1-highmem-8",
        parameter_server_count=2,
        evaluator_type="n1-standard-4",
        evaluator_count=1,
    )
    assert [p.role for p in pools] == list(ROLES) and [p.index for p in pools] == [0, 1, 2, 3]
    assert [p.count for p in pools] == [1, 3, 2, 1]
    assert pools[1].to_xcom() == {
        "pool": "workerpool1",
        "role": "worker",
        "machine_type": "n1-standard-16",
        "accelerator_type": V100,
        "accelerator_count": 2,
        "count": 3,
        "requested": "n1-standard-16",
    }
    assert pools[2].to_xcom()["accelerator_type"] is None and pools[2].to_xcom()["pool"] == "workerpool2"
    assert MachineSpec("n1-standard-4").to_api() == {"machine_type": "n1-standard-4"}


# --- parse-time rules ------------------------------------------------------------------------

C = {"scale_tier": "CUSTOM"}


@pytest.mark.parametrize(
    ("kw", "needles"),
    [
        ({"scale_tier": "HUGE"}, ["scale_tier='HUGE'", "BASIC_GPU", "CUSTOM"]),
        ({"scale_tier": None}, ["scale_tier=None", "STANDARD_1"]),
        ({**C, "master_type": "xlarge"}, ["master_type='xlarge'", "complex_model_m", "n1-standard-8"]),
        (
            {**C, "master_type": "standard", "worker_type": "n9-standard-8", "worker_count": 1},
            ["worker_type='n9-standard-8'", "large_model"],
        ),
        ({**C, "master_type": "n1-standard-3"}, ["master_type='n1-standard-3'", "n1-highmem-16"]),
        ({**C, "master_type": "a3-highgpu-1g"}, ["master_type='a3-highgpu-1g'", "a3-highgpu-8g"]),
        ({**C}, ["master_type", "CUSTOM", "n1-standard-8"]),
        ({**C, "worker_count": 2}, ["master_type"]),
        ({"scale_tier": "BASIC", "master_type": "standard"}, ["master_type='standard'", "CUSTOM", "BASIC"]),
        ({"scale_tier": "STANDARD_1", "worker_count": 8}, ["worker_count=8", "CUSTOM"]),
        (
            {"scale_tier": "PREMIUM_1", "parameter_server_type": "large_model"},
            ["parameter_server_type", "CUSTOM"],
        ),
        ({"scale_tier": "BASIC_GPU", "evaluator_count": "1"}, ["evaluator_count='1'", "CUSTOM"]),
        ({"scale_tier": "BASIC_GPU", "master_accelerator": "T4:2"}, ["master_accelerator", "CUSTOM"]),
        ({**C, "master_type": "standard", "worker_count": 2}, ["worker_count=2", "worker_type"]),
        (
            {**C, "master_type": "standard", "worker_type": "standard"},
            ["worker_type='standard'", "worker_count"],
        ),
        (
            {**C, "master_type": "standard", "parameter_server_count": 1},
            ["parameter_server_count=1", "parameter_server_type"],
        ),
        (
            {**C, "master_type": "standard", "parameter_server_type": "large_model"},
            ["parameter_server_type", "parameter_server_count"],
        ),
        ({**C, "master_type": "standard", "evaluator_count": 1}, ["evaluator_count=1", "evaluator_type"]),
        (
            {**C, "master_type": "standard", "evaluator_type": "standard"},
            ["evaluator_type='standard'", "evaluator_count"],
        ),
        (
            {**C, "master_type": "standard", "worker_type": "standard", "worker_count": -1},
            ["worker_count=-1", ">= 0"],
        ),
        (
            {**C, "master_type": "standard", "worker_type": "standard", "worker_count": True},
            ["worker_count=True", "whole number"],
        ),
        (
            {**C, "master_type": "standard", "worker_type": "standard", "worker_count": 2.0},
            ["worker_count=2.0", "whole number"],
        ),
        (
            {**C, "master_type": "standard", "evaluator_type": "standard", "evaluator_count": "two"},
            ["evaluator_count='two'", "whole number"],
        ),
        (
            {**C, "master_type": "standard", "worker_type": "n1-standard-8", "worker_count": 2},
            ["master_type='standard'", "worker_type='n1-standard-8'", "n1-standard-4"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "evaluator_type": "large_model", "evaluator_count": 1},
            ["master_type='n1-standard-8'", "evaluator_type='large_model'", "n1-highmem-8"],
        ),
        (
            {**C, "master_type": "standard_gpu", "master_accelerator": "T4"},
            ["master_accelerator", "master_type='standard_gpu'", "n1-standard-8"],
        ),
        (
            {
                **C,
                "master_type": "standard",
                "worker_type": "complex_model_m",
                "worker_count": 2,
                "worker_accelerator": "V100",
            },
            ["worker_accelerator", "worker_type='complex_model_m'"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "evaluator_accelerator": "T4"},
            ["evaluator_accelerator", "evaluator_type", "evaluator_count"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "L4"},
            ["master_accelerator", "NVIDIA_L4", "g2-standard", T4],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "A100"},
            ["master_accelerator", "a2-highgpu"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "T4:3"},
            ["master_accelerator", "1, 2, 4"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "V100:3"},
            ["master_accelerator", "1, 2, 4, 8"],
        ),
        (
            {**C, "master_type": "n2-standard-8", "master_accelerator": "T4"},
            ["master_accelerator", "n2", "n1-*", "g2-standard"],
        ),
        ({**C, "master_type": "e2-standard-8", "master_accelerator": "T4"}, ["master_accelerator", "e2"]),
        ({**C, "master_type": "c2-standard-8", "master_accelerator": "V100"}, ["master_accelerator", "c2"]),
        (
            {**C, "master_type": "a2-highgpu-1g", "master_accelerator": "A100:2"},
            ["master_accelerator", "a2-highgpu-1g", "1 x NVIDIA_TESLA_A100"],
        ),
        (
            {**C, "master_type": "g2-standard-8", "master_accelerator": "T4"},
            ["master_accelerator", "NVIDIA_L4"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "TPU_V2:8"},
            ["master_accelerator", "cloud-tpu"],
        ),
        (
            {
                **C,
                "master_type": "n1-standard-8",
                "worker_type": "cloud-tpu",
                "worker_count": 1,
                "worker_accelerator": "TPU_V2:4",
            },
            ["worker_accelerator", "TPU_V2:8"],
        ),
        (
            {
                **C,
                "master_type": "n1-standard-8",
                "worker_type": "cloud-tpu",
                "worker_count": 1,
                "worker_accelerator": "T4",
            },
            ["worker_accelerator", "TPU_V3:8"],
        ),
        ({**C, "master_type": "cloud-tpu"}, ["master_type='cloud-tpu'", "worker_type"]),
        (
            {**C, "master_type": "n1-standard-8", "worker_type": "cloud-tpu", "worker_count": 4},
            ["worker_count=4", "worker_count=1"],
        ),
        (
            {**C, "master_type": "n1-standard-8", "master_accelerator": "K80"},
            ["master_accelerator='K80'", "NVIDIA_TESLA_T4"],
        ),
        (
            {
                **C,
                "master_type": "n1-standard-8",
                "worker_type": "n1-standard-8",
                "worker_count": 1,
                "worker_accelerator": "Z9",
            },
            ["worker_accelerator='Z9'", "NVIDIA_TESLA_T4", "NVIDIA_H100_80GB"],
        ),
    ],
)
def test_bad_combinations_name_the_field_and_the_fix(kw: dict, needles: list[str]) -> None:
    msg = error(**kw)
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_counts_accept_int_like_strings_and_zero_pools_are_dropped() -> None:
    pools = custom(
        master_type="standard", worker_type="complex_model_m", worker_count=" 4 ", parameter_server_count="0"
    )
    assert [(p.role, p.count) for p in pools] == [("chief", 1), ("worker", 4)]
    assert resolve_pools("BASIC", worker_count=0, parameter_server_count="0") == resolve_pools("BASIC")


# --- accelerators ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("NVIDIA_TESLA_T4", (T4, 1)),
        ("nvidia-tesla-t4", (T4, 1)),
        ("T4", (T4, 1)),
        ("t4:2", (T4, 2)),
        ("NVIDIA_TESLA_T4:2", (T4, 2)),
        ({"type": "T4", "count": 2}, (T4, 2)),
        ({"type": "NVIDIA_TESLA_V100", "count": "4"}, (V100, 4)),
        ({"type": "p100"}, (P100, 1)),
        ("nvidia-l4", ("NVIDIA_L4", 1)),
        ("A100", ("NVIDIA_TESLA_A100", 1)),
        ("nvidia-a100-80gb:8", ("NVIDIA_A100_80GB", 8)),
        ("A100-80GB", ("NVIDIA_A100_80GB", 1)),
        ("H100:8", ("NVIDIA_H100_80GB", 8)),
        ("tpu-v3:8", ("TPU_V3", 8)),
    ],
)
def test_parse_accelerator(value: object, expected: tuple[str, int] | None) -> None:
    assert parse_accelerator(value, "worker_accelerator") == expected


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ("X100", ["my_field='X100'", "NVIDIA_TESLA_T4", "TPU_V3"]),
        ("", ["my_field", "NVIDIA_TESLA_T4"]),
        ("T4:0", ["my_field count", ">= 1"]),
        ("T4:two", ["my_field count", "whole number"]),
        ({"type": "T4", "count": 0}, ["my_field count", ">= 1"]),
        ({"type": "T4", "cnt": 2}, ["my_field", "'type'", "'count'"]),
        ({"count": 2}, ["my_field", "'type'"]),
        (4, ["my_field=4", "NVIDIA_TESLA_T4"]),
        ("nvidia-tesla-k80", ["my_field", "K80", "NVIDIA_TESLA_T4"]),
    ],
)
def test_parse_accelerator_errors(value: object, needles: list[str]) -> None:
    with pytest.raises(ValueError) as exc:
        parse_accelerator(value, "my_field")
    for needle in needles:
        assert needle in str(exc.value), (needle, str(exc.value))


# --- prices ----------------------------------------------------------------------------------


def row_price(instance_type: str, spot: bool, accelerator: str | None = None, count: int = 0) -> float:
    """Straight from the snapshot rows: the machine's row, or the accelerator-only row."""
    for r in snapshot_rows("gcp"):
        if (
            r.region == REGION
            and r.instance_type == instance_type
            and (accelerator is None or (r.accelerator, r.accelerator_count) == (accelerator, count))
        ):
            price = r.spot_min if spot else r.price
            assert price is not None
            return price
    raise AssertionError(f"no row for {instance_type or accelerator}")


@pytest.mark.parametrize("spot", [False, True])
def test_hourly_price_is_machine_plus_accelerator_rows(spot: bool) -> None:
    for spec, parts in [
        (MachineSpec("n1-standard-4"), [("n1-standard-4", None, 0)]),
        (MachineSpec("n1-standard-8", T4, 1), [("n1-standard-8", None, 0), ("", "T4", 1)]),
        (MachineSpec("n1-standard-32", V100, 8), [("n1-standard-32", None, 0), ("", "V100", 8)]),
        (MachineSpec("g2-standard-24", "NVIDIA_L4", 2), [("g2-standard-24", None, 0), ("", "L4", 2)]),
        (MachineSpec("a2-highgpu-1g", "NVIDIA_TESLA_A100", 1), [("a2-highgpu-1g", None, 0), ("", "A100", 1)]),
        (MachineSpec("a3-highgpu-8g", "NVIDIA_H100_80GB", 8), [("a3-highgpu-8g", None, 0), ("", "H100", 8)]),
    ]:
        expected = sum(row_price(t, spot, a, c) for t, a, c in parts)
        assert hourly_price(spec, REGION, spot) == pytest.approx(expected), spec


def test_known_prices_in_us_central1() -> None:
    assert hourly_price(LEGACY["standard_gpu"], REGION) == pytest.approx(0.38 + 0.35)
    assert hourly_price(LEGACY["standard_gpu"], REGION, spot=True) == pytest.approx(0.0963 + 0.14)


@pytest.mark.parametrize("spot", [False, True])
def test_n1_highcpu_is_priced_from_the_n1_rates(spot: bool) -> None:
    highcpu8 = hourly_price(MachineSpec("n1-highcpu-8"), REGION, spot)
    std4 = hourly_price(MachineSpec("n1-standard-4"), REGION, spot)
    std8 = hourly_price(MachineSpec("n1-standard-8"), REGION, spot)
    assert highcpu8 is not None and std4 is not None and std8 is not None
    # 8 vCPUs / 7.2 GiB: more than 4 vCPUs / 15 GiB, less than 8 vCPUs / 30 GiB.
    assert std4 < highcpu8 < std8
    # Linear in size, as the family's per-vCPU and per-GiB rates make it.
    assert hourly_price(MachineSpec("n1-highcpu-16"), REGION, spot) == pytest.approx(2 * highcpu8, rel=1e-4)
    if not spot:  # Compute Engine's published n1-highcpu-8 list price in us-central1 is about $0.2836
        assert highcpu8 == pytest.approx(0.2836, rel=0.02)


def test_unpriceable_machines_are_none() -> None:
    assert hourly_price(MachineSpec("cloud-tpu", "TPU_V2", 8), REGION) is None
    assert hourly_price(MachineSpec("n1-standard-8", T4, 1), "asia-east1") is None
    assert hourly_price(MachineSpec("e2-standard-8"), REGION) is None  # not in the snapshot
    assert hourly_price(MachineSpec("n1-standard-96", T4, 8), REGION) is None  # no such accelerator row


def test_estimate_cost_sums_pools_over_the_run_time() -> None:
    pools = resolve_pools("STANDARD_1")
    per_hour = sum(hourly_price(p.machine, REGION) * p.count for p in pools)
    usd, basis = estimate_cost(pools, REGION, False, 5400)
    assert usd == pytest.approx(per_hour * 1.5)
    assert "ESTIMATE" in basis and "Compute Engine" in basis and "on-demand" in basis and "1.50 h" in basis
    assert "Vertex AI adds its own training charge" in basis and "\n" not in basis
    spot_usd, spot_basis = estimate_cost(pools, REGION, True, 5400)
    assert spot_usd is not None and spot_usd < usd and "Spot" in spot_basis
    assert estimate_cost(pools, REGION, False, 0)[0] == 0
    with pytest.raises(ValueError, match="seconds"):
        estimate_cost(pools, REGION, False, -1)


def test_estimate_cost_bills_every_replica_through_the_one_billing_function() -> None:
    """A job's cost is what ``core.billing`` bills each replica (whole seconds, no minimum), summed."""
    pools = resolve_pools("STANDARD_1")
    for seconds in (0.4, 59.5, 3601.2):
        usd, _ = estimate_cost(pools, REGION, False, seconds)
        billed = sum(
            billed_usd(hourly_price(p.machine, REGION), seconds, count=p.count, minimum_s=VERTEX_MINIMUM_S)
            for p in pools
        )
        assert usd == pytest.approx(billed, abs=1e-6)  # the total is rounded to 6 places
    assert estimate_cost(pools, REGION, False, 59.5)[0] == estimate_cost(pools, REGION, False, 60)[0]


def test_estimate_cost_names_the_pools_it_cannot_price() -> None:
    usd, basis = estimate_cost(resolve_pools("BASIC_TPU"), REGION, False, 3600)
    assert usd is None
    assert "could not price worker 1 x cloud-tpu" in basis and "TPU" in basis and "ESTIMATE" in basis
    assert "chief 1 x n1-standard-4" in basis.split("could not price")[0]
    usd, basis = estimate_cost(resolve_pools("BASIC_GPU"), "asia-east1", False, 3600)
    assert usd is None and "could not price chief" in basis


# --- purity ----------------------------------------------------------------------------------


def test_import_loads_no_cloud_sdk() -> None:
    code = (
        "import sys, airflow_cloudtrain.mlengine as m; m.resolve_pools('STANDARD_1'); "
        "m.hourly_price(m.resolve_pools('BASIC_GPU')[0].machine, 'us-central1'); "
        "bad = [n for n in sys.modules if n.split('.')[0] in ('boto3', 'botocore', 'aiobotocore', 'airflow') "
        "or n.startswith(('google.cloud.', 'google.api_core', 'google.auth', 'google.protobuf', 'grpc', 'proto'))]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

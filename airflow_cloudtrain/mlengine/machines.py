"""Machine names: ML Engine's legacy names, Compute Engine names, and which accelerators fit which.

Vertex AI only takes Compute Engine machine types plus an explicit accelerator, so every name an
ML Engine job used must be turned into that pair, and every pairing Vertex would refuse (minutes
later, at job submission) is refused here instead, at DAG parse time, with the fix in the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_cloudtrain.catalog.gce import N1_ATTACH_LIMITS, bundled_gpus
from airflow_cloudtrain.mlengine.accelerators import ACCELERATORS, N1_GPUS, TPUS


@dataclass(frozen=True)
class MachineSpec:
    """One Vertex AI ``MachineSpec``: a Compute Engine machine type and its accelerators."""

    machine_type: str
    accelerator_type: str | None = None
    accelerator_count: int = 0

    def to_api(self) -> dict:
        """snake_case, as google-cloud-aiplatform's proto-plus messages take it."""
        out: dict = {"machine_type": self.machine_type}
        if self.accelerator_type:
            out["accelerator_type"] = self.accelerator_type
            out["accelerator_count"] = self.accelerator_count
        return out

    def describe(self) -> str:
        """``n1-standard-8 + 1 x NVIDIA_TESLA_T4``, for messages and cost bases."""
        if not self.accelerator_type:
            return self.machine_type
        return f"{self.machine_type} + {self.accelerator_count} x {self.accelerator_type}"


TPU_MACHINE = "cloud-tpu"
TPU_COUNT = 8

# ML Engine's legacy machine names and their Compute Engine equivalents, as AI Platform Training's
# "Compare machine types" table publishes them. The three *_gpu names had K80s, which Vertex AI no
# longer offers: see accelerators.K80_REPLACEMENT_NOTE for why they carry T4s here.
LEGACY_MACHINES: dict[str, MachineSpec] = {
    "standard": MachineSpec("n1-standard-4"),
    "large_model": MachineSpec("n1-highmem-8"),
    "complex_model_s": MachineSpec("n1-highcpu-8"),
    "complex_model_m": MachineSpec("n1-highcpu-16"),
    "complex_model_l": MachineSpec("n1-highcpu-32"),
    "standard_gpu": MachineSpec("n1-standard-8", "NVIDIA_TESLA_T4", 1),  # was 1 K80
    "complex_model_m_gpu": MachineSpec("n1-standard-16", "NVIDIA_TESLA_T4", 4),  # was 4 K80
    "complex_model_l_gpu": MachineSpec("n1-standard-32", "NVIDIA_TESLA_T4", 4),  # was 8 K80
    "standard_p100": MachineSpec("n1-standard-8", "NVIDIA_TESLA_P100", 1),
    "complex_model_m_p100": MachineSpec("n1-standard-16", "NVIDIA_TESLA_P100", 4),
    "standard_v100": MachineSpec("n1-standard-8", "NVIDIA_TESLA_V100", 1),
    "large_model_v100": MachineSpec("n1-highmem-8", "NVIDIA_TESLA_V100", 1),
    "complex_model_m_v100": MachineSpec("n1-standard-16", "NVIDIA_TESLA_V100", 4),
    "complex_model_l_v100": MachineSpec("n1-standard-32", "NVIDIA_TESLA_V100", 8),
}

# Compute Engine series Vertex AI training takes, with their published predefined sizes (vCPUs).
CE_SERIES: dict[str, tuple[int, ...]] = {
    "n1-standard": (1, 2, 4, 8, 16, 32, 64, 96),
    "n1-highmem": (2, 4, 8, 16, 32, 64, 96),
    "n1-highcpu": (2, 4, 8, 16, 32, 64, 96),
    "n2-standard": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n2-highmem": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n2-highcpu": (2, 4, 8, 16, 32, 48, 64, 80, 96),
    "e2-standard": (2, 4, 8, 16, 32),
    "e2-highmem": (2, 4, 8, 16),
    "e2-highcpu": (2, 4, 8, 16, 32),
    "c2-standard": (4, 8, 16, 30, 60),
}

# GiB per vCPU of the N1 series: the N1 GPU limits cap memory as well as vCPUs.
N1_GIB_PER_VCPU: dict[str, float] = {"n1-standard": 3.75, "n1-highmem": 6.5, "n1-highcpu": 0.9}

# Catalog GPU name -> Vertex enum name (the inverse of accelerators.ACCELERATORS).
_CATALOG_TO_ENUM = {short: enum for enum, short in ACCELERATORS.items() if short}


def _bundled_machines() -> dict[str, tuple[str, int]]:
    """Accelerator-optimised types Vertex AI training takes -> (Vertex enum, count) that come with
    them; counts from ``catalog.gce.bundled_gpus`` so the two never disagree."""
    names = [f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)]
    names += [f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)]
    names += [f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)]
    names += ["a3-highgpu-8g"]
    out: dict[str, tuple[str, int]] = {}
    for name in names:
        gpu, count = bundled_gpus(name) or ("", 0)
        out[name] = (_CATALOG_TO_ENUM[gpu], count)
    out["a2-megagpu-16g"] = ("NVIDIA_TESLA_A100", 16)  # not in the catalog (no price)
    return out


BUNDLED_MACHINES: dict[str, tuple[str, int]] = _bundled_machines()

CE_EXAMPLES = "n1-standard-8, n1-highmem-16, n1-highcpu-32, n2-standard-16, e2-standard-8, c2-standard-16, g2-standard-8, a2-highgpu-1g, a3-highgpu-8g, cloud-tpu"


def unknown_machine_text() -> str:
    return (
        f"accepted: the legacy ML Engine names {', '.join(LEGACY_MACHINES)}; or a Compute Engine machine "
        f"type such as {CE_EXAMPLES}"
    )


def normalise(name: str) -> str:
    """Lower case, trimmed; ML Engine's ``cloud_tpu`` spelled as Vertex's ``cloud-tpu``."""
    name = name.strip().lower()
    return TPU_MACHINE if name == "cloud_tpu" else name


def series_of(machine_type: str) -> tuple[str, int] | None:
    """``("n1-standard", 8)`` for ``n1-standard-8`` if it is a known predefined size, else None."""
    m = re.fullmatch(r"([a-z0-9]+-[a-z]+)-(\d+)", machine_type)
    if m and int(m.group(2)) in CE_SERIES.get(m.group(1), ()):
        return m.group(1), int(m.group(2))
    return None


def kind_of(name: str, field: str) -> str:
    """``"legacy"``, ``"compute_engine"`` or ``"tpu"``; ValueError naming ``field`` if unknown."""
    if not isinstance(name, str):
        raise ValueError(f"{field}={name!r} is not a machine name; {unknown_machine_text()}")
    key = normalise(name)
    if key in LEGACY_MACHINES:
        return "legacy"
    if key == TPU_MACHINE:
        return "tpu"
    if key in BUNDLED_MACHINES or series_of(key):
        return "compute_engine"
    raise ValueError(
        f"{field}={name!r} is not a machine type Vertex AI training takes; {unknown_machine_text()}"
    )


def _n1_gpu_check(machine_type: str, gpu: str, count: int, field: str, acc_field: str) -> None:
    """Vertex refuses N1 + GPU pairings outside Compute Engine's per-count vCPU/memory caps."""
    limits = N1_ATTACH_LIMITS[ACCELERATORS[gpu] or ""]
    if count not in limits:
        raise ValueError(
            f"{acc_field}={gpu}:{count} on {field}={machine_type!r}: {count} x {gpu} cannot attach to an N1 "
            f"machine; accepted counts for {gpu}: {', '.join(map(str, limits))}"
        )
    series, vcpus = series_of(machine_type) or ("", 0)
    max_vcpus, max_gib = limits[count]
    gib = vcpus * N1_GIB_PER_VCPU[series]
    if vcpus <= max_vcpus and gib <= max_gib:
        return
    fits = [n for n in CE_SERIES[series] if n <= max_vcpus and n * N1_GIB_PER_VCPU[series] <= max_gib]
    other_counts = [c for c, (mv, mg) in limits.items() if c != count and vcpus <= mv and gib <= mg]
    sizes = ", ".join(f"{series}-{n}" for n in fits) or f"no {series} size"
    more = ""
    if other_counts:
        more = f"; or keep {machine_type} with {acc_field}=" + " or ".join(f"{gpu}:{c}" for c in other_counts)
    raise ValueError(
        f"{field}={machine_type!r} with {acc_field}={gpu}:{count}: {count} x {gpu} take an N1 machine of at "
        f"most {max_vcpus} vCPUs and {max_gib} GiB, and {machine_type} has {vcpus} vCPUs and {gib:g} GiB; "
        f"machine sizes that work: {sizes}{more}"
    )


def machine_spec(name: str, accelerator: tuple[str, int] | None, field: str, acc_field: str) -> MachineSpec:
    """The Vertex ``MachineSpec`` for a machine name and an optional parsed accelerator.

    ``field`` / ``acc_field`` are the argument names (``worker_type``, ``worker_accelerator``) the
    error messages quote, so a DAG author sees which argument to change.
    """
    kind = kind_of(name, field)
    key = normalise(name)
    gpu, count = accelerator or (None, 0)
    if kind == "legacy":
        spec = LEGACY_MACHINES[key]
        if accelerator is not None:
            raise ValueError(
                f"{acc_field}={gpu}:{count} is given with {field}={name!r}, a legacy ML Engine name that fixes "
                f"its own GPU ({key} = {spec.describe()}); drop {acc_field}, or use a Compute Engine machine "
                f"type (e.g. {spec.machine_type}) with {acc_field}"
            )
        return spec
    if kind == "tpu":
        if gpu is None:
            return MachineSpec(TPU_MACHINE, "TPU_V2", TPU_COUNT)
        if gpu not in TPUS or count != TPU_COUNT:
            raise ValueError(
                f"{field}={name!r} takes {acc_field}=TPU_V2:{TPU_COUNT} or TPU_V3:{TPU_COUNT} (8 TPU cores, "
                f"nothing else); got {gpu}:{count}"
            )
        return MachineSpec(TPU_MACHINE, gpu, count)
    if gpu in TPUS:
        raise ValueError(
            f"{acc_field}={gpu}:{count} on {field}={name!r}: TPUs only come with machine type {TPU_MACHINE} "
            f"(accepted: {TPU_MACHINE} with TPU_V2:{TPU_COUNT} or TPU_V3:{TPU_COUNT})"
        )
    if key in BUNDLED_MACHINES:
        own_gpu, own_count = BUNDLED_MACHINES[key]
        if gpu is not None and (gpu, count) != (own_gpu, own_count):
            raise ValueError(
                f"{acc_field}={gpu}:{count} differs from what {field}={name!r} comes with ({own_count} x "
                f"{own_gpu}); drop {acc_field} (the GPU comes with the machine) or choose a machine type "
                f"that comes with {gpu}"
            )
        return MachineSpec(key, own_gpu, own_count)
    if gpu is None:
        return MachineSpec(key)
    if not key.startswith("n1-"):
        raise ValueError(
            f"{acc_field}={gpu}:{count} on {field}={name!r}: GPUs do not attach to {key.split('-')[0]} machines; "
            f"accepted: an n1-* machine with {', '.join(N1_GPUS)}, or g2-standard-* (NVIDIA_L4), "
            f"a2-highgpu-*g (NVIDIA_TESLA_A100), a2-ultragpu-*g (NVIDIA_A100_80GB), a3-highgpu-8g (NVIDIA_H100_80GB)"
        )
    if gpu not in N1_GPUS:
        raise ValueError(
            f"{acc_field}={gpu}:{count} on {field}={name!r}: only {', '.join(N1_GPUS)} attach to n1 machines; "
            "for NVIDIA_L4 use g2-standard-*, for NVIDIA_TESLA_A100 a2-highgpu-*g, for NVIDIA_A100_80GB "
            "a2-ultragpu-*g, for NVIDIA_H100_80GB a3-highgpu-8g (their GPUs come with the machine)"
        )
    _n1_gpu_check(key, gpu, count, field, acc_field)
    return MachineSpec(key, gpu, count)

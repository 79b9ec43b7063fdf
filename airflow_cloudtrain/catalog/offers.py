"""The ``Offer`` record: one instance type in one region, with its prices and zones."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS, SPOT_CLOUDS


@dataclass(frozen=True)
class Offer:
    """One way to get hardware: an instance (or machine) type in a region.

    ``price`` is on-demand USD per instance-hour (None where the source publishes none);
    ``spot_price`` the lowest spot price over the region's zones (None where there is no spot).
    On GCE, ``attach_gpus`` says the GPUs are attached to an N1 machine as guest accelerators
    (rather than coming with an accelerator-optimised family), and ``derived`` marks prices the
    catalog computed (custom shapes) rather than read from the source.
    """

    cloud: str
    instance_type: str
    vcpus: float
    memory_gib: float
    gpus: int
    gpu_type: str | None
    region: str
    zones: tuple[str, ...]
    price: float | None
    spot_price: float | None
    attach_gpus: bool = False
    derived: bool = False
    source: str = field(default="snapshot", compare=False)

    @property
    def provider(self) -> str:
        return CLOUDS[self.cloud]

    @property
    def is_spot(self) -> bool:
        return self.cloud in SPOT_CLOUDS

    @property
    def hourly(self) -> float | None:
        """What this offer is ranked by: the spot price on spot clouds, else on-demand."""
        return self.spot_price if self.is_spot else self.price

    def describe(self) -> str:
        gpu = f", {self.gpus}x {self.gpu_type}" if self.gpus else ""
        return f"{self.instance_type} ({self.vcpus:g} vCPUs, {self.memory_gib:g} GiB{gpu}) in {self.region}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["zones"] = list(self.zones)
        return data

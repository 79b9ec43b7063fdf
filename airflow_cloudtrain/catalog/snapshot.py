"""Read the shipped price snapshot (``data/*.csv``) into ``Offer`` rows. See ``data/SOURCE.md``."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).with_name("data")
SNAPSHOT_DATE = "2026-11-22"
SNAPSHOT_SOURCE = (
    "SkyPilot catalog (github.com/skypilot-org/skypilot-catalog, catalogs/v7/{aws,gcp}/vms.csv), "
    f"read {SNAPSHOT_DATE}"
)


@dataclass(frozen=True)
class Row:
    """One CSV row as published: a machine type (``instance_type``) or a GCE accelerator price."""

    instance_type: str
    accelerator: str | None
    accelerator_count: int
    vcpus: float
    memory_gib: float
    region: str
    price: float | None
    spot_min: float | None
    spot_max: float | None
    zones: tuple[str, ...]


def _num(text: str) -> float | None:
    return float(text) if text.strip() else None


def parse_rows(lines: Iterable[str]) -> list[Row]:
    """Parse rows in the snapshot's column layout (also what the live refresh writes)."""
    rows = []
    for rec in csv.DictReader(lines):
        rows.append(
            Row(
                instance_type=rec["InstanceType"].strip(),
                accelerator=rec["AcceleratorName"].strip() or None,
                accelerator_count=int(float(rec["AcceleratorCount"] or 0)),
                vcpus=float(rec["vCPUs"] or 0),
                memory_gib=float(rec["MemoryGiB"] or 0),
                region=rec["Region"].strip(),
                price=_num(rec["Price"]),
                spot_min=_num(rec["SpotMin"]),
                spot_max=_num(rec["SpotMax"]),
                zones=tuple(z for z in rec["Zones"].split(";") if z),
            )
        )
    return rows


COLUMNS = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Region,Price,SpotMin,SpotMax,Zones"


def format_rows(rows: Iterable[Row]) -> str:
    """The inverse of ``parse_rows``: used by the live refresh to write its cache."""

    def f(x: float | None) -> str:
        return "" if x is None else repr(x)

    out = [COLUMNS]
    for r in rows:
        count = str(r.accelerator_count) if r.accelerator else ""
        out.append(
            ",".join(
                [
                    r.instance_type,
                    r.accelerator or "",
                    count,
                    f(r.vcpus),
                    f(r.memory_gib),
                    r.region,
                    f(r.price),
                    f(r.spot_min),
                    f(r.spot_max),
                    ";".join(r.zones),
                ]
            )
        )
    return "\n".join(out) + "\n"


@lru_cache(maxsize=2)
def snapshot_rows(provider: str) -> tuple[Row, ...]:
    """All rows of ``aws.csv`` or ``gcp.csv``; read once per process."""
    with (DATA_DIR / f"{provider}.csv").open(newline="") as fh:
        return tuple(parse_rows(fh))

"""Hardware requests and spot bids: parsing and validation only, no cloud calls.

Everything here runs while a DAG file is parsed (operator construction), so it must be cheap and
must raise a ``ValueError`` that names the field, the bad value and the accepted forms. The rules
come from the studio tool (see ``docs/design.md``): sizes with the suffixes ``g``/``G``/``Gb``/``GiB``
and ``m``/``M``/``MiB``, RAM rounded up to the next 256 MiB, bids in USD or in percent of on-demand.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

from airflow_cloudtrain.contract import clouds as _registry

# The names live in clouds.registry (the agent imports them from there); re-exported for callers.
CLOUDS: tuple[str, ...] = tuple(_registry.CLOUDS)
SPOT_CLOUDS = _registry.SPOT_CLOUDS
AWS_CLOUDS = _registry.AWS_CLOUDS
GCP_CLOUDS = _registry.GCP_CLOUDS

RAM_STEP_MIB = 256
_MIB_PER_UNIT = {
    "m": 1,
    "M": 1,
    "MB": 1,
    "Mb": 1,
    "MiB": 1,
    "mb": 1,
    "g": 1024,
    "G": 1024,
    "GB": 1024,
    "Gb": 1024,
    "GiB": 1024,
    "gb": 1024,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]*)\s*$", re.ASCII)
MIN_RAM_MIB = 512  # the smallest instances have 0.5 GiB; less is a unit mistake (ram=1 is 1 MiB)
MAX_RAM_MIB = 64 * 1024 * 1024  # 64 TiB: the largest VMs have 24 TiB (EC2 u-24tb1) and 32 TiB (GCE X4)
_SIZE_FORMS = (
    "an int ({unit}) or a string like '16g', '512m', '1.5GiB' (suffixes m, M, MB, MiB, g, G, Gb, GB, GiB)"
)


def warn_user(message: str) -> None:
    """A ``UserWarning`` shown at the user's line (the DAG file), not at ours or Airflow's."""
    import sys
    from pathlib import Path

    ours = (str(Path(__file__).resolve().parent), str(Path("airflow", "sdk")), str(Path("airflow", "models")))
    frame: Any = sys._getframe(1)
    level = 2
    while frame is not None and any(part in frame.f_code.co_filename for part in ours):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def parse_cloud(cloud: Any) -> str:
    """Return ``cloud`` if it is one of the four names the studio tool used, else raise."""
    if isinstance(cloud, str) and cloud.strip().lower() in CLOUDS:
        return cloud.strip().lower()
    raise ValueError(f"cloud={cloud!r} is not supported: use one of {', '.join(CLOUDS)}")


def parse_count(value: Any, field: str, minimum: int, maximum: int | None = None) -> int:
    """Parse a whole number of cpus/gpus (ints or digit strings, as UI params arrive as strings)."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif (
        isinstance(value, float)
        and value.is_integer()
        or isinstance(value, str)
        and re.fullmatch(r"\s*-?\d+\s*", value, re.ASCII)
    ):
        number = int(value)
    if number is None or number < minimum or (maximum is not None and number > maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(f"{field}={value!r} is not valid: use a whole number {bound}, e.g. {field}=8")
    return number


def parse_size_mib(value: Any, field: str, default_unit_mib: int) -> float:
    """Parse a size into MiB. Bare numbers are in the field's default unit (MiB for ram, GiB for hdd)."""
    unit_name = "MiB" if default_unit_mib == 1 else "GiB"
    forms = _SIZE_FORMS.format(unit=unit_name)
    mib: float | None = None
    if isinstance(value, bool):
        mib = None
    elif isinstance(value, (int, float)):
        mib = float(value) * default_unit_mib
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match:
            number, suffix = float(match.group(1)), match.group(2)
            if not suffix:
                mib = number * default_unit_mib
            elif suffix in _MIB_PER_UNIT:
                mib = number * _MIB_PER_UNIT[suffix]
    if mib is None or not math.isfinite(mib) or mib <= 0:
        raise ValueError(f"{field}={value!r} is not a valid size: use {forms}; it must be more than zero")
    return mib


def parse_ram_mib(value: Any) -> int:
    """RAM in MiB, at least 512 MiB as asked, rounded up to the next multiple of 256 MiB (the studio
    tool's rule). The one RAM rule: operators, ``Hardware`` and the CLI (``--ram``) all call this."""
    mib = parse_size_mib(value, "ram", 1)
    if mib < MIN_RAM_MIB:
        raise ValueError(
            f"ram={value!r} is {mib:g} MiB, too small: ram is in MiB when a bare number ('16g' is 16 GiB); "
            f"ask for at least {MIN_RAM_MIB} MiB, e.g. ram='16g'"
        )
    if mib > MAX_RAM_MIB:
        raise ValueError(
            f"ram={value!r} is {mib / 1024:g} GiB: no instance has that much; use at most "
            f"{MAX_RAM_MIB // 1024**2} TiB, e.g. ram='64g' (a bare number is MiB)"
        )
    return int(math.ceil(mib / RAM_STEP_MIB - 1e-9) * RAM_STEP_MIB)


def parse_hdd_gib(value: Any) -> int:
    """Disk in whole GiB (volumes are sized in GiB), rounded up."""
    mib = parse_size_mib(value, "hdd", 1024)
    return int(math.ceil(mib / 1024 - 1e-9))


def normalise_gpu_type(value: Any) -> str | None:
    """Accelerator names are compared upper-case: ``"a10g"`` and ``"A10G"`` are the same request."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", value.strip(), re.ASCII):
        raise ValueError(
            f"gpu_type={value!r} is not valid: use an accelerator name such as 'A10G', 'T4', 'V100'"
        )
    return value.strip().upper()


class Hardware:
    """What a job needs, normalised: ``cpus``, ``gpus``, ``gpu_type``, ``ram_mib``, ``hdd_gib``.

    ``ram``/``hdd`` left as None mean "no minimum" (the catalog then picks on vCPUs and GPUs alone;
    the disk gets a default size at launch).
    """

    __slots__ = ("cpus", "gpus", "gpu_type", "ram_mib", "hdd_gib")

    def __init__(
        self,
        cpus: Any = 1,
        gpus: Any = 0,
        ram: Any = None,
        hdd: Any = None,
        gpu_type: Any = None,
    ) -> None:
        self.cpus: int = parse_count(cpus, "cpus", 1)
        self.gpus: int = parse_count(gpus, "gpus", 0)
        self.ram_mib: int | None = None if ram is None else parse_ram_mib(ram)
        self.hdd_gib: int | None = None if hdd is None else parse_hdd_gib(hdd)
        self.gpu_type: str | None = normalise_gpu_type(gpu_type)
        if self.gpu_type and self.gpus == 0:
            self.gpus = 1

    @property
    def ram_gib(self) -> float:
        return (self.ram_mib or 0) / 1024

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hardware) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"Hardware({fields})"


_BID_FORMS = "a price in USD per instance-hour ('0.45', 0.45, '$0.45') or a percentage of on-demand ('60%')"
MAX_BID_USD = 1000.0  # the dearest instances cost about $100 an hour: more is a unit mistake (cents?)
MAX_BID_PERCENT = 1000.0


class Bid:
    """A spot bid: the most we pay for one instance-hour, in USD or as a share of on-demand.

    Exactly one of ``usd`` and ``percent`` is set. A percentage above 100 is allowed but warns:
    the price paid is the lower of bid and market, so bidding above on-demand only buys the right
    to pay more than on-demand (the AWS spot guide and the studio tool both advise against it).
    """

    __slots__ = ("usd", "percent", "raw")

    def __init__(self, value: Any) -> None:
        self.raw = value
        self.usd: float | None = None
        self.percent: float | None = None
        number: float | None = None
        is_percent = False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            text = value.strip()
            if text.endswith("%"):
                is_percent, text = True, text[:-1].strip()
            elif text.startswith("$"):
                text = text[1:].strip()
            if re.fullmatch(r"\d+(\.\d+)?|\.\d+", text, re.ASCII):
                number = float(text)
        if number is None or not math.isfinite(number) or number <= 0:
            raise ValueError(f"bid={value!r} is not valid: use {_BID_FORMS}; it must be more than zero")
        most = MAX_BID_PERCENT if is_percent else MAX_BID_USD
        if number > most:
            raise ValueError(
                f"bid={value!r} is not valid: use {_BID_FORMS}, at most "
                + (f"{most:g}%" if is_percent else f"${most:g} an hour (no instance costs that much)")
            )
        if is_percent:
            self.percent = number
            if number > 100:
                warn_user(
                    f"bid={value!r} is above 100% of on-demand: the spot price you pay is the lower of "
                    "bid and market, so a bid above on-demand only lets you pay more than on-demand."
                )
        else:
            self.usd = number

    def max_price(self, on_demand_usd: float | None) -> float:
        """The bid in USD per instance-hour; a percentage needs the on-demand price it is a share of."""
        if self.usd is not None:
            return self.usd
        if on_demand_usd is None:
            raise ValueError(
                f"bid={self.raw!r} is a percentage but no on-demand price is known for this offer"
            )
        return round(on_demand_usd * (self.percent or 0) / 100.0, 6)

    def __repr__(self) -> str:
        return f"Bid({self.raw!r})"

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"${self.usd:g}"


@dataclass
class RunConfig:
    """The operator's arguments, parsed and normalised."""

    cloud: str
    command: str
    bucket: str
    hardware: Hardware
    bid: Bid | None
    code: str | None
    setup_cmds: list[str]
    env: dict[str, str]
    max_runtime_s: float | None
    instance_type: str | None
    region: str | None
    zone: str | None
    image: str | None

    @property
    def zone_region(self) -> str | None:
        """The region of ``zone``, when only a zone was given."""
        if not self.zone:
            return None
        from airflow_cloudtrain.catalog.rules import rules

        return rules(self.cloud).zone_region(self.zone)

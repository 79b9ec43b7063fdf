"""Accelerator names: Vertex AI's enum, the spellings ML Engine users wrote, and the catalog's names.

ML Engine jobs named accelerators by the same enum Vertex AI uses (``NVIDIA_TESLA_T4``), gcloud
took Compute Engine's spelling (``nvidia-tesla-t4``) and people write the short model (``T4``).
All three are accepted and normalised to the Vertex enum, so the rest of the package deals with
one spelling. The catalog snapshot prices GPUs under its own short names, hence the second map.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Vertex AI ``AcceleratorType`` enum name -> catalog (snapshot) name; None = not in the catalog.
ACCELERATORS: dict[str, str | None] = {
    "NVIDIA_TESLA_T4": "T4",
    "NVIDIA_TESLA_V100": "V100",
    "NVIDIA_TESLA_P100": "P100",
    "NVIDIA_TESLA_P4": "P4",
    "NVIDIA_L4": "L4",
    "NVIDIA_TESLA_A100": "A100",
    "NVIDIA_A100_80GB": "A100-80GB",
    "NVIDIA_H100_80GB": "H100",
    "TPU_V2": None,
    "TPU_V3": None,
}

TPUS: frozenset[str] = frozenset({"TPU_V2", "TPU_V3"})

# The GPUs a Compute Engine N1 machine takes as guest accelerators (every other GPU comes with its
# own machine family: L4 with G2, A100 with A2, H100 with A3).
N1_GPUS: tuple[str, ...] = ("NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4")

K80_REPLACEMENT_NOTE = (
    "ML Engine's *_gpu machines carried NVIDIA Tesla K80s, which Vertex AI has retired; they become "
    "NVIDIA_TESLA_T4, the cheapest GPU that N1 machines take on Vertex AI, with more memory (16 GB vs "
    "12 GB per K80 die) and several times a K80 die's throughput. An N1 machine takes at most 4 T4, "
    "so complex_model_l_gpu (8 K80) becomes 4 T4."
)


def _key(name: str) -> str:
    return name.strip().upper().replace("-", "_")


def _aliases() -> dict[str, str]:
    """Normalised spelling -> Vertex enum name: the enum itself, its Compute Engine spelling
    (same letters, hyphens, lower case: ``_key`` folds both) and the catalog's short name."""
    out: dict[str, str] = {}
    for enum, short in ACCELERATORS.items():
        out[enum] = enum
        if short:
            out[_key(short)] = enum
    return out


_ALIASES = _aliases()

ACCEPTED_ACCELERATORS_TEXT = (
    ", ".join(ACCELERATORS)
    + " (also Compute Engine's spelling, e.g. nvidia-tesla-t4, or the short model name, e.g. T4; "
    "append ':N' or pass {'type': ..., 'count': N} for N of them)"
)


def accelerator_name(name: str, field: str) -> str:
    """The Vertex enum name for any accepted spelling; ValueError naming ``field`` otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{field}={name!r} is not an accelerator; accepted: {ACCEPTED_ACCELERATORS_TEXT}")
    key = _key(name)
    if key in _ALIASES:
        return _ALIASES[key]
    if "K80" in key:
        raise ValueError(f"{field}={name!r}: {K80_REPLACEMENT_NOTE} Use NVIDIA_TESLA_T4 instead.")
    raise ValueError(
        f"{field}={name!r} is not an accelerator Vertex AI offers; accepted: {ACCEPTED_ACCELERATORS_TEXT}"
    )


def parse_count(value: Any, field: str, minimum: int = 0) -> int:
    """An int from an int or an int-like string ("4"). bool and floats are refused: a count of
    ``True`` or ``2.5`` replicas is a mistake, not something to round."""
    if isinstance(value, bool):
        raise ValueError(f"{field}={value!r} is a bool; accepted: a whole number >= {minimum}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        n = int(value.strip())
    else:
        raise ValueError(f"{field}={value!r} is not a whole number; accepted: a whole number >= {minimum}")
    if n < minimum:
        raise ValueError(f"{field}={value!r} is below {minimum}; accepted: a whole number >= {minimum}")
    return n


def parse_accelerator(value: Any, field: str) -> tuple[str, int] | None:
    """``(Vertex enum name, count)`` from what an ML Engine user writes, or None for None.

    Accepted: ``"NVIDIA_TESLA_T4"``, ``"nvidia-tesla-t4"``, ``"T4"`` (count 1); ``"T4:2"``;
    ``{"type": "T4", "count": 2}`` (ML Engine's ``acceleratorConfig``; count defaults to 1).
    Whether the accelerator fits the machine is checked later, by ``machines.machine_spec``.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        unknown = set(value) - {"type", "count"}
        if unknown or "type" not in value:
            raise ValueError(
                f"{field}={dict(value)!r}: an accelerator dict takes the keys 'type' (required) and "
                f"'count'; accepted types: {ACCEPTED_ACCELERATORS_TEXT}"
            )
        name = accelerator_name(value["type"], field)
        return name, parse_count(value.get("count", 1), f"{field} count", minimum=1)
    if isinstance(value, str):
        text, sep, count = value.partition(":")
        name = accelerator_name(text, field)
        return name, parse_count(count, f"{field} count", minimum=1) if sep else 1
    raise ValueError(
        f"{field}={value!r} is not an accelerator; give a name ('T4', 'T4:2') or "
        f"{{'type': ..., 'count': N}}; accepted types: {ACCEPTED_ACCELERATORS_TEXT}"
    )

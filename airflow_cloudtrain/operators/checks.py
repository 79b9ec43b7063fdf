"""Parse-time checks shared by the operators and sensors: plain values, and what the catalog knows.

Local and cheap like the rest of ``operators.*_config``: the catalog here is the shipped snapshot
plus any fresh live cache on disk (``catalog.live.current_rows``), never the network. Each function
raises a ``ValueError`` that names the field, the bad value and the accepted forms, or warns
(``UserWarning``) where the value is legal but has no effect.

``check_known`` is how a templated argument stops only its own checks: each field whose value is
known is checked alone, each combination once all of its fields are known, and the task checks the
rest through the same functions after rendering.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.clouds import CLOUDS, provider
from airflow_cloudtrain.spec import warn_user

if TYPE_CHECKING:
    from airflow_cloudtrain.catalog.rules import ShapeRules

RUN_ID_RE = re.compile(r"ct-[0-9a-f]{12}")  # a run's short id, as in the XCom and the tags


def is_templated(value: Any) -> bool:
    """Still a Jinja template (checked again after rendering)?"""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(is_templated(v) for v in value)
    return False


def is_deferred_value(value: Any) -> bool:
    """A template or an XComArg (an upstream task's output): known only when the task runs."""
    kind = type(value)
    return (
        is_templated(value)
        or kind.__name__.endswith("XComArg")
        or (hasattr(value, "resolve") and kind.__module__.startswith("airflow"))  # e.g. a MappedArgument
    )


def check_known(
    args: dict[str, Any],
    fields: dict[str, Callable[[Any], Any]],
    combos: Iterable[tuple[tuple[str, ...], Callable[[], Any]]] = (),
    templated: Callable[[Any], bool] = is_deferred_value,
) -> dict[str, Any]:
    """Check every field of ``fields`` whose value in ``args`` is not a template, then every combo
    whose fields are all known; returns the parsed known fields. Templated ones wait for rendering
    (``templated``: how a template is told; after rendering nothing is one)."""
    parsed = {name: parse(args.get(name)) for name, parse in fields.items() if not templated(args.get(name))}
    for names, check in combos:
        if not any(templated(args.get(n)) for n in names):
            check()
    return parsed


def check_bool(value: Any, name: str) -> bool:
    """Only True or False: ``"false"`` would be truthy, so a string is a mistake, not a boolean."""
    if isinstance(value, bool):
        return value
    raise ValueError(f"{name}={value!r} is not valid: use True or False")


# --- durations --------------------------------------------------------------------------------------

MAX_DURATION_S = 366 * 86400.0  # longer is a unit mistake (and overflows the clocks it is added to)
DURATION_FORMS = "seconds (90 or '90'), a timedelta, or a string like '90s', '15m', '1h30m', '2d12h'"
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# one optional part per unit, largest first: '2d12h', '1h30m', '1h 30m', '90s'; '1h1h' and '30m1h' are not
_COMPOUND_RE = re.compile(
    rf"(?:(?P<d>{_NUMBER})\s*d)?\s*(?:(?P<h>{_NUMBER})\s*h)?\s*(?:(?P<m>{_NUMBER})\s*m)?\s*(?:(?P<s>{_NUMBER})\s*s)?",
    re.ASCII | re.IGNORECASE,
)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def duration_text_seconds(text: str) -> float | None:
    """Seconds of ``'90'``, ``'90s'``, ``'1h30m'``, ``'2d 12h'``; None when the text is not one."""
    text = text.strip()
    if re.fullmatch(_NUMBER, text, re.ASCII):
        return float(text)
    match = _COMPOUND_RE.fullmatch(text)
    if not text or not match or not any(match.groupdict().values()):
        return None
    return sum(float(number) * _UNIT_S[unit] for unit, number in match.groupdict().items() if number)


def parse_duration(
    value: Any, field_name: str, extra_forms: str = "", maximum: float = MAX_DURATION_S
) -> float | None:
    """Seconds from an int/float, a timedelta, or a string (``DURATION_FORMS``); None for None/"".

    Every duration argument of every operator and sensor goes through here, so they all take the
    same forms (``1h30m`` included) and refuse the same mistakes (``1h1h``, ``1x``, NaN, <= 0)."""
    if value is None or value == "":
        return None
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = duration_text_seconds(value)
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= maximum:
        limit = f"{maximum / 86400:g} days" if maximum >= 86400 else f"{maximum:g} s"
        raise ValueError(
            f"{field_name}={value!r} is not a valid duration: use {DURATION_FORMS}{extra_forms}; "
            f"more than zero and at most {limit}"
        )
    return seconds


def check_seconds(value: Any, name: str, minimum: float = 0.0) -> float:
    """A required duration more than ``minimum`` seconds (any form ``parse_duration`` takes)."""
    seconds = parse_duration(value, name) if value not in (None, "") else None
    if seconds is None or seconds <= minimum:
        raise ValueError(
            f"{name}={value!r} is not valid: use {DURATION_FORMS}, more than {minimum:g} s, e.g. {name}=10"
        )
    return seconds


# --- names, ids, paths ------------------------------------------------------------------------------


def check_clean_text(value: str, name: str, forms: str) -> str:
    """No control characters, no invisible (zero-width) ones, no whitespace at either end: a value
    that reaches a cloud API, a shell or a path as it is must be what the DAG file shows."""
    bad = next((c for c in value if not c.isprintable() or c in "\u200b\u200c\u200d\u2060\ufeff"), None)
    if bad is not None:
        raise ValueError(
            f"{name}={value!r} is not valid: it contains the invisible or control character {bad!r}; use {forms}"
        )
    if value != value.strip():
        raise ValueError(
            f"{name}={value!r} is not valid: it has whitespace at the start or the end; use {forms}"
        )
    return value


CONN_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,250}")
CONN_ID_FORMS = "an Airflow connection id (letters, digits, '_', '.', '-'), e.g. '{default}'"


def check_conn_id(value: Any, name: str, default: str, optional: bool) -> str | None:
    """An Airflow connection id; ``optional``: None/"" mean "no connection" (boto3's own chain)."""
    forms = CONN_ID_FORMS.format(default=default)
    if optional and value in (None, ""):
        return None
    if not isinstance(value, str) or not CONN_ID_RE.fullmatch(value):
        raise ValueError(f"{name}={value!r} is not valid: use {forms}")
    return value


PROJECT_ID_RE = re.compile(r"(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
PROJECT_ID_RULE = (
    "a Google Cloud project id has 6 to 30 characters: lowercase letters, digits and hyphens, "
    "starting with a letter and not ending with a hyphen (a domain-scoped one is 'example.com:my-project')"
)


def parse_project_id(value: Any, name: str = "project_id") -> str | None:
    """A Google Cloud project id, or None/"" for the connection's project."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not PROJECT_ID_RE.fullmatch(value):
        raise ValueError(f"{name}={value!r} is not valid: {PROJECT_ID_RULE}; use e.g. 'my-project'")
    return value


def check_path(value: Any, name: str, example: str) -> str | None:
    """A path on the instance: None (not given) or a non-empty string that shows what it is."""
    forms = f"a path on the instance, e.g. {example!r}"
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={value!r} is not valid: use {forms}")
    return check_clean_text(value, name, forms)


def check_whole(value: Any, name: str, low: int, high: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name}={value!r} is not valid: use a whole number {bound}")
    return value


def check_optional_str(value: Any, name: str, pattern: str, forms: str) -> str | None:
    """None/"" (not given) or a string matching ``pattern`` entirely."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise ValueError(f"{name}={value!r} is not valid: use {forms}")
    return check_clean_text(value, name, forms)


# --- what the catalog knows -------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogIndex:
    """Regions, zones, machine types and GPU names of one provider, from the catalog rows."""

    regions: tuple[str, ...]
    zones: dict[str, tuple[str, ...]]  # region -> zone names (GCE) or zone ids (AWS)
    types: dict[str, dict[str, Any]]  # instance type -> {"regions": set, "row": a Row}
    gpus: tuple[str, ...]


@lru_cache(maxsize=4)
def _index(rows: tuple[Any, ...]) -> CatalogIndex:
    zones: dict[str, set[str]] = {}
    types: dict[str, dict[str, Any]] = {}
    gpus: set[str] = set()
    for r in rows:
        zones.setdefault(r.region, set()).update(r.zones)
        if r.accelerator:
            gpus.add(r.accelerator.upper())
        if r.instance_type:
            types.setdefault(r.instance_type, {"regions": set(), "row": r})["regions"].add(r.region)
    return CatalogIndex(
        tuple(sorted(zones)), {k: tuple(sorted(v)) for k, v in zones.items()}, types, tuple(sorted(gpus))
    )


def catalog(cloud: str) -> CatalogIndex:
    from airflow_cloudtrain.catalog.live import current_rows

    return _index(current_rows(CLOUDS[cloud]))


def shapes(cloud: str) -> ShapeRules:
    """The provider's catalog rules (``catalog.ec2`` / ``catalog.gce``), imported when a check needs them."""
    from airflow_cloudtrain.catalog.rules import rules

    return rules(cloud)


def _provider_word(cloud: str) -> str:
    return provider(cloud).compute


def _a(cloud: str) -> str:
    """'a GCE' / 'an EC2': the provider's word with its article."""
    return provider(cloud).with_article


def _other(cloud: str) -> str:
    return provider(cloud).other


AWS_REGION_RE = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d")
GCP_REGION_RE = re.compile(r"[a-z]+-[a-z]+\d+")


def parse_region(value: Any, cloud: str | None, field: str = "region") -> str | None:
    """A region the catalog prices for ``cloud`` (any known region when ``cloud`` is a template)."""
    if value is None or value == "":
        return None
    clouds = [cloud] if cloud else ["ec2", "gcloud"]
    for c in clouds:
        if isinstance(value, str) and value in catalog(c).regions:
            return value
    if cloud and isinstance(value, str):
        other = _other(cloud)
        if value in catalog(other).regions:
            raise ValueError(
                f"{field}={value!r} is {_a(other)} region, not one of cloud={cloud!r}: use one "
                f"of {', '.join(catalog(cloud).regions)}"
            )
    known = "; ".join(f"{_provider_word(c)}: {', '.join(catalog(c).regions)}" for c in clouds)
    raise ValueError(
        f"{field}={value!r} is not a region the catalog knows (no prices, no types there): use one of {known}"
    )


def zone_region(cloud: str, zone: str) -> str | None:
    """The catalog region a zone name belongs to, or None when it is unknown."""
    index, rules = catalog(cloud), shapes(cloud)
    return next((r for r in index.regions if rules.zone_in_region(zone, r, index.zones.get(r, ()))), None)


def parse_zone(value: Any, cloud: str | None) -> str | None:
    """A zone name the catalog knows for ``cloud`` (``us-east-1a``, ``us-central1-a``)."""
    if value is None or value == "":
        return None
    forms = "a zone name such as 'us-east-1a' (EC2) or 'us-central1-a' (GCE)"
    if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9-]+", value):
        raise ValueError(f"zone={value!r} is not valid: use {forms}")
    clouds = [cloud] if cloud else ["ec2", "gcloud"]
    if any(zone_region(c, value) for c in clouds):
        return value
    if cloud and zone_region(_other(cloud), value):
        raise ValueError(
            f"zone={value!r} is {_a(_other(cloud))} zone, not one of cloud={cloud!r}: use {forms}"
        )
    known = "; ".join(
        f"{_provider_word(c)} {r}: {', '.join(zone_names(c, r))}" for c in clouds for r in catalog(c).regions
    )
    raise ValueError(f"zone={value!r} does not exist in the catalog: use {forms}. Known zones: {known}")


def zone_names(cloud: str, region: str) -> list[str]:
    """The zone names of a region (EC2: from the number of zone ids the catalog lists)."""
    return shapes(cloud).zone_names(region, catalog(cloud).zones.get(region, ()))


def check_zone_in_region(cloud: str, region: str | None, zone: str | None) -> None:
    if not region or not zone:
        return
    actual = zone_region(cloud, zone)
    if actual != region:
        raise ValueError(
            f"zone={zone!r} is not in region={region!r} (it is in {actual!r}): give a zone of "
            f"{region} ({', '.join(zone_names(cloud, region))}) or leave region out"
        )


def parse_gpu_type(value: Any, cloud: str | None) -> str | None:
    """An accelerator name the catalog has for ``cloud`` (compared upper-case)."""
    from airflow_cloudtrain.spec import normalise_gpu_type

    name = normalise_gpu_type(value)
    if name is None:
        return None
    clouds = [cloud] if cloud else ["ec2", "gcloud"]
    if any(name in catalog(c).gpus for c in clouds):
        return name
    if cloud and name in catalog(_other(cloud)).gpus:
        raise ValueError(
            f"gpu_type={value!r} is {_a(_other(cloud))} GPU, not offered on cloud={cloud!r}: "
            f"use one of {', '.join(catalog(cloud).gpus)}"
        )
    known = "; ".join(f"{_provider_word(c)}: {', '.join(catalog(c).gpus)}" for c in clouds)
    raise ValueError(f"gpu_type={value!r} is not a GPU the catalog knows: use one of {known}")


# --- instance types ---------------------------------------------------------------------------------


def parse_instance_type(value: Any, cloud: str | None) -> str | None:
    """A machine type of ``cloud``: one the catalog lists, a GCE custom shape within its family's
    rules, or (warned) a well-formed name of a family the catalog does not cover."""
    if value is None or value == "":
        return None
    forms = "an EC2 type such as 'g5.xlarge' or a GCE machine type such as 'n1-standard-8' / 'custom-4-16384'"
    if not isinstance(value, str):
        raise ValueError(f"instance_type={value!r} is not valid: use {forms}")
    if not any(shapes(c).is_type_name(value) for c in ("ec2", "gcloud")):
        raise ValueError(f"instance_type={value!r} is not valid: use {forms}")
    if cloud is None:
        return value
    own = shapes(cloud)
    if not own.is_type_name(value):  # the names of the two providers' types do not overlap
        raise ValueError(
            f"instance_type={value!r} is {_a(_other(cloud))} type, not one of cloud={cloud!r}: {own.TYPE_HINT}"
        )
    if own.check_custom_shape(value):  # a custom shape within its family's rules (raises if not)
        return value
    index = catalog(cloud)
    if value in index.types:
        return value
    family = own.family_of(value)
    siblings = sorted(t for t in index.types if own.family_of(t) == family)
    if siblings:
        raise ValueError(f"instance_type={value!r} does not exist: {family} comes in {', '.join(siblings)}")
    warn_user(
        f"instance_type={value!r} is not in the catalog: it is launched as given, with no price known "
        "(cost_usd is 0) and no check that it meets cpus/gpus/ram"
    )
    return value


def check_request_in_catalog(cloud: str, hardware: Any, given: dict[str, Any]) -> None:
    """A ``cpus``/``ram``/``gpus`` beyond every offer of ``cloud`` fails naming that field and the largest
    offer (``given``: the arguments as written, for the message). Not with an explicit
    ``instance_type``: a type the catalog does not list is launched as given."""
    from airflow_cloudtrain.catalog.live import current_rows
    from airflow_cloudtrain.catalog.select import base_offers

    if given.get("instance_type"):
        return
    offers = base_offers(cloud, tuple(current_rows(CLOUDS[cloud])))
    gpu_offers = [
        o for o in offers if not hardware.gpu_type or (o.gpu_type or "").upper() == hardware.gpu_type
    ]
    wanted: list[tuple[str, float, Callable[[Any], float], str, list[Any]]] = [
        ("cpus", hardware.cpus, lambda o: o.vcpus, "vCPUs", list(offers)),
        ("ram", (hardware.ram_mib or 0) / 1024, lambda o: o.memory_gib, "GiB of memory", list(offers)),
        ("gpus", hardware.gpus, lambda o: o.gpus, f"{hardware.gpu_type or ''} GPUs".strip(), gpu_offers),
    ]
    for name, asked, measure, what, pool in wanted:
        if not pool or not asked:
            continue
        top = max(pool, key=measure)
        if asked > measure(top) + 1e-9:
            raise ValueError(
                f"{name}={given.get(name)!r} is more than any {cloud} offer has: the largest, "
                f"{top.instance_type}, has {measure(top):g} {what}; use at most {measure(top):g} "
                "(or give an instance_type the catalog does not list)"
            )


def check_instance_type_fits(
    cloud: str, instance_type: str | None, hardware: Any, region: str | None, zone: str | None
) -> None:
    """An explicit type must be offered where asked and have the vCPUs, memory and GPUs asked for."""
    if not instance_type:
        return
    rules = shapes(cloud)
    have: dict[str, Any] | None = rules.custom_shape_has(instance_type, hardware.gpus, hardware.gpu_type)
    if have is None:
        entry = catalog(cloud).types.get(instance_type)
        if entry is None:
            return  # warned at parse: not in the catalog
        row = entry["row"]
        region = region or (zone_region(cloud, zone) if zone else None)
        if region and region not in entry["regions"]:
            raise ValueError(
                f"instance_type={instance_type!r} is not offered in {region}: it is in "
                f"{', '.join(sorted(entry['regions']))}; use one of those regions or another type"
            )
        gpu, gpus = rules.type_gpus(instance_type, row, hardware.gpus, hardware.gpu_type)
        have = {"vcpus": row.vcpus, "mib": row.memory_gib * 1024, "gpus": gpus, "gpu": gpu}
    wanted = [
        ("cpus", hardware.cpus, have["vcpus"], "vCPUs"),
        ("ram", (hardware.ram_mib or 0) / 1024, have["mib"] / 1024, "GiB of memory"),
        ("gpus", hardware.gpus, have["gpus"], "GPUs"),
    ]
    for name, asked, got, what in wanted:
        if asked > got + 1e-9:
            raise ValueError(
                f"instance_type={instance_type!r} has {got:g} {what}, less than {name} asks for ({asked:g}): "
                f"pick a larger type, or leave instance_type out and the catalog picks one that fits"
            )
    if hardware.gpu_type and have["gpus"] and (have["gpu"] or "").upper() != hardware.gpu_type:
        raise ValueError(
            f"instance_type={instance_type!r} comes with {have['gpu']} GPUs, not gpu_type={hardware.gpu_type!r}: "
            "pick a type with that GPU, or leave instance_type out"
        )


def parse_instance_ids(value: Any, cloud: str) -> list[str]:
    """A list of instance ids (EC2) or VM names (GCE); one id alone, or a rendered template's text
    of a list (``"['i-0abc...', 'i-0def...']"``), is taken too."""
    import ast

    facts = provider(cloud)
    pattern = re.compile(facts.instance_id_re)
    forms = f"{facts.instance_id_forms} (or a template that renders to one)"
    ids = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                ids = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                ids = None
        else:
            ids = [text]
    if not isinstance(ids, (list, tuple)) or not ids:
        raise ValueError(f"instance_ids={value!r} is not valid: use {forms}")
    for item in ids:
        if not isinstance(item, str) or not pattern.fullmatch(item):
            raise ValueError(f"instance_ids={value!r} is not valid: {item!r} is not an id; use {forms}")
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if list(ids).count(i) > 1)
        raise ValueError(f"instance_ids={value!r} is not valid: {twice!r} is listed twice; use {forms}")
    return list(ids)

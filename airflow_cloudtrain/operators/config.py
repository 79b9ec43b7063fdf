"""Operator arguments: validation at DAG parse time, re-validation once templates are rendered.

Everything here is local and cheap (no cloud SDK, no network): DAG files construct operators.
A value that still holds a Jinja template is checked after rendering, when the task runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_cloudtrain.spec import AWS_CLOUDS, Bid, Hardware, parse_cloud

DEFAULT_MAX_RUNTIME_S = 7 * 86400.0  # Vertex AI custom jobs' default timeout: a forgotten run stops
UNLIMITED = "unlimited"
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def is_templated(value: Any) -> bool:
    """Still a Jinja template (checked again after rendering)?"""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(is_templated(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_templated(v) for v in value)
    return False


def parse_duration(value: Any, field_name: str) -> float | None:
    """Seconds from an int/float, a timedelta, or '90s' / '30m' / '2h' / '1d'."""
    if value is None or value == "":
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        seconds = -1
    if seconds <= 0:
        raise ValueError(
            f"{field_name}={value!r} is not a valid duration: use seconds (3600), a timedelta, "
            "or a string like '90s', '30m', '2h', '1d'; it must be more than zero"
        )
    return seconds


def parse_bucket(value: Any, cloud: str) -> str:
    scheme = "s3" if cloud in AWS_CLOUDS else "gs"
    if not isinstance(value, str) or not re.fullmatch(
        rf"{scheme}://[a-z0-9][a-z0-9._-]{{1,61}}[a-z0-9](/.*)?", value
    ):
        raise ValueError(
            f"bucket={value!r} is not valid for cloud={cloud!r}: use a {scheme}:// URI such as "
            f"'{scheme}://my-bucket/training' (the run folders go under it)"
        )
    return value.rstrip("/")


def parse_max_runtime(value: Any) -> float | None:
    """Seconds; not given = the 7-day cap; ``"unlimited"`` = no cap at all (None)."""
    if isinstance(value, str) and value.strip().lower() == UNLIMITED:
        return None
    if value is None or value == "":
        return DEFAULT_MAX_RUNTIME_S
    try:
        return parse_duration(value, "max_runtime")
    except ValueError as err:
        raise ValueError(f"{err}; or 'unlimited' to lift the default 7-day cap") from None


def parse_code(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(
            f"code={value!r} is not valid: use a local directory or an s3:// / gs:// tarball URI"
        )
    if value.startswith(("s3://", "gs://")):
        return value
    return value  # a local directory, checked when the task runs (it lives on the worker)


def parse_str_list(value: Any, field_name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"{field_name}={value!r} is not valid: use a list of shell commands (strings)")


def parse_env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict) and all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in value
    ):
        return {k: str(v) for k, v in value.items()}
    raise ValueError(
        "env is not valid: use a dict of environment variable names (letters, digits, _) to values"
    )


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
        from airflow_cloudtrain.catalog.select import zone_region

        return zone_region(self.cloud, self.zone)


def parse_config(args: dict[str, Any]) -> RunConfig:
    """Parse everything; raises ValueError naming the field on the first bad value."""
    cloud = parse_cloud(args["cloud"])
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValueError(
            f"command={command!r} is not valid: give the shell command to run, e.g. 'python train.py'"
        )
    hardware = Hardware(
        args.get("cpus", 1), args.get("gpus", 0), args.get("ram"), args.get("hdd"), args.get("gpu_type")
    )
    bid = Bid(args["bid"]) if args.get("bid") not in (None, "") else None
    return RunConfig(
        cloud=cloud,
        command=command,
        bucket=parse_bucket(args.get("bucket"), cloud),
        hardware=hardware,
        bid=bid,
        code=parse_code(args.get("code")),
        setup_cmds=parse_str_list(args.get("setup_cmds"), "setup_cmds"),
        env=parse_env(args.get("env")),
        max_runtime_s=parse_max_runtime(args.get("max_runtime")),
        instance_type=args.get("instance_type") or None,
        region=args.get("region") or None,
        zone=args.get("zone") or None,
        image=args.get("image") or None,
    )

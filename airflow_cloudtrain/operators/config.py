"""Operator arguments: validation at DAG parse time, re-validation once templates are rendered.

Everything here is local and cheap (no cloud SDK, no network): DAG files construct operators.
Each argument has one parser (``FIELDS``); ``check_run_args`` runs the parsers of the values that are
known when the DAG file is parsed and the combinations whose values are all known, ``parse_config``
runs all of them on the rendered values when the task runs.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from airflow_cloudtrain.contract.clouds import CLOUDS, PROVIDERS, SCHEMES, provider
from airflow_cloudtrain.operators import checks
from airflow_cloudtrain.operators.checks import is_templated, parse_duration
from airflow_cloudtrain.spec import MIN_RAM_MIB as MIN_RAM_MIB  # re-exported: the rule lives in spec
from airflow_cloudtrain.spec import (
    SPOT_CLOUDS,
    Bid,
    Hardware,
    RunConfig,
    parse_cloud,
    parse_count,
    parse_ram_mib,
)

__all__ = ["is_templated", "parse_config", "parse_duration", "check_run_args", "RunConfig"]

DEFAULT_MAX_RUNTIME_S = 7 * 86400.0  # Vertex AI custom jobs' default timeout: a forgotten run stops
UNLIMITED = "unlimited"
MIN_HDD_GIB = 10  # the root disk holds the OS image: 8 GiB (Amazon Linux), 10 GiB (Debian on GCE)
MAX_HDD_GIB = 65536  # 64 TiB: the largest EBS volume (io2 Block Express) and GCE persistent disk
MAX_CPUS = 4096  # the largest VMs have 896 (EC2 u-*) to 1920 (GCE X4) vCPUs
MAX_GPUS = 64  # the largest VMs have 16 GPUs (a2-megagpu-16g, p4de has 8)


def parse_bucket(value: Any, cloud: str | None) -> str:
    """An s3:// (EC2) or gs:// (GCE) URI; either while ``cloud`` is still a template. The bucket
    name follows its store's rule, so a typo fails here, not at the first upload of a run."""
    # the cloud's own storage; either while ``cloud`` is a template (``Provider.scheme``)
    schemes = [provider(cloud).scheme] if cloud in CLOUDS else [p.scheme for p in PROVIDERS.values()]
    example = f"'{schemes[0]}://my-bucket/training'"
    where = f" for cloud={cloud!r}" if cloud else ""
    if not isinstance(value, str) or "://" not in value:
        either = " or ".join(f"{p.scheme}:// ({p.compute})" for p in PROVIDERS.values())
        uri = f"a {schemes[0]}:// URI" if cloud else f"an {either} URI"
        raise ValueError(
            f"bucket={value!r} is not valid{where}: use {uri} such as {example} (the run folders go under it)"
        )
    checks.check_clean_text(value, "bucket", f"a URI such as {example}")
    scheme, _, rest = value.partition("://")
    if scheme not in schemes:
        raise ValueError(
            f"bucket={value!r} is not valid{where}: use a {' or '.join(f'{x}://' for x in schemes)} URI such as "
            f"{example}" + _scheme_hint(scheme)
        )
    name, _, path = rest.partition("/")
    if problem := bucket_name_problem(name, scheme):
        raise ValueError(f"bucket={value!r} is not valid: {problem}; e.g. {example}")
    if "//" in f"/{path}".rstrip("/") or any(part in (".", "..") for part in path.split("/")):
        raise ValueError(
            f"bucket={value!r} is not valid: the folder part has an empty, '.' or '..' segment; use e.g. {example}"
        )
    return value.rstrip("/")


def _scheme_hint(scheme: str) -> str:
    """' (gs:// is Google Cloud Storage, for cloud='gcloud'/'gcspot')' for a known scheme, else ''."""
    owner = SCHEMES.get(scheme)
    if owner is None:
        return ""
    return f" ({scheme}:// is {owner.storage}, for cloud={'/'.join(repr(c) for c in owner.clouds)})"


def bucket_name_problem(name: str, scheme: str) -> str | None:
    """What breaks S3's / Cloud Storage's bucket naming rule, in words; None when the name is fine."""
    store = SCHEMES[scheme]
    rule = (
        f"{store.bucket_kind} bucket name has 3 to 63 characters ({store.bucket_chars}), starts and ends "
        "with a letter or digit, and is not an IP address"
    )
    if not name:
        return f"the bucket name is missing: {rule}"
    # Cloud Storage: a dotted (domain) name may have up to 222 characters, 63 per dot-separated part
    dotted = "." in name and max(map(len, name.split("."))) <= 63
    longest = store.dotted_bucket_max if dotted else 63
    if not 3 <= len(name) <= longest:
        return f"the bucket name {name!r} has {len(name)} character{'s' if len(name) > 1 else ''}: {rule}"
    # '_' also on S3: buckets made in us-east-1 before March 2018 may have it (new ones cannot)
    if not re.fullmatch(r"[a-z0-9._-]+", name, re.ASCII):
        return f"the bucket name {name!r} has characters a bucket name cannot have: {rule}"
    if not (name[0].isalnum() and name[-1].isalnum()):
        return f"the bucket name {name!r} does not start and end with a letter or digit: {rule}"
    if ".." in name or re.fullmatch(r"\d+\.\d+\.\d+\.\d+", name):
        return f"the bucket name {name!r} has '..' or is an IP address: {rule}"
    return None


MAX_RUNTIME_FORMS = ", or 'unlimited' (no cap; left out, a run stops after 7 days)"


def parse_max_runtime(value: Any) -> float | None:
    """Seconds; not given = the 7-day cap; ``"unlimited"`` = no cap at all (None)."""
    if isinstance(value, str) and value.strip().lower() == UNLIMITED:
        return None
    if value is None or value == "":
        return DEFAULT_MAX_RUNTIME_S
    return parse_duration(value, "max_runtime", MAX_RUNTIME_FORMS)


def parse_code(value: Any, cloud: str | None = None) -> str | None:
    """A tarball URI on the run's own cloud storage, or a local directory that exists (it is packed
    and uploaded by the task; DAG files and the worker share the DAGs folder)."""
    if value is None or value == "":
        return None
    forms = "a local directory (packed and uploaded) or an s3:// (EC2) / gs:// (GCE) tarball URI"
    if isinstance(value, PurePath):
        value = str(value)
    if not isinstance(value, str):
        raise ValueError(f"code={value!r} is not valid: use {forms}")
    own = provider(cloud).uri_prefix if cloud in CLOUDS else None
    if value.startswith(tuple(p.uri_prefix for p in PROVIDERS.values())):
        if own and not value.startswith(own):
            raise ValueError(
                f"code={value!r} is on the other cloud's storage: with cloud={cloud!r} use a {own} URI "
                "(the instance reads it with its own role) or a local directory"
            )
        if len(value) <= 5 or value[5:].startswith("/"):
            raise ValueError(f"code={value!r} is not valid: use {forms}")
        return value
    if "://" in value:
        raise ValueError(
            f"code={value!r} is not valid: URLs other than s3:// / gs:// are not fetched; use {forms}"
        )
    path = Path(value).expanduser()
    if not path.is_dir():
        what = "is a file, not a directory" if path.exists() else "does not exist"
        raise ValueError(
            f"code={value!r} {what} (looked up from {Path.cwd()}): use {forms}; an absolute path "
            "next to the DAG file, e.g. str(Path(__file__).parent / 'train_code'), is safest"
        )
    return value


def parse_setup_cmds(value: Any) -> list[str]:
    """A list of shell commands; a rendered template may also be the text of a list."""
    if value is None:
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        with contextlib.suppress(ValueError, SyntaxError):
            value = ast.literal_eval(value.strip())  # a list rendered as text: "['a', 'b']" or JSON
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, str) and v.strip() and "\x00" not in v for v in value
    ):
        return list(value)
    hint = " (one string is not a list: wrap it, setup_cmds=[...])" if isinstance(value, str) else ""
    raise ValueError(
        f"setup_cmds={value!r} is not valid{hint}: use a list of shell commands, "
        "e.g. ['pip install -r requirements.txt']"
    )


def parse_env(value: Any, field: str = "env") -> dict[str, str]:
    """Variable names to string values (``str(10)`` is easy to write; None or a dict is a mistake)."""
    if value is None:
        return {}
    forms = "a dict of variable names (letters, digits, _) to string values, e.g. {'EPOCHS': '20'}"
    if not isinstance(value, dict):
        raise ValueError(f"{field}={value!r} is not valid: use {forms}")
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key, re.ASCII):
            raise ValueError(f"{field} is not valid: the name {key!r} is not a variable name; use {forms}")
        if key.startswith("CLOUDTRAIN_"):
            raise ValueError(
                f"{field}[{key!r}] is not valid: names starting with CLOUDTRAIN_ are set by the agent "
                "(the run id, the work item, ...); use another name"
            )
        if not isinstance(item, str):
            raise ValueError(f"{field}[{key!r}]={item!r} is not a string: use {forms} (write {str(item)!r})")
        if "\x00" in item:
            raise ValueError(
                f"{field}[{key!r}]={item!r} is not valid: an environment variable cannot hold a NUL "
                f"character; use {forms}"
            )
    return dict(value)


def parse_command(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise ValueError(
            f"command={value!r} is not valid: give the shell command to run, e.g. 'python train.py'"
        )
    return value


def parse_ram(value: Any) -> int | None:
    """MiB, at least 512 as asked, rounded up to 256 MiB (``spec.parse_ram_mib``, the CLI's rule too)."""
    if value is None or value == "":
        return None
    return parse_ram_mib(value)


def parse_hdd(value: Any) -> int | None:
    """Whole GiB, 10 GiB to 64 TiB (a bare number is GiB)."""
    if value is None or value == "":
        return None
    gib = Hardware(hdd=value).hdd_gib or 0
    if gib < MIN_HDD_GIB:
        raise ValueError(
            f"hdd={value!r} is {gib} GiB, too small: it is the root disk and holds the OS image "
            f"(8-10 GiB, more for GPU images); ask for at least {MIN_HDD_GIB} GiB, e.g. hdd='100g' "
            "(a bare number is GiB; left out, the disk is 50 GiB)"
        )
    if gib > MAX_HDD_GIB:
        raise ValueError(
            f"hdd={value!r} is {gib} GiB: at most {MAX_HDD_GIB} GiB (64 TiB, the largest EBS volume / "
            "persistent disk); a bare number is GiB, e.g. hdd='200g'"
        )
    return gib


def parse_bid(value: Any) -> Bid | None:
    return None if value in (None, "") else Bid(value)


# A container image reference (registry/name:tag or @digest), for every operator that takes an image.
IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")


def parse_image(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not IMAGE_RE.fullmatch(value):
        raise ValueError(
            f"image={value!r} is not valid: use a container image reference such as "
            "'pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime' (the command runs inside it)"
        )
    return value


def check_bid_use(cloud: str, bid: Bid | None) -> None:
    """A bid is legal everywhere (forms send one) but does something on ec2spot only: warn."""
    if bid is None:
        return
    if cloud == "gcspot":
        from airflow_cloudtrain.catalog.select import _warn_bid_on_gcspot

        _warn_bid_on_gcspot(bid)
    elif cloud not in SPOT_CLOUDS:
        checks.warn_user(
            f"bid={bid.raw!r} has no effect on cloud={cloud!r}: on-demand instances have no bid "
            "(use cloud='ec2spot' to run on spot capacity at most at that price)"
        )


def _fields(cloud: str | None) -> dict[str, Callable[[Any], Any]]:
    """Each argument's parser; the cloud-dependent ones do only cloud-free checks while ``cloud``
    is still a template."""
    return {
        "cloud": parse_cloud,
        "command": parse_command,
        "bucket": lambda v: parse_bucket(v, cloud),
        "cpus": lambda v: parse_count(1 if v is None else v, "cpus", 1, MAX_CPUS),
        "gpus": lambda v: parse_count(0 if v is None else v, "gpus", 0, MAX_GPUS),
        "ram": parse_ram,
        "hdd": parse_hdd,
        "gpu_type": lambda v: checks.parse_gpu_type(v, cloud),
        "bid": parse_bid,
        "code": lambda v: parse_code(v, cloud),
        "setup_cmds": parse_setup_cmds,
        "env": parse_env,
        "max_runtime": parse_max_runtime,
        "instance_type": lambda v: checks.parse_instance_type(v, cloud),
        "region": lambda v: checks.parse_region(v, cloud),
        "zone": lambda v: checks.parse_zone(v, cloud),
        "image": parse_image,
    }


HARDWARE_FIELDS = ("cpus", "gpus", "ram", "hdd", "gpu_type")


def _hardware(args: dict[str, Any]) -> Hardware:
    return Hardware(
        1 if args.get("cpus") is None else args["cpus"],
        0 if args.get("gpus") is None else args["gpus"],
        args.get("ram") or None,
        args.get("hdd") or None,
        args.get("gpu_type"),
    )


def _known_items(value: Any, templated: Callable[[Any], bool]) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not templated(k) and not templated(v)}
    if isinstance(value, (list, tuple)):
        return [v for v in value if not templated(v)]
    return None


def check_run_args(args: dict[str, Any], rendered: bool = False) -> RunConfig | None:
    """Check what is known now: each argument that is not a template, and each combination whose
    arguments are all known (``rendered``: all are). Returns the config once everything is known."""
    templated = (lambda v: False) if rendered else checks.is_deferred_value
    cloud = None if templated(args.get("cloud")) else parse_cloud(args.get("cloud"))
    parsed = checks.check_known(args, _fields(cloud), templated=templated)
    for name, parse in (("env", parse_env), ("setup_cmds", parse_setup_cmds)):
        if templated(args.get(name)):  # a dict/list with some templated items: check the others
            parse(_known_items(args.get(name), templated))
    if cloud is None:
        return None
    combos: list[tuple[tuple[str, ...], Callable[[], Any]]] = [
        (("region", "zone"), lambda: checks.check_zone_in_region(cloud, parsed["region"], parsed["zone"])),
        (
            (*HARDWARE_FIELDS, "instance_type"),
            lambda: checks.check_request_in_catalog(cloud, _hardware(args), args),
        ),
        (("bid",), lambda: check_bid_use(cloud, parsed["bid"])),
        (
            (*HARDWARE_FIELDS, "instance_type", "region", "zone"),
            lambda: checks.check_instance_type_fits(
                cloud, parsed["instance_type"], _hardware(args), parsed["region"], parsed["zone"]
            ),
        ),
    ]
    checks.check_known(args, {}, combos, templated=templated)
    if any(templated(args.get(name)) for name in _fields(cloud)):
        return None
    return _config(args, cloud, parsed)


def _config(args: dict[str, Any], cloud: str, parsed: dict[str, Any]) -> RunConfig:
    return RunConfig(
        cloud=cloud,
        command=parsed["command"],
        bucket=parsed["bucket"],
        hardware=_hardware(args),
        bid=parsed["bid"],
        code=parsed["code"],
        setup_cmds=parsed["setup_cmds"],
        env=parsed["env"],
        max_runtime_s=parsed["max_runtime"],
        instance_type=parsed["instance_type"],
        region=parsed["region"],
        zone=parsed["zone"],
        image=parsed["image"],
    )


def parse_config(args: dict[str, Any]) -> RunConfig:
    """Parse everything (the rendered values); raises ValueError naming the field on the first bad value."""
    config = check_run_args(args, rendered=True)
    assert config is not None
    return config

"""The emulated Vertex AI's rules for a new CustomJob: what ``customJobs.create`` refuses with 400
INVALID_ARGUMENT, and the job spec as the service echoes it back (defaults filled, enums by name).

Errors are listed as Vertex lists them, all at once, each naming the field in the API's snake_case::

    List of found errors:\t1.Field: job_spec.worker_pool_specs[0].replica_count; Message: ...\t

The REST clients send enums as numbers (the GAPIC REST transport asks ``$alt=json;enum-encoding=int``
and serializes with ``use_integers_for_enums``) and int64 fields as strings; both forms are read here,
and the echo writes enum names and int64 as strings, as the API's JSON does.

Machine types: Compute Engine names of the families Vertex AI training offers (n1, n2, e2, c2 standard/
highmem/highcpu; a2-highgpu/ultragpu/megagpu, g2-standard, a3-highgpu; ``cloud-tpu``), each family with
the accelerators it takes and, for the accelerator-optimized ones, the count its name fixes. Not
checked: quotas, regional availability of a type, reservations, disk types and sizes, networks,
service accounts, TPU topologies.
"""

from __future__ import annotations

import copy
import re
from typing import Any

__all__ = ["ACCELERATORS", "STRATEGIES", "Invalid", "check_custom_job", "duration_s"]

# google.cloud.aiplatform.v1.AcceleratorType: number -> name (the REST transport sends numbers)
ACCELERATORS = {
    0: "ACCELERATOR_TYPE_UNSPECIFIED",
    1: "NVIDIA_TESLA_K80",
    2: "NVIDIA_TESLA_P100",
    3: "NVIDIA_TESLA_V100",
    4: "NVIDIA_TESLA_P4",
    5: "NVIDIA_TESLA_T4",
    6: "TPU_V2",
    7: "TPU_V3",
    8: "NVIDIA_TESLA_A100",
    9: "NVIDIA_A100_80GB",
    10: "TPU_V4_POD",
    11: "NVIDIA_L4",
    12: "TPU_V5_LITEPOD",
    13: "NVIDIA_H100_80GB",
}
# google.cloud.aiplatform.v1.Scheduling.Strategy
STRATEGIES = {
    0: "STRATEGY_UNSPECIFIED",
    1: "ON_DEMAND",
    2: "LOW_COST",
    3: "STANDARD",
    4: "SPOT",
    6: "FLEX_START",
}
MAX_POOLS = 4
MAX_LABELS = 64
_SUPPORTED = {
    "NVIDIA_TESLA_T4",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_L4",
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_H100_80GB",
    "TPU_V2",
    "TPU_V3",
}
_N1_GPUS = {"NVIDIA_TESLA_T4", "NVIDIA_TESLA_V100", "NVIDIA_TESLA_P100", "NVIDIA_TESLA_P4"}
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}  # g2-standard-N -> its L4 count
_LABEL = re.compile(r"[a-z0-9_-]{0,64}")
_LABEL_KEY = re.compile(r"[a-z0-9_-]{1,64}")
_DURATION = re.compile(r"(\d+)(\.\d{1,9})?s")


class Invalid(Exception):
    """The request's faults, one ``(field, message)`` each."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        found = "".join(f"{n}.Field: {f}; Message: {m}\t" for n, (f, m) in enumerate(errors, 1))
        super().__init__(f"List of found errors:\t{found}")


def _family(machine_type: str) -> tuple[set[str], int | None, bool] | None:
    """(accelerators the type takes, the count its name fixes or None, whether one is required);
    None for a machine type Vertex AI training does not offer."""
    sizes = {
        "n1": r"(standard|highmem|highcpu)-(1|2|4|8|16|32|64|96)",
        "n2": r"(standard|highmem|highcpu)-(2|4|8|16|32|48|64|80|96|128)",
        "e2": r"(standard|highmem|highcpu)-(2|4|8|16|32)",
        "c2": r"standard-(4|8|16|30|60)",
    }
    prefix, _, rest = machine_type.partition("-")
    if prefix in sizes and re.fullmatch(sizes[prefix], rest):
        return (_N1_GPUS if prefix == "n1" else set()), None, False
    if m := re.fullmatch(r"a2-(highgpu|ultragpu)-(1|2|4|8)g", machine_type):
        gpu = "NVIDIA_TESLA_A100" if m.group(1) == "highgpu" else "NVIDIA_A100_80GB"
        return {gpu}, int(m.group(2)), True
    if machine_type == "a2-megagpu-16g":
        return {"NVIDIA_TESLA_A100"}, 16, True
    if (m := re.fullmatch(r"g2-standard-(\d+)", machine_type)) and int(m.group(1)) in _G2_GPUS:
        return {"NVIDIA_L4"}, _G2_GPUS[int(m.group(1))], True
    if machine_type == "a3-highgpu-8g":
        return {"NVIDIA_H100_80GB"}, 8, True
    if machine_type == "cloud-tpu":
        return {"TPU_V2", "TPU_V3"}, 8, True
    return None


def _enum(value: Any, names: dict[int, str]) -> str | None:
    """An enum field given by name or number -> its name (None: neither)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return names.get(int(value))
    return value if isinstance(value, str) and value in names.values() else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return None


def duration_s(value: Any) -> float | None:
    """A Duration in JSON (``"86400s"``, ``"1.5s"``) -> seconds; None when it is not one."""
    m = _DURATION.fullmatch(value) if isinstance(value, str) else None
    return int(m.group(1)) + float(m.group(2) or 0) if m else None


def _machine(spec: dict[str, Any], at: str, errors: list[tuple[str, str]]) -> None:
    """Check (and normalize in place) a pool's ``machineSpec``."""
    machine = spec.get("machineSpec")
    if not isinstance(machine, dict) or not machine.get("machineType"):
        errors.append((f"{at}.machine_spec.machine_type", "Required field is not set."))
        return
    mtype = str(machine["machineType"])
    family = _family(mtype)
    if family is None:
        errors.append((f"{at}.machine_spec.machine_type", f'Machine type "{mtype}" is not supported.'))
        return
    allowed, fixed, required = family
    raw, count = machine.get("acceleratorType"), _int(machine.get("acceleratorCount"))
    accel = _enum(raw, ACCELERATORS) if raw not in (None, "", 0, "0") else "ACCELERATOR_TYPE_UNSPECIFIED"
    if accel is None or (accel != "ACCELERATOR_TYPE_UNSPECIFIED" and accel not in _SUPPORTED):
        errors.append(
            (f"{at}.machine_spec.accelerator_type", f'Accelerator type "{accel or raw}" is not supported.')
        )
        return
    if accel != "ACCELERATOR_TYPE_UNSPECIFIED":
        machine["acceleratorType"] = accel
    if count is None or count < 0:
        errors.append(
            (f"{at}.machine_spec.accelerator_count", "Accelerator count must be a positive integer.")
        )
    elif accel == "ACCELERATOR_TYPE_UNSPECIFIED":
        if count:
            errors.append((f"{at}.machine_spec.accelerator_type", "Accelerator count set without a type."))
        elif required:
            errors.append(
                (f"{at}.machine_spec.accelerator_type", f'Machine type "{mtype}" requires an accelerator.')
            )
    elif accel not in allowed:
        message = f'Accelerator "{accel}" is not supported for machine type "{mtype}".'
        errors.append((f"{at}.machine_spec.accelerator_type", message))
    elif count == 0:
        errors.append((f"{at}.machine_spec.accelerator_count", "Accelerator count must be positive."))
    elif (fixed is not None and count != fixed) or (fixed is None and count not in (1, 2, 4, 8)):
        want = fixed if fixed is not None else "1, 2, 4 or 8"
        message = f'Machine type "{mtype}" takes {want} {accel} accelerators; got {count}.'
        errors.append((f"{at}.machine_spec.accelerator_count", message))


def _code(spec: dict[str, Any], at: str, errors: list[tuple[str, str]]) -> None:
    """Exactly one of ``containerSpec`` / ``pythonPackageSpec``, each with what it needs."""
    container, package = spec.get("containerSpec"), spec.get("pythonPackageSpec")
    if bool(container) == bool(package):
        message = "Exactly one of container_spec or python_package_spec must be set."
        errors.append((f"{at}.task", message))
        return
    if container:
        if not isinstance(container, dict) or not container.get("imageUri"):
            errors.append((f"{at}.container_spec.image_uri", "Required field is not set."))
        return
    if not isinstance(package, dict):
        errors.append((f"{at}.python_package_spec", "Invalid value."))
        return
    for key, name in (
        ("executorImageUri", "executor_image_uri"),
        ("packageUris", "package_uris"),
        ("pythonModule", "python_module"),
    ):
        if not package.get(key):
            errors.append((f"{at}.python_package_spec.{name}", "Required field is not set."))
    uris = package.get("packageUris") or []
    if not isinstance(uris, list) or not all(isinstance(u, str) and u.startswith("gs://") for u in uris):
        errors.append((f"{at}.python_package_spec.package_uris", "Package URIs must be gs:// paths."))


def _pools(spec: dict[str, Any], errors: list[tuple[str, str]]) -> None:
    pools = spec.get("workerPoolSpecs")
    if not isinstance(pools, list) or not pools:
        errors.append(("job_spec.worker_pool_specs", "Required field is not set."))
        return
    if len(pools) > MAX_POOLS:
        errors.append(("job_spec.worker_pool_specs", f"At most {MAX_POOLS} worker pools are allowed."))
    for i, pool in enumerate(pools):
        at = f"job_spec.worker_pool_specs[{i}]"
        if not isinstance(pool, dict):
            errors.append((at, "Invalid value."))
            continue
        if not pool:  # {}: an unused pool (e.g. no workers, but parameter servers)
            if i == 0:
                errors.append((at, "The first worker pool (the primary replica) must be set."))
            continue
        count = _int(pool.get("replicaCount"))
        if i == 0 and count != 1:
            errors.append((f"{at}.replica_count", "The first worker pool's replica count must be 1."))
        elif count is None or count < 1:
            errors.append((f"{at}.replica_count", "Replica count must be a positive integer."))
        else:
            pool["replicaCount"] = str(count)  # int64: a string in JSON
        _machine(pool, at, errors)
        _code(pool, at, errors)
        pool.setdefault("diskSpec", {})
        pool["diskSpec"].setdefault("bootDiskType", "pd-ssd")
        pool["diskSpec"].setdefault("bootDiskSizeGb", 100)


def _scheduling(spec: dict[str, Any], errors: list[tuple[str, str]]) -> None:
    scheduling = spec.get("scheduling")
    if scheduling is None:
        return
    if not isinstance(scheduling, dict):
        errors.append(("job_spec.scheduling", "Invalid value."))
        return
    if "timeout" in scheduling and not duration_s(scheduling["timeout"]):
        errors.append(("job_spec.scheduling.timeout", f"Invalid duration {scheduling['timeout']!r}."))
    if "strategy" in scheduling:
        strategy = _enum(scheduling["strategy"], STRATEGIES)
        if strategy is None:
            errors.append(("job_spec.scheduling.strategy", f"Invalid value {scheduling['strategy']!r}."))
        else:
            scheduling["strategy"] = strategy
    restart = scheduling.get("restartJobOnWorkerRestart", False)
    if not isinstance(restart, bool):
        errors.append(("job_spec.scheduling.restart_job_on_worker_restart", "Invalid value: not a bool."))


def _labels(labels: Any, errors: list[tuple[str, str]]) -> None:
    if not isinstance(labels, dict):
        errors.append(("labels", "Invalid value."))
        return
    if len(labels) > MAX_LABELS:
        errors.append(("labels", f"At most {MAX_LABELS} labels are allowed."))
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(str(key)) or not isinstance(value, str) or not _LABEL.fullmatch(value):
            message = (
                f'Invalid label "{key}": "{value}". Label keys and values can be no longer than 64 '
                "characters and can only contain lowercase letters, numeric characters, underscores "
                "and dashes; keys cannot be empty."
            )
            errors.append((f"labels[{key}]", message))


def check_custom_job(body: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A create body -> (display name, job spec as echoed, labels); ``Invalid`` lists every fault."""
    errors: list[tuple[str, str]] = []
    display_name = body.get("displayName")
    if not isinstance(display_name, str) or not display_name.strip():
        errors.append(("display_name", "Required field is not set."))
    elif len(display_name) > 128:
        errors.append(("display_name", "Display name can be at most 128 characters."))
    spec = copy.deepcopy(body.get("jobSpec"))
    if not isinstance(spec, dict):
        errors.append(("job_spec.worker_pool_specs", "Required field is not set."))
        spec = {}
    else:
        _pools(spec, errors)
        _scheduling(spec, errors)
        prefix = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
        if "baseOutputDirectory" in spec and not (isinstance(prefix, str) and prefix.startswith("gs://")):
            message = f"Output URI prefix must be a gs:// path; got {prefix!r}."
            errors.append(("job_spec.base_output_directory.output_uri_prefix", message))
    labels = body.get("labels") or {}
    _labels(labels, errors)
    if errors:
        raise Invalid(errors)
    return str(display_name), spec, {str(k): str(v) for k, v in labels.items()}

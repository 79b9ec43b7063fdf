"""MLEngineTrainOperator's arguments, checked: every bad value fails at DAG parse time naming its field.

Pure (no cloud calls, no Google SDK): ``parse_job_config`` runs in the operator's constructor when no
argument is templated, and again at execute on the rendered values.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_cloudtrain.contract.clouds import Provider
    from airflow_cloudtrain.mlengine import ReplicaPool
    from airflow_cloudtrain.mlengine.job import JobConfig

# MLEngineTrainOperator's module imports this one for ``VOCABULARY_ARGS``: the translation
# (``mlengine``) and the shared checks are imported by the functions that use them, at construction.

# ML Engine's job id rule (the detector's --job-id): letters, digits and underscores, starting with a
# letter, at most 128 characters. It names the job folder, so it must be a safe path component too.
JOB_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
REGION_RE = re.compile(r"[a-z]+-[a-z]+\d+", re.ASCII)
MAX_RUNTIME_DEFAULT = "7d"  # Vertex's own default timeout is 7 days
# Vertex's prebuilt training containers for python packages (ML Engine's runtime versions are gone).


def vertex_storage() -> Provider:
    """Vertex AI is a Google Cloud service: its packages and job folders are on that provider's storage."""
    from airflow_cloudtrain.contract.clouds import PROVIDERS

    return PROVIDERS["gcp"]


VOCABULARY_ARGS = (
    "scale_tier",
    "master_type",
    "worker_type",
    "worker_count",
    "parameter_server_type",
    "parameter_server_count",
    "evaluator_type",
    "evaluator_count",
    "master_accelerator",
    "worker_accelerator",
    "parameter_server_accelerator",
    "evaluator_accelerator",
)


def check_job_id(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not JOB_ID_RE.fullmatch(value):
        raise ValueError(
            f"{name}={value!r} is not a valid job id: use letters, digits and underscores, starting with "
            "a letter, at most 128 characters (as Cloud ML Engine required), e.g. 'train_20261123_0930'"
        )
    return value


def _str_list(value: Any, name: str) -> list[str]:
    forms = "a list of strings, e.g. ['--epochs', '10'] (or one shell-quoted string, '--epochs 10')"
    if value is None:
        return []
    if isinstance(value, str):
        try:
            items: list[Any] = shlex.split(value)
        except ValueError as err:  # "No closing quotation"
            raise ValueError(f"{name}={value!r} is not valid: {err}; use {forms}") from None
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError(f"{name}={value!r} is not valid: use {forms}")
    for item in items:
        ok = isinstance(item, str) or (
            isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item)
        )
        if not ok or "\x00" in str(item):
            raise ValueError(f"{name}={value!r} is not valid: {item!r} is not an argument; use {forms}")
    return [str(v) for v in items]


def _code(value: Any) -> tuple[str | None, list[str]]:
    """``code``: a local folder, or one or more gs:// package URIs."""
    if value is None or value == "":
        return None, []
    uris = [value] if isinstance(value, str) else value
    if not isinstance(uris, (list, tuple)) or not uris or not all(isinstance(u, str) for u in uris):
        raise ValueError(f"code={value!r} is not valid: use a local folder or gs:// package URI(s)")
    if all(u.startswith(vertex_storage().uri_prefix) for u in uris):
        bad = [u for u in uris if not u.endswith((".tar.gz", ".tgz", ".zip", ".whl"))]
        if bad:
            raise ValueError(
                f"code={bad[0]!r} is not a Python package Vertex AI can install: use a source "
                "distribution (.tar.gz) or wheel (.whl) in gs://, or a local folder to package"
            )
        return None, list(uris)
    if len(uris) == 1 and "://" not in uris[0]:
        if not Path(uris[0]).expanduser().is_dir():
            raise ValueError(
                f"code={value!r} is not valid: no such local folder (looked up from {Path.cwd()}); use a "
                "local folder to package (an absolute path next to the DAG file is safest) or gs:// package URI(s)"
            )
        return uris[0], []
    raise ValueError(
        f"code={value!r} is not valid: use one local folder (packaged and uploaded) or gs:// package URIs"
    )


def _bool(value: Any, name: str) -> bool:
    """True/False, or the text a rendered template gives ("True", "false")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{name}={value!r} is not valid: use True or False")


def _region(value: Any) -> str:
    if not isinstance(value, str) or not REGION_RE.fullmatch(value):
        raise ValueError(
            f"region={value!r} is not a valid Vertex AI region: use a region name such as 'us-central1'"
        )
    return value


def _bucket(value: Any) -> str:
    from airflow_cloudtrain.operators.config import parse_bucket

    try:
        return parse_bucket(value, vertex_storage().clouds[0])  # the job folders are on Google Cloud Storage
    except ValueError as err:
        if isinstance(value, str) and value.startswith(vertex_storage().uri_prefix):
            raise ValueError(f"{err} (each job's folder goes under it: <bucket>/<job_id>/)") from None
        raise ValueError(
            f"bucket={value!r} is not valid: use a gs:// URI such as 'gs://my-bucket/jobs' "
            "(each job's folder goes under it: <bucket>/<job_id>/)"
        ) from None


def _module(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", value, re.ASCII):
        raise ValueError(
            f"python_module={value!r} is not valid: use a dotted module name such as 'trainer.task'"
        )
    return value


def _image(value: Any, name: str) -> str | None:
    from airflow_cloudtrain.operators.config import IMAGE_RE

    if value is None or value == "":
        return None
    if not isinstance(value, str) or not IMAGE_RE.fullmatch(value):
        raise ValueError(
            f"{name}={value!r} is not a container image URI such as "
            "'us-docker.pkg.dev/my-project/train/trainer:1'"
        )
    return value


def _max_runtime(value: Any) -> float | None:
    from airflow_cloudtrain.operators.checks import parse_duration

    if isinstance(value, str) and value.strip().lower() == "unlimited":
        return None
    return parse_duration(
        value if value not in (None, "") else MAX_RUNTIME_DEFAULT,
        "max_runtime",
        ", or 'unlimited' (no cap; left out, Vertex stops a job after 7 days)",
    )


def _env(value: Any) -> dict[str, str]:
    from airflow_cloudtrain.operators.config import parse_env

    return parse_env(value)


def _optional_str(value: Any, name: str, pattern: str, forms: str) -> str | None:
    from airflow_cloudtrain.operators.checks import check_optional_str

    return check_optional_str(value, name, pattern, forms)


def _project_id(value: Any) -> str | None:
    from airflow_cloudtrain.operators.checks import parse_project_id

    return parse_project_id(value)


FIELDS: dict[str, Callable[[Any], Any]] = {
    "region": _region,
    "bucket": _bucket,
    "code": _code,
    "python_module": _module,
    "image": lambda v: _image(v, "image"),
    "training_args": lambda v: _str_list(v, "training_args"),
    "command": lambda v: _str_list(v, "command"),
    "env": lambda v: _env(v),
    "executor_image": lambda v: _image(v, "executor_image"),
    "job_id": lambda v: check_job_id(v, "job_id"),
    "resume_from": lambda v: check_job_id(v, "resume_from"),
    "spot": lambda v: _bool(False if v is None else v, "spot"),
    "max_runtime": _max_runtime,
    "service_account": lambda v: _optional_str(
        v,
        "service_account",
        r"[^@\s]+@[^@\s]+\.[a-z.]+",
        "a service account e-mail such as 'trainer@my-project.iam.gserviceaccount.com'",
    ),
    "project_id": lambda v: _project_id(v),
}


def _check_program(parsed: dict[str, Any]) -> None:
    """python_module + code, or image + command: never a mix."""
    (code_dir, packages), python_module, image = parsed["code"], parsed["python_module"], parsed["image"]
    if python_module and image:
        raise ValueError(
            "python_module and image are exclusive: give python_module (+ code, a Python package) or "
            "image (+ command, a custom container)"
        )
    if not python_module and not image:
        raise ValueError(
            "give python_module= (with code=, the package holding it) or image= (a custom container "
            "image, with command=)"
        )
    if python_module:
        if not code_dir and not packages:
            raise ValueError(
                f"python_module={python_module!r} needs code=: the local folder or gs:// package holding it"
            )
        if parsed["command"]:
            raise ValueError(
                "command= goes with image= (a custom container); with python_module use training_args="
            )
    elif code_dir or packages:
        raise ValueError(
            "code= goes with python_module= (a Python package); a custom container image carries its code"
        )


def check_job_args(args: dict[str, Any], rendered: bool = False) -> JobConfig | None:
    """Each argument known now, and each combination of known ones (``rendered``: all are known);
    the config once everything is known. ValueError names the first bad field."""
    from airflow_cloudtrain.mlengine.tiers import resolve_pools
    from airflow_cloudtrain.operators.checks import check_known, is_deferred_value

    templated = (lambda v: False) if rendered else is_deferred_value
    parsed = check_known(args, FIELDS, templated=templated)
    pools: list[ReplicaPool] = []
    combos: list[tuple[tuple[str, ...], Callable[[], Any]]] = [
        (
            VOCABULARY_ARGS,
            lambda: pools.extend(
                resolve_pools(**{k: args[k] for k in VOCABULARY_ARGS if args.get(k) is not None})
            ),
        ),
        (("code", "python_module", "image", "command"), lambda: _check_program(parsed)),
    ]
    check_known(args, {}, combos, templated=templated)
    if any(templated(args.get(name)) for name in (*FIELDS, *VOCABULARY_ARGS)):
        return None
    spot = parsed["spot"]
    restart = args.get("restart_job_on_worker_restart")
    # A Spot replica that is preempted comes back alone; distributed TensorFlow (parameter servers) only
    # recovers when the whole cluster restarts together, so that is the default for Spot clusters.
    restart_all = (
        (spot and sum(p.count for p in pools) > 1)
        if restart is None
        else _bool(restart, "restart_job_on_worker_restart")
    )
    from airflow_cloudtrain.mlengine.job import JobConfig

    code_dir, packages = parsed["code"]
    return JobConfig(
        region=parsed["region"],
        bucket=parsed["bucket"],
        pools=pools,
        python_module=parsed["python_module"],
        packages=packages,
        code_dir=code_dir,
        training_args=parsed["training_args"],
        image=parsed["image"],
        command=parsed["command"],
        env=parsed["env"],
        executor_image=parsed["executor_image"],
        job_id=parsed["job_id"],
        resume_from=parsed["resume_from"],
        spot=spot,
        restart_job_on_worker_restart=restart_all,
        max_runtime_s=parsed["max_runtime"],
        service_account=parsed["service_account"],
        project_id=parsed["project_id"] or None,
    )


def parse_job_config(args: dict[str, Any]) -> JobConfig:
    """Check every argument (``args``: the operator's rendered argument names); ValueError names the field."""
    config = check_job_args(args, rendered=True)
    assert config is not None
    return config

"""MLEngineTrainOperator's arguments, checked: every bad value fails at DAG parse time naming its field.

Pure (no cloud calls, no Google SDK): ``parse_job_config`` runs in the operator's constructor when no
argument is templated, and again at execute on the rendered values.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from airflow_cloudtrain.mlengine import ReplicaPool, resolve_pools
from airflow_cloudtrain.operators.config import parse_bucket, parse_duration

# ML Engine's job id rule (the detector's --job-id): letters, digits and underscores, starting with a
# letter, at most 128 characters. It names the job folder, so it must be a safe path component too.
JOB_ID_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
REGION_RE = re.compile(r"[a-z]+-[a-z]+\d+")
MAX_RUNTIME_DEFAULT = "7d"  # Vertex's own default timeout is 7 days
# Vertex's prebuilt training containers for python packages (ML Engine's runtime versions are gone).
EXECUTOR_CPU = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
EXECUTOR_GPU = "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"

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


@dataclass
class JobConfig:
    """The rendered, checked arguments of one MLEngineTrainOperator."""

    region: str
    bucket: str
    pools: list[ReplicaPool]
    python_module: str | None = None
    packages: list[str] = field(default_factory=list)  # gs:// package URIs given as they are
    code_dir: str | None = None  # a local folder to package and upload
    training_args: list[str] = field(default_factory=list)
    image: str | None = None
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    executor_image: str | None = None
    job_id: str | None = None
    resume_from: str | None = None
    spot: bool = False
    restart_job_on_worker_restart: bool = False
    max_runtime_s: float | None = None
    service_account: str | None = None
    project_id: str | None = None

    @property
    def has_gpu(self) -> bool:
        return any(p.machine.accelerator_type and "TPU" not in p.machine.accelerator_type for p in self.pools)


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
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"{name}={value!r} is not valid: use a list of strings (or one shell-quoted string)")


def _code(value: Any) -> tuple[str | None, list[str]]:
    """``code``: a local folder, or one or more gs:// package URIs."""
    if value is None or value == "":
        return None, []
    uris = [value] if isinstance(value, str) else value
    if not isinstance(uris, (list, tuple)) or not uris or not all(isinstance(u, str) for u in uris):
        raise ValueError(f"code={value!r} is not valid: use a local folder or gs:// package URI(s)")
    if all(u.startswith("gs://") for u in uris):
        bad = [u for u in uris if not u.endswith((".tar.gz", ".tgz", ".zip", ".whl"))]
        if bad:
            raise ValueError(
                f"code={bad[0]!r} is not a Python package Vertex AI can install: use a source "
                "distribution (.tar.gz) or wheel (.whl) in gs://, or a local folder to package"
            )
        return None, list(uris)
    if len(uris) == 1 and "://" not in uris[0]:
        return uris[0], []
    raise ValueError(
        f"code={value!r} is not valid: use one local folder (packaged and uploaded) or gs:// package URIs"
    )


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in value
    ):
        raise ValueError(f"env={value!r} is not valid: use a dict of variable names to string values")
    return {k: str(v) for k, v in value.items()}


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{name}={value!r} is not valid: use True or False")


def parse_job_config(args: dict[str, Any]) -> JobConfig:
    """Check every argument (``args``: the operator's argument names); ValueError names the field."""
    region = args.get("region")
    if not isinstance(region, str) or not REGION_RE.fullmatch(region):
        raise ValueError(f"region={region!r} is not a valid Vertex AI region: use e.g. 'us-central1'")
    try:
        bucket = parse_bucket(args.get("bucket"), "gcloud")
    except ValueError:
        raise ValueError(
            f"bucket={args.get('bucket')!r} is not valid: use a gs:// URI such as 'gs://my-bucket/jobs' "
            "(each job's folder goes under it: <bucket>/<job_id>/)"
        ) from None
    pools = resolve_pools(**{k: args.get(k) for k in VOCABULARY_ARGS if args.get(k) is not None})
    code_dir, packages = _code(args.get("code"))
    python_module, image = args.get("python_module"), args.get("image")
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
        if not isinstance(python_module, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", python_module):
            raise ValueError(f"python_module={python_module!r} is not a module name such as 'trainer.task'")
        if not code_dir and not packages:
            raise ValueError(
                f"python_module={python_module!r} needs code=: the local folder or gs:// package holding it"
            )
        if args.get("command"):
            raise ValueError(
                "command= goes with image= (a custom container); with python_module use training_args="
            )
    else:
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"image={image!r} is not a container image URI")
        if code_dir or packages:
            raise ValueError(
                "code= goes with python_module= (a Python package); a custom container image carries its code"
            )
    spot = _bool(args.get("spot", False), "spot")
    restart = args.get("restart_job_on_worker_restart")
    # A Spot replica that is preempted comes back alone; distributed TensorFlow (parameter servers) only
    # recovers when the whole cluster restarts together, so that is the default for Spot clusters.
    restart_all = (
        (spot and sum(p.count for p in pools) > 1)
        if restart is None
        else _bool(restart, "restart_job_on_worker_restart")
    )
    job_id = check_job_id(args.get("job_id"), "job_id")
    resume_from = check_job_id(args.get("resume_from"), "resume_from")
    max_runtime = args.get("max_runtime")
    return JobConfig(
        region=region,
        bucket=bucket,
        pools=pools,
        python_module=python_module or None,
        packages=packages,
        code_dir=code_dir,
        training_args=_str_list(args.get("training_args"), "training_args"),
        image=image or None,
        command=_str_list(args.get("command"), "command"),
        env=_env(args.get("env")),
        executor_image=args.get("executor_image") or None,
        job_id=job_id,
        resume_from=resume_from,
        spot=spot,
        restart_job_on_worker_restart=restart_all,
        max_runtime_s=None
        if max_runtime == "unlimited"
        else parse_duration(max_runtime if max_runtime is not None else MAX_RUNTIME_DEFAULT, "max_runtime"),
        service_account=args.get("service_account") or None,
        project_id=args.get("project_id") or None,
    )

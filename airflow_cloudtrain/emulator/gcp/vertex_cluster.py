"""An emulated Vertex AI job's cluster: its replicas, their addresses and the environment Vertex gives
each, and what each replica's machine runs (``vertex_run.py`` with a launch file).

Per replica (pool i, replica k: task ``workerpool{i}-{k}``), as on Vertex AI:

* ``CLUSTER_SPEC``: ``{"cluster": {"workerpool0": ["host:port"], ...}, "environment": "cloud",
  "task": {"type": "workerpool0", "index": 0}, "job": "<the job spec, JSON, snake_case>"}``;
  pools left empty (``{}``) are not in the cluster.
* ``TF_CONFIG``: the same cluster under TensorFlow's names (pool 0 ``chief``, 1 ``worker``, 2 ``ps``,
  3 ``evaluator``; evaluators are not in ``cluster``), the task by those names.
* ``AIP_MODEL_DIR`` / ``AIP_CHECKPOINT_DIR`` / ``AIP_TENSORBOARD_LOG_DIR`` (``<prefix>/model/``,
  ``checkpoints/``, ``logs/``) when ``baseOutputDirectory`` is set; ``CLOUD_ML_JOB_ID`` (the numeric
  id), ``CLOUD_ML_PROJECT_ID``; then the spec's own ``env``.
* What the emulation adds: ``STORAGE_EMULATOR_HOST`` / ``GOOGLE_CLOUD_PROJECT`` (so
  ``google.cloud.storage`` in the job writes to the emulated GCS), ``PYTHONUNBUFFERED=1``.

Hosts are all 127.0.0.1, each replica with its own free port (the real ones are per-replica host
names, port 2222); the addresses stay the same when a replica restarts.

What runs: a ``pythonPackageSpec`` runs ``python -m <pythonModule> <args>`` with this Python after its
packages are unpacked (``vertex_run``: no pip, no network); a ``containerSpec`` runs ``command + args``
(``args`` alone when there is no command) directly, with the emulated image's environment (this
environment's Python first on PATH): no container runtime here, so ``imageUri`` and an image's own
entrypoint are not used, as the instances' side does for the agent's images.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Replica", "build_replicas", "launcher"]

TF_TYPES = ("chief", "worker", "ps", "evaluator")


def launcher() -> Path:
    """The program a replica's machine runs (by path)."""
    return Path(__file__).with_name("vertex_run.py")


@dataclass
class Replica:
    """One replica of a job and its attempts (a restart is a new attempt: a fresh process)."""

    task: str  # workerpool{i}-{k}
    pool: int
    index: int
    address: str  # host:port, as in CLUSTER_SPEC
    machine_type: str
    env: dict[str, str]
    launch: Path  # the launch file of vertex_run.py
    root: Path  # the replica's folder: one work dir per attempt under it
    attempt: int = 0
    restarts: int = 0
    running: bool = False  # shown to the runner (its current attempt)
    exit_code: int | None = None  # of the current attempt, once it exited on its own
    retired: list[str] = field(default_factory=list)  # runner ids of earlier attempts not yet gone

    def rid(self, job_id: str) -> str:
        """The runner's id of the current attempt's machine."""
        return f"vertex-{job_id}-{self.task}-a{self.attempt}"

    def workdir(self) -> Path:
        path = self.root / f"attempt-{self.attempt}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def _snake(value: Any) -> Any:
    """A JSON value with its keys in snake_case (as Vertex writes the job spec into CLUSTER_SPEC)."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held open until all are found)."""
    with contextlib.ExitStack() as stack:
        socks = []
        for _ in range(n):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]


def _command(pool: dict[str, Any]) -> dict[str, Any]:
    if package := pool.get("pythonPackageSpec"):
        return {
            "packages": list(package.get("packageUris") or []),
            "module": package["pythonModule"],
            "args": [str(a) for a in package.get("args") or []],
        }
    container = pool.get("containerSpec") or {}
    return {"argv": [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]}


def _spec_env(pool: dict[str, Any]) -> dict[str, str]:
    code = pool.get("pythonPackageSpec") or pool.get("containerSpec") or {}
    return {str(e["name"]): str(e.get("value", "")) for e in code.get("env") or [] if e.get("name")}


def build_replicas(
    job_id: str, project: str, spec: dict[str, Any], root: Path, extra_env: dict[str, str]
) -> dict[str, Replica]:
    """The replicas of a job that starts running, with their environment and launch files under
    ``root`` (the job's folder); ``extra_env``: the emulated endpoints."""
    pools = [(i, p) for i, p in enumerate(spec.get("workerPoolSpecs") or []) if p]
    counts = {i: int(p.get("replicaCount") or 1) for i, p in pools}
    ports = iter(_free_ports(sum(counts.values())))
    addresses = {i: [f"127.0.0.1:{next(ports)}" for _ in range(counts[i])] for i, _ in pools}
    job_text = json.dumps(_snake(spec))
    cluster = {f"workerpool{i}": addrs for i, addrs in addresses.items()}
    tf_cluster = {TF_TYPES[i]: addrs for i, addrs in addresses.items() if i < 3}
    output = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    base = {
        **extra_env,
        "GOOGLE_CLOUD_PROJECT": project,
        "CLOUD_ML_PROJECT_ID": project,
        "CLOUD_ML_JOB_ID": job_id,
        "PYTHONUNBUFFERED": "1",
    }
    if output:
        prefix = output.rstrip("/")
        base |= {
            "AIP_MODEL_DIR": f"{prefix}/model/",
            "AIP_CHECKPOINT_DIR": f"{prefix}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{prefix}/logs/",
        }
    replicas: dict[str, Replica] = {}
    for i, pool in pools:
        for k, address in enumerate(addresses[i]):
            task = f"workerpool{i}-{k}"
            cluster_spec = {
                "cluster": cluster,
                "environment": "cloud",
                "task": {"type": f"workerpool{i}", "index": k},
                "job": job_text,
            }
            tf_config = {
                "cluster": tf_cluster,
                "task": {"type": TF_TYPES[i], "index": k},
                "environment": "cloud",
                "job": job_text,
            }
            env = {
                **base,
                "CLUSTER_SPEC": json.dumps(cluster_spec),
                "TF_CONFIG": json.dumps(tf_config),
                **_spec_env(pool),
            }
            folder = root / task
            folder.mkdir(parents=True, exist_ok=True)
            launch = folder / "launch.json"
            launch.write_text(json.dumps({"log": str(root / "logs" / f"{task}.jsonl"), **_command(pool)}))
            machine = str((pool.get("machineSpec") or {}).get("machineType") or "")
            replicas[task] = Replica(task, i, k, address, machine, env, launch, folder)
    return replicas

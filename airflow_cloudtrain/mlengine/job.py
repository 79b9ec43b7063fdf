"""The parsed job configuration of one ``MLEngineTrainOperator``: the record the Vertex engine reads.

It lives on the pure vocabulary floor (below ``lifecycle`` and ``operators``) so the engine that
submits the job (``lifecycle.vertex``) and the operator that checks the arguments
(``operators.mlengine_config``, which builds it) both import it from below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_cloudtrain.mlengine.tiers import ReplicaPool

# Vertex's prebuilt training containers for python packages (ML Engine's runtime versions are gone).
EXECUTOR_CPU = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
EXECUTOR_GPU = "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"


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

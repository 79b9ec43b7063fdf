"""Vertex AI custom jobs as run resources: create, find by run key, get, list, cancel.

A Vertex job is a resource like an instance: the ledger records it write-ahead, and its teardown is a
cancel (the job itself stays in the project's history, as a finished job does; nothing bills after the
cancel). Every job we create carries the run key labels, so a retried task lists jobs by label and
re-attaches instead of submitting a second job, and a sweep finds a job whose create call never
returned. ``JobRecord`` is the JSON-safe view of a job that crosses the trigger boundary.
"""

from __future__ import annotations

import builtins  # in VertexJobs, ``list`` is a method: its annotations say builtins.list
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from airflow_cloudtrain.contract.runs import TAG_MANAGED, TAG_RUN_KEY
from airflow_cloudtrain.core.inventory import Tagged, register_lister
from airflow_cloudtrain.core.ledger import Resource, ResourceKind, register_kind

log = logging.getLogger(__name__)

SUCCEEDED = "JOB_STATE_SUCCEEDED"
CANCELLING = "JOB_STATE_CANCELLING"
PAUSED = "JOB_STATE_PAUSED"
TIMEOUT_S = 60.0  # per call: google-cloud-aiplatform sets none, and a hung call would stall every wait
# Every end but success fails the task: PARTIALLY_SUCCEEDED and PAUSED included (a paused job does not
# finish by itself; the task would wait forever).
FAILED_STATES = frozenset(
    {
        "JOB_STATE_FAILED",
        "JOB_STATE_CANCELLED",
        "JOB_STATE_EXPIRED",
        "JOB_STATE_PAUSED",
        "JOB_STATE_PARTIALLY_SUCCEEDED",
    }
)
TERMINAL_STATES = FAILED_STATES | {SUCCEEDED}
ACTIVE_FILTER = " AND ".join(f'state!="{s}"' for s in sorted(TERMINAL_STATES))
KIND = "vertex_job"


def console_url(project: str, region: str, numeric_id: str) -> str:
    """The job's page in the Google Cloud console."""
    return f"https://console.cloud.google.com/vertex-ai/locations/{region}/training/{numeric_id}/cpu?project={project}"


def _stamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp() if value.year > 1970 else None
    return None


def _enum(value: Any) -> str:
    """An enum's name; a value this client version does not know comes as a bare int."""
    return str(getattr(value, "name", value))


@dataclass
class JobRecord:
    """What we need of a Vertex custom job, JSON-safe (trigger kwargs and events, XCom)."""

    name: str  # projects/P/locations/R/customJobs/N
    display_name: str
    state: str
    labels: dict[str, str] = field(default_factory=dict)
    output_dir: str | None = None  # jobSpec.baseOutputDirectory.outputUriPrefix: the job folder
    error: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    spot: bool = False
    # per worker pool (Vertex order, empty pools skipped): index, machine_type, accelerator_type,
    # accelerator_count, count
    pools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def numeric_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def project(self) -> str:
        return self.name.split("/")[1]

    @property
    def region(self) -> str:
        return self.name.split("/")[3]

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCEEDED

    def duration_s(self, now: float | None = None) -> float | None:
        """Run time (RUNNING to end), the basis of the cost: a queued job bills nothing."""
        start = self.started_at
        end = self.ended_at or now
        return None if start is None or end is None else max(0.0, end - start)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        from airflow_cloudtrain.contract.records import load_known

        return load_known(cls, data)

    @classmethod
    def from_api(cls, job: Any) -> JobRecord:
        """From a ``google.cloud.aiplatform_v1.CustomJob``."""
        spec = job.job_spec
        pools = []
        for index, pool in enumerate(spec.worker_pool_specs):
            if not pool.replica_count:
                continue
            machine = pool.machine_spec
            accelerator = _enum(machine.accelerator_type) if machine.accelerator_count else None
            pools.append(
                {
                    "index": index,
                    "machine_type": machine.machine_type,
                    "accelerator_type": accelerator,
                    "accelerator_count": int(machine.accelerator_count or 0),
                    "count": int(pool.replica_count),
                }
            )
        strategy = _enum(spec.scheduling.strategy) if spec.scheduling else ""
        return cls(
            name=job.name,
            display_name=job.display_name,
            state=_enum(job.state),
            labels=dict(job.labels),
            output_dir=spec.base_output_directory.output_uri_prefix or None,
            error=(job.error.message or f"error code {job.error.code}")
            if job.error and (job.error.code or job.error.message)
            else None,
            created_at=_stamp(job.create_time),
            started_at=_stamp(job.start_time),
            ended_at=_stamp(job.end_time),
            spot=strategy == "SPOT",
            pools=pools,
        )


class VertexJobs:
    """The custom jobs of one project and region (one ``JobServiceClient``).

    Also the ledger's backend for ``vertex_job`` resources: ``sweep_kinds`` tells the ledger what a
    tag sweep looks for here (no instances)."""

    sweep_kinds = (KIND,)

    def __init__(self, client: Any, project: str, region: str) -> None:
        self.client = client
        self.project = project
        self.region = region

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.region}"

    def create(self, body: dict[str, Any]) -> JobRecord:
        return JobRecord.from_api(
            self.client.create_custom_job(parent=self.parent, custom_job=body, timeout=TIMEOUT_S)
        )

    def get(self, name: str) -> JobRecord | None:
        from google.api_core.exceptions import NotFound

        try:
            return JobRecord.from_api(self.client.get_custom_job(name=name, timeout=TIMEOUT_S))
        except NotFound:
            return None

    def list(self, filter_: str = "", limit: int | None = None) -> list[JobRecord]:
        """Jobs matching ``filter_`` (Vertex's list filter), newest first; every page, or ``limit``."""
        out: list[JobRecord] = []
        request = {"parent": self.parent, "filter": filter_, "page_size": 100}
        for job in self.client.list_custom_jobs(request=request, timeout=TIMEOUT_S):
            out.append(JobRecord.from_api(job))
            if limit is not None and len(out) >= limit:
                break
        return sorted(out, key=lambda j: j.created_at or 0.0, reverse=True)

    def find(self, digest: str, active_only: bool = False) -> builtins.list[JobRecord]:
        """The jobs of one run key (every try's), newest first."""
        clause = f'labels.{TAG_RUN_KEY}="{digest}"'
        return self.list(f"{clause} AND {ACTIVE_FILTER}" if active_only else clause)

    def named(self, display_name: str) -> builtins.list[JobRecord]:
        """Jobs whose display name (our ``job_id``) is this, newest first."""
        return self.list(f'display_name="{display_name}"')

    def active_managed(self) -> builtins.list[JobRecord]:
        """Every job of ours not yet ended: the one list a poll of many deferred jobs shares."""
        return self.list(f'labels.{TAG_MANAGED}="true" AND {ACTIVE_FILTER}')

    def cancel(self, name: str) -> bool:
        """Ask Vertex to cancel; False when there was nothing to cancel (gone, or already ended)."""
        from google.api_core.exceptions import FailedPrecondition, NotFound

        try:
            self.client.cancel_custom_job(name=name, timeout=TIMEOUT_S)
        except (NotFound, FailedPrecondition):
            return False
        return True

    def close(self) -> None:
        transport = getattr(self.client, "transport", None)
        if transport is not None and hasattr(transport, "close"):
            transport.close()


def _find_jobs(backend: VertexJobs, digest: str) -> list[Resource]:
    return [Resource(KIND, j.name, j.region) for j in backend.find(digest, active_only=True)]


def _cancel_jobs(backend: VertexJobs, resources: list[Resource]) -> None:
    for resource in resources:
        if resource.id and backend.cancel(resource.id):
            log.info("Cancelled Vertex AI job %s", resource.id)


VERTEX_JOB = register_kind(ResourceKind(KIND, _find_jobs, _cancel_jobs))


# --- cloudtrain gc: every job of ours not yet ended, whatever its run --------------------------------


def _list_tagged(backend: VertexJobs) -> builtins.list[Tagged]:
    """Active jobs labelled ``cloudtrain-managed``; the job folder (``output_dir``) holds the lease."""
    return [
        Tagged(KIND, j.name, j.region, j.labels.get(TAG_RUN_KEY), j.output_dir, j.created_at, j.state)
        for j in backend.active_managed()
    ]


register_lister("vertex", KIND, _list_tagged)

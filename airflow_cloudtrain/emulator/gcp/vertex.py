"""The emulated Vertex AI (v1 REST: CustomJobs) and Cloud Logging's ``entries.list`` (v2 REST) for the
jobs' logs, on one local HTTP server; the state is ``vertex_state`` (the job resource: ``vertex_jobs``;
rules: ``vertex_validate``; replicas: ``vertex_cluster``, ``vertex_run``; logs: ``vertex_logs``).

The real GAPIC client talks to it unchanged over REST::

    server = VertexServer(); endpoint = server.start()      # "http://127.0.0.1:PORT"
    aiplatform_v1.JobServiceClient(**vertex_client_kwargs(endpoint))
    # == JobServiceClient(transport="rest", credentials=AnonymousCredentials(),
    #                     client_options={"api_endpoint": endpoint})
    AuthorizedSession(AnonymousCredentials()).post(f"{endpoint}/v2/entries:list", json={...})

(google-cloud-logging has no REST transport for its GAPIC client; its ``entries:list`` is plain JSON.)

Served, for any project and location:

* ``POST /v1/projects/P/locations/L/customJobs`` (create; 400 INVALID_ARGUMENT as Vertex lists its
  faults: ``vertex_validate``), ``GET .../customJobs/ID``, ``GET .../customJobs`` (``filter``: AND-joined
  ``labels.KEY="v"``, ``display_name``/``displayName``, ``state`` with ``=``/``!=``; ``pageSize``
  (default 100), ``pageToken``; newest first), ``POST .../customJobs/ID:cancel`` (400
  FAILED_PRECONDITION once ended), ``DELETE .../customJobs/ID`` (a long-running operation, done at once;
  400 FAILED_PRECONDITION for a job not ended, as Vertex refuses), ``GET /v1/projects/P/locations/L/
  operations/OP`` and the same under ``/ui/`` (the REST transport's operations client, which polls an
  operation, and the client's ``get_operation`` take the first of their URL rules: ``/ui/...``).
* Jobs as Vertex writes them (camelCase JSON): ``name`` ``projects/P/locations/L/customJobs/<numeric
  id>``, ``displayName``, ``jobSpec`` (echoed with the service's defaults: ``diskSpec`` pd-ssd 100 GB,
  enums by name, int64 as strings), ``state``, ``createTime``/``startTime``/``endTime``/``updateTime``
  (RFC 3339, "Z", microseconds), ``labels``, ``error`` ``{code, message}`` when failed or cancelled,
  ``webAccessUris`` ``{}``. The lifecycle and the replicas: ``vertex_state``, ``vertex_cluster``.
* ``POST /v2/entries:list``: every replica's output and the service's entries (``vertex_logs``).
* Throttling (``throttle.set(rate, api)``, ``emulator.faults``; services ``"aiplatform"`` and
  ``"logging"``, operations below): HTTP 429 RESOURCE_EXHAUSTED before anything is done; over REST the
  client raises ``TooManyRequests``.
* Requests are counted per operation (``customJobs.create|get|list|cancel|delete``,
  ``operations.get``, ``entries.list``; ``throttled:<op>`` for the refused), except the emulator's own
  (user agent with ``cloudtrain-emulator``).

Helpers: ``job(job) -> dict | None`` (the REST resource; job = full name, numeric id or display
name), ``jobs()``, ``fail_job(job, message)``, ``preempt_replica(job, replica="workerpool0-0")`` (SPOT
jobs only, else ValueError), ``replica_processes(job) -> {task: pid | None}``, ``replica_restarts(job)
-> {task: n}`` (restarts are not part of Vertex's resource), class attributes ``queued_s`` /
``pending_s`` (how long a job is QUEUED, then PENDING).

Not emulated: the project number in names (Vertex answers with the number; here the project as
given), other job kinds (hyperparameter tuning, pipelines, batch prediction), persistent resources,
web access, Tensorboard, service accounts and networks (accepted, unused), quotas and capacity
(no stockouts: a job always starts), IAM, the gRPC transport.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Rule
from werkzeug.wrappers import Request

from airflow_cloudtrain.emulator.faults import Throttle
from airflow_cloudtrain.emulator.gcp.rest import GoogleRestServer
from airflow_cloudtrain.emulator.gcp.vertex_logs import LogsInvalid
from airflow_cloudtrain.emulator.gcp.vertex_state import VertexError, VertexState
from airflow_cloudtrain.emulator.gcp.vertex_validate import Invalid
from airflow_cloudtrain.emulator.runner import InstanceRunner

__all__ = ["VertexServer", "vertex_client_kwargs"]


def vertex_client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point a ``google.cloud.aiplatform_v1`` client at the emulator."""
    from google.auth.credentials import AnonymousCredentials

    return {
        "transport": "rest",
        "credentials": AnonymousCredentials(),
        "client_options": {"api_endpoint": endpoint},
    }


class VertexServer(GoogleRestServer, VertexState):
    """Vertex AI CustomJobs + Logging entries.list on 127.0.0.1 (random port) in a daemon thread.

    ``replica_env``: the environment every replica gets besides Vertex's (the emulated endpoints, e.g.
    ``STORAGE_EMULATOR_HOST``). Replicas run through an ``InstanceRunner``: the Emulator's (set
    ``runner`` and route ``seen``/``replica_exited`` through it), or, with ``start(own_runner=True)``,
    one of the server's own. Requests take the shared pipeline (``rest``).
    """

    service = "aiplatform"
    services = {"entries.list": "logging"}
    invalid_errors = (Invalid, LogsInvalid)  # the validators' faults: 400 INVALID_ARGUMENT
    thread_name = "vertex-emulator"

    def __init__(
        self,
        throttle: Throttle | None = None,
        workdir: str | Path | None = None,
        replica_env: dict[str, str] | None = None,
    ) -> None:
        self._own_dir = workdir is None
        VertexState.__init__(self, Path(workdir or tempfile.mkdtemp(prefix="vertex-emulator-")), replica_env)
        j = "/v1/projects/<project>/locations/<location>/customJobs"
        rules = [
            Rule(f"{j}", endpoint="customJobs.create", methods=["POST"]),
            Rule(f"{j}", endpoint="customJobs.list", methods=["GET"]),
            Rule(f"{j}/<job>:cancel", endpoint="customJobs.cancel", methods=["POST"]),
            Rule(f"{j}/<job>", endpoint="customJobs.get", methods=["GET"]),
            Rule(f"{j}/<job>", endpoint="customJobs.delete", methods=["DELETE"]),
            *(  # the REST transport's operations client (and get_operation) use /ui/ first
                Rule(
                    f"/{v}/projects/<project>/locations/<location>/operations/<op>",
                    endpoint="operations.get",
                    methods=["GET"],
                )
                for v in ("v1", "ui")
            ),
            Rule("/v2/entries:list", endpoint="entries.list", methods=["POST"]),
        ]
        GoogleRestServer.__init__(self, rules, throttle)
        self._own_runner: InstanceRunner | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, port: int = 0, own_runner: bool = False) -> str:
        """Serve on 127.0.0.1:``port`` (0: a free port); ``own_runner``: run the replicas with a runner of this server's (standalone use)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        endpoint = super().start(port)
        if own_runner:
            runner = InstanceRunner(self.seen, self.replica_exited, self.workdir, dict(os.environ))
            self.runner = self._own_runner = runner
            runner.start()
        return endpoint

    def stop(self) -> None:
        if self._own_runner is not None:
            self._own_runner.stop()
            self._own_runner = None
        super().stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # --- HTTP ------------------------------------------------------------------------------------

    def throttled(self, service: str) -> VertexError:
        host = f"{service}.googleapis.com"
        metric = f"{host}/read_requests" if service == "logging" else f"{host}/requests"
        message = (
            f"Quota exceeded for quota metric '{metric}' and limit 'requests per minute' of service '{host}'."
        )
        return VertexError(429, message)

    def unknown_route(self, request: Request, exc: HTTPException) -> VertexError:
        message = f"The requested URL {request.path} was not found on this server. ({request.method})"
        return VertexError(404, message)

    def _h_customJobs_create(self, req: Request, body: dict[str, Any], project: str, location: str) -> Any:
        return self.create_job(project, location, body)

    def _h_customJobs_get(
        self, req: Request, body: dict[str, Any], project: str, location: str, job: str
    ) -> Any:
        return self.get_job(project, location, job)

    def _h_customJobs_list(self, req: Request, body: dict[str, Any], project: str, location: str) -> Any:
        try:
            size = int(req.args.get("pageSize") or 0)
        except ValueError as exc:
            raise VertexError(400, f"Invalid pageSize {req.args.get('pageSize')!r}.") from exc
        return self.list_jobs(
            project, location, req.args.get("filter") or "", size, req.args.get("pageToken") or ""
        )

    def _h_customJobs_cancel(
        self, req: Request, body: dict[str, Any], project: str, location: str, job: str
    ) -> Any:
        self.cancel_job(project, location, job)
        return {}

    def _h_customJobs_delete(
        self, req: Request, body: dict[str, Any], project: str, location: str, job: str
    ) -> Any:
        return self.delete_job(project, location, job)

    def _h_operations_get(
        self, req: Request, body: dict[str, Any], project: str, location: str, op: str
    ) -> Any:
        return self.get_operation(f"projects/{project}/locations/{location}/operations/{op}")

    def _h_entries_list(self, req: Request, body: dict[str, Any]) -> Any:
        return self.logs.list(body)

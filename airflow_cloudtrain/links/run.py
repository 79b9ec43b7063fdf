"""The instance, run folder and worker group of a CloudTrainOperator-family task, in the cloud console.

The task pushes a ``ConsoleTarget`` (plain JSON: cloud, region, zone, project, ids, run URI) to XCom
``CONSOLE_XCOM_KEY`` the moment the instance or group exists, and with it each link's own XCom (the
value Airflow's UI reads for a serialized link). Airflow itself pushes a link's value only when
``execute`` returns or defers, so without the early push a blocking task's buttons would stay empty
for the whole run. A checkpoint-resume loop pushes again for each attempt: the button follows the
current instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.links.console import ConsoleTarget

CONSOLE_XCOM_KEY = "cloudtrain_console"


class _ConsoleLink(BaseOperatorLink):
    """A link whose URL is built from the task's ``ConsoleTarget`` XCom by ``links.console``'s function
    ``url_of`` (named, not held: the operator modules import this one, and stay cheap to import)."""

    url_of: str

    def url(self, target: ConsoleTarget) -> str:
        from airflow_cloudtrain.links import console

        url: str = getattr(console, self.url_of)(target)
        return url

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:  # type: ignore[override]
        from airflow.sdk.execution_time.xcom import XCom

        from airflow_cloudtrain.links.console import target_of

        target = target_of(XCom.get_value(key=CONSOLE_XCOM_KEY, ti_key=ti_key))
        return self.url(target) if target is not None else ""


class CloudInstanceLink(_ConsoleLink):
    """The EC2 instance or GCE VM of the run (the current attempt's, for a checkpoint-resume loop)."""

    name = "Cloud instance"
    url_of = "instance_url"


class RunFolderLink(_ConsoleLink):
    """The run folder (spec, logs, statuses, results) in the S3 or Cloud Storage console."""

    name = "Run folder"
    url_of = "run_folder_url"


class WorkerGroupLink(_ConsoleLink):
    """A fleet's Auto Scaling group (SpotFleetOperator) or managed instance group (PreemptibleGroupOperator)."""

    name = "Worker group"
    url_of = "group_url"


def push_console_links(ti: Any, operator: Any, target: ConsoleTarget) -> None:
    """The target, and each of the operator's console links' URL, to XCom now (see the module)."""
    ti.xcom_push(key=CONSOLE_XCOM_KEY, value=dict(target))
    for link in operator.operator_extra_links:
        if isinstance(link, _ConsoleLink):
            ti.xcom_push(key=link.xcom_key, value=link.url(target))


def run_target(launch: Any, project: str | None) -> ConsoleTarget:
    """A single run's target from its ``LaunchRecord``."""
    from airflow_cloudtrain.links.console import ConsoleTarget

    return ConsoleTarget(
        cloud=launch.cloud,
        region=launch.region,
        zone=launch.zone,
        project=project,
        instance_id=launch.instance_id,
        run_uri=launch.run_uri,
    )


def fleet_target(handle: Any, project: str | None) -> ConsoleTarget:
    """A fleet's target from its ``FleetHandle``."""
    from airflow_cloudtrain.links.console import ConsoleTarget

    return ConsoleTarget(
        cloud=handle.cloud,
        region=handle.region,
        zone=handle.zone,
        project=project,
        run_uri=handle.run_uri,
        group=handle.group,
    )


def project_of(backend: RunBackend) -> str | None:
    """The GCP project a backend works in (None on AWS, or when it cannot be told)."""
    hook = getattr(backend, "hook", None)
    try:
        return str(hook.project) if hook is not None and hasattr(type(hook), "project") else None
    except Exception:
        return None

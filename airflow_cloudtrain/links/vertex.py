"""The Vertex AI job of an MLEngineTrainOperator task, in the Google Cloud console.

The operator pushes the job's console URL to XCom (``LINK_XCOM_KEY``) as soon as the job exists, so
the button works while the job runs (the task deferred, or waiting in a worker slot), not only after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

LINK_XCOM_KEY = "vertex_job_console_url"


class VertexJobLink(BaseOperatorLink):
    name = "Vertex AI job"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:  # type: ignore[override]
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(key=LINK_XCOM_KEY, ti_key=ti_key)
        return value if isinstance(value, str) and value.startswith("https://") else ""

"""The Airflow plugin (entry point ``airflow.plugins``): the Cloud training page's app and its places
in Airflow's UI, a nav entry and a task instance tab.

Every Airflow process loads plugins, so this module stays small: the FastAPI app (and what it
imports) is built only when the api-server asks for ``fastapi_apps``.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/cloudtrain"


class CloudTrainPlugin(AirflowPlugin):
    name = "cloudtrain_ui"
    external_views = [
        {
            "name": "Cloud training",
            "href": f"{URL_PREFIX}/",
            "url_route": "cloudtrain",
            "destination": "nav",
            "category": "browse",
        },
        {
            "name": "Cloud run",
            "href": (
                f"{URL_PREFIX}/ti?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}"
                "&map_index={MAP_INDEX}"
            ),
            "url_route": "cloudtrain_run",
            "destination": "task_instance",
        },
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]  # built on first use
        if not hasattr(self, "_apps"):
            from airflow_cloudtrain.ui.app import create_app

            self._apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Cloud training"}]
        return self._apps

"""The page's FastAPI app, mounted by Airflow's api-server at ``/cloudtrain`` (``ui.plugin``).

Only the api-server imports this module (``ui.plugin`` builds the app on first use). Read-only, and
every route under Airflow's authentication (``GetUserDep``, Airflow's own dependency): the user comes from the JWT Airflow's UI
keeps in its cookie (or an ``Authorization: Bearer`` header, as for the REST API), so a request
without one is refused (401, 403 for a bad token), and a user sees only the runs of the DAGs the auth
manager lets them read.

    GET /            the page (HTML): totals per DAG, day and week, every run
    GET /runs        the same as JSON (``?since=7d&dag=...&state=...&cloud=...``)
    GET /runs/KEY    one run (its ``ct-...`` id) as JSON: its attempts in order
    GET /run/KEY     one run's page: the timeline and the attempts
    GET /ti          a task instance's run (``?dag_id&run_id&task_id&map_index``): its UI tab
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from airflow_cloudtrain.ui import page
from airflow_cloudtrain.ui.runs import (
    Filters,
    choices,
    configured_buckets,
    find_task_run,
    list_runs,
    load_records,
    run_detail,
    summary,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.lifecycle.cost_index import CostRecord

DEFAULT_SINCE = "7d"


def _readable(user: Any, records: list[CostRecord]) -> list[CostRecord]:
    """Only the runs of DAGs the user may read (the auth manager decides, as for Airflow's own pages)."""
    from airflow.api_fastapi.app import get_auth_manager

    allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    return [r for r in records if r.dag_id in allowed]


def _records(user: Any, since: str, dag: str = "") -> list[CostRecord]:
    """The records of the period ``since`` that the user may read (of one DAG's runs when given)."""
    from airflow.configuration import conf

    from airflow_cloudtrain.cli_costs import parse_since

    try:
        start = parse_since(since)
    except argparse.ArgumentTypeError as err:
        raise HTTPException(status_code=400, detail=str(err)) from None
    buckets = configured_buckets(conf.get("cloudtrain", "ui_buckets", fallback=""))
    records = _readable(user, load_records(buckets, start))
    return [r for r in records if not dag or r.dag_id == dag]


def _buckets() -> list[str]:
    from airflow.configuration import conf

    return configured_buckets(conf.get("cloudtrain", "ui_buckets", fallback=""))


def create_app() -> FastAPI:
    """The app Airflow mounts; every route needs a user."""
    app = FastAPI(title="Cloud training", description=__doc__)

    @app.get("/", response_class=HTMLResponse)
    def index(
        user: GetUserDep, since: str = DEFAULT_SINCE, dag: str = "", state: str = "", cloud: str = ""
    ) -> str:
        shown = Filters(since, dag, state, cloud)
        period = _records(user, since)
        records = shown.apply(period)
        return page.runs_page(list_runs(records), summary(records), shown, choices(period), _buckets())

    @app.get("/runs")
    def runs(
        user: GetUserDep, since: str = DEFAULT_SINCE, dag: str = "", state: str = "", cloud: str = ""
    ) -> dict[str, Any]:
        records = Filters(since, dag, state, cloud).apply(_records(user, since))
        return {
            "since": since,
            "dag": dag,
            "state": state,
            "cloud": cloud,
            "buckets": _buckets(),
            "runs": list_runs(records),
            **summary(records),
        }

    @app.get("/runs/{key}")
    def one_run(user: GetUserDep, key: str, since: str = DEFAULT_SINCE) -> dict[str, Any]:
        detail = run_detail(_records(user, since), key)
        if detail is None:
            raise HTTPException(status_code=404, detail=f"no priced attempt of {key} since {since}")
        return detail

    @app.get("/run/{key}", response_class=HTMLResponse)
    def run_view(user: GetUserDep, key: str, since: str = DEFAULT_SINCE) -> str:
        detail = run_detail(_records(user, since), key)
        if detail is None:
            return page.no_run_page(f"No priced attempt of {key} since {since}.", "../")
        return page.run_page(detail, "../")

    @app.get("/ti", response_class=HTMLResponse)
    def task_instance(
        user: GetUserDep,
        dag_id: str,
        run_id: str,
        task_id: str,
        map_index: Annotated[str, Query()] = "-1",
        since: str = "30d",
    ) -> str:
        index = int(map_index) if map_index.lstrip("-").isdigit() else -1  # "{MAP_INDEX}": not mapped
        records = _records(user, since, dag_id)
        key = find_task_run(records, dag_id, run_id, task_id, index)
        detail = run_detail(records, key) if key else None
        if detail is None:
            return page.no_run_page(
                f"No priced attempt of {dag_id}.{task_id} in {run_id} yet (a run is indexed as each "
                "attempt is released).",
                "./",
            )
        return page.run_page(detail, "./")

    return app

"""The page's FastAPI app, mounted by Airflow's api-server at ``/cloudtrain`` (``ui.plugin``).

Only the api-server imports this module (``ui.plugin`` builds the app on first use). Read-only, and
every route under Airflow's authentication (``GetUserDep``, Airflow's own dependency): the user comes from the JWT Airflow's UI
keeps in its cookie (or an ``Authorization: Bearer`` header, as for the REST API), so a request
without one is refused (401, 403 for a bad token), and a user sees only the runs of the DAGs the auth
manager lets them read.

    GET /            the page (HTML): the attempts running now, totals per DAG, week and day, every run
    GET /runs        the same as JSON (``?since=7d&dag=...&state=...&cloud=...``)
    GET /runs/KEY    one run (its ``ct-...`` id) as JSON: its attempts in order, and one in flight
    GET /run/KEY     one run's page: the attempt running now with its log's tail, the timeline (with
                     its run folder's marks: ``ui.run_timeline``), the attempts
    GET /ti          a task instance's run (``?dag_id&run_id&task_id&map_index``): its UI tab
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse

from airflow_cloudtrain.ui import page
from airflow_cloudtrain.ui.run_timeline import timeline_of
from airflow_cloudtrain.ui.runs import (
    Filters,
    choices,
    configured_buckets,
    find_task_run,
    list_runs,
    live_tail,
    load_records,
    load_running,
    run_detail,
    summary,
)

if TYPE_CHECKING:
    from airflow_cloudtrain.lifecycle.cost_index import CostRecord

DEFAULT_SINCE = "7d"


def _allowed(user: Any) -> set[str]:
    """The DAGs the user may read (the auth manager decides, as for Airflow's own pages)."""
    from airflow.api_fastapi.app import get_auth_manager

    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def _readable(user: Any, records: list[CostRecord]) -> list[CostRecord]:
    """Only the runs of DAGs the user may read."""
    allowed = _allowed(user)
    return [r for r in records if r.dag_id in allowed]


def _running(user: Any, shown: Filters | None = None, key: str = "") -> list[dict[str, Any]]:
    """The attempts in flight the user may read, narrowed as the page is (a running attempt's state
    is ``running``), or of one run."""
    allowed = _allowed(user)
    rows = [r for r in load_running(_buckets()) if r["dag_id"] in allowed and (not key or r["key"] == key)]
    if shown is not None:
        rows = [
            r
            for r in rows
            if (not shown.dag or r["dag_id"] == shown.dag)
            and (not shown.state or shown.state == "running")
            and (not shown.cloud or r["cloud"] == shown.cloud)
        ]
    return rows


def _with_tails(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "tail": live_tail(r["bucket"], r["instance_id"]) if r["live"] else []} for r in rows]


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
        running = _running(user, shown)
        return page.runs_page(
            list_runs(records), summary(records), shown, choices(period), _buckets(), running
        )

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
            "running": _running(user, Filters(since, dag, state, cloud)),
            "runs": list_runs(records),
            **summary(records),
        }

    @app.get("/runs/{key}")
    def one_run(user: GetUserDep, key: str, since: str = DEFAULT_SINCE) -> dict[str, Any]:
        detail = run_detail(_records(user, since), key)
        running = _with_tails(_running(user, key=key))
        if detail is None and not running:
            raise HTTPException(status_code=404, detail=f"no attempt of {key} since {since}")
        return {**(detail or {"key": key}), "running": running}

    @app.get("/run/{key}", response_class=HTMLResponse)
    def run_view(user: GetUserDep, key: str, since: str = DEFAULT_SINCE) -> str:
        detail = run_detail(_records(user, since), key)
        running = _with_tails(_running(user, key=key))
        if detail is None and not running:
            return page.no_run_page(f"No attempt of {key} since {since}.", "../")
        return page.run_page(detail, "../", running, timeline_of(detail, running))

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
        ti = (dag_id, run_id, task_id, index)
        running = [
            r
            for r in _running(user)
            if (r["dag_id"], r["airflow_run_id"], r["task_id"], r["map_index"]) == ti
        ]
        key = find_task_run(records, dag_id, run_id, task_id, index)
        if running:  # the run in flight is the task's newest
            key = running[0]["key"]
        detail = run_detail(records, key) if key else None
        running = _with_tails([r for r in running if r["key"] == key])
        if detail is None and not running:
            return page.no_run_page(
                f"No attempt of {dag_id}.{task_id} in {run_id} yet (an attempt is indexed once its "
                "instance is launched).",
                "./",
            )
        return page.run_page(detail, "./", running, timeline_of(detail, running))

    return app

"""The Cloud training page's data and timeline, from cost index records: runs grouped by run id with
their attempts in launch order, the totals ``cloudtrain costs`` prints, and the SVG bars (spot or
on-demand, interruptions marked). The page itself, in a browser against a real deployment, is
tests/deployment/test_ui_page.py."""

from __future__ import annotations

import re

from airflow_cloudtrain.lifecycle.cost_index import CostRecord, grand_total, totals
from airflow_cloudtrain.ui.page import runs_page
from airflow_cloudtrain.ui.runs import (
    Filters,
    choices,
    configured_buckets,
    find_task_run,
    list_runs,
    run_detail,
    summary,
)
from airflow_cloudtrain.ui.timeline import Bar, timeline_svg

T0 = 1_764_201_600.0  # 2025-11-27 00:00 UTC


def rec(
    run: str,
    n: int,
    start: float,
    end: float,
    spot: bool,
    interrupted: bool,
    cost: float,
    dag: str = "retrain",
    state: str = "interrupted",
) -> CostRecord:
    return CostRecord(
        dag,
        "train",
        "manual__1",
        -1,
        run,
        f"s3://b/{run}",
        "ec2spot" if spot else "ec2",
        f"i-{run}-{n}",
        "m5.large",
        1,
        spot,
        state,
        interrupted,
        start,
        end,
        cost,
        "spot history",
    )


RECORDS = [
    # launched in this order; the index lists them by key, so out of order here
    rec("ct-a", 3, T0 + 200, T0 + 300, False, False, 0.30, state="succeeded"),
    rec("ct-a", 1, T0 + 0, T0 + 90, True, True, 0.10),
    rec("ct-a", 2, T0 + 100, T0 + 190, True, True, 0.20),
    rec("ct-b", 1, T0 + 50, T0 + 80, False, False, 0.05, dag="ui", state="succeeded"),
]


def test_runs_group_attempts_in_launch_order_and_add_up_like_cloudtrain_costs() -> None:
    runs = {r["key"]: r for r in list_runs(RECORDS)}
    assert runs["ct-a"]["attempts"] == 3 and runs["ct-a"]["interruptions"] == 2
    assert runs["ct-a"]["cost_usd"] == 0.6 and runs["ct-a"]["state"] == "succeeded"
    assert runs["ct-b"]["cost_usd"] == 0.05
    detail = run_detail(RECORDS, "ct-a")
    assert detail is not None
    assert [a["instance_id"] for a in detail["attempts_detail"]] == ["i-ct-a-1", "i-ct-a-2", "i-ct-a-3"]
    assert [a["interrupted"] for a in detail["attempts_detail"]] == [True, True, False]
    assert run_detail(RECORDS, "ct-none") is None
    assert find_task_run(RECORDS, "retrain", "manual__1", "train", -1) == "ct-a"
    assert find_task_run(RECORDS, "retrain", "manual__2", "train", -1) is None
    totals_ = summary(RECORDS)
    assert totals_["total"] == grand_total(RECORDS, "dag")
    assert totals_["total"]["cost_usd"] == 0.65 and totals_["total"]["runs"] == 2
    assert totals_["by_dag"] == totals(RECORDS, "dag")


def test_the_timeline_draws_a_bar_per_attempt_and_marks_interruptions() -> None:
    detail = run_detail(RECORDS, "ct-a")
    assert detail is not None
    bars = [
        Bar(f"#{a['attempt']}", a["launched_at"], a["released_at"], a["spot"], a["interrupted"])
        for a in detail["attempts_detail"]
    ]
    svg = timeline_svg(bars, "retrain.train")
    found = re.findall(r'<rect class="ct-bar (\w+)" data-index="(\d)" x="([\d.]+)"', svg)
    assert [(kind, int(i)) for kind, i, _ in found] == [("spot", 0), ("spot", 1), ("ondemand", 2)]
    xs = [float(x) for _, _, x in found]
    assert xs == sorted(xs) and xs[0] < xs[1] < xs[2]  # in time order on one axis
    assert re.findall(r'class="ct-interruption" data-index="(\d)"', svg) == ["0", "1"]
    assert "<script" not in svg and "http://www.w3.org/2000/svg" in svg  # self-contained
    assert "no attempt" in timeline_svg([], "empty")


def test_buckets_come_from_the_setting_or_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CLOUDTRAIN_BUCKET", "s3://env/x")
    assert configured_buckets("s3://a/one, gs://b/two/") == ["s3://a/one", "gs://b/two"]
    assert configured_buckets("") == ["s3://env/x"]


def test_the_page_filters_by_dag_state_and_cloud_and_totals_per_week() -> None:
    shown = Filters("7d", state="succeeded", cloud="ec2")
    records = shown.apply(RECORDS)
    assert {r.run_id for r in records} == {"ct-a", "ct-b"}  # both ended succeeded with an ec2 attempt
    assert len(records) == 4  # ct-a whole, its spot attempts too
    html = runs_page(list_runs(records), summary(records), shown, choices(RECORDS), ["s3://b"])
    # the form keeps what was chosen and offers the period's values
    assert "<option value='succeeded' selected>succeeded</option>" in html
    assert "<option value='interrupted'>" not in html  # no run of the period ended interrupted
    assert "<option value='ec2spot'>ec2spot</option>" in html
    assert "<option value='ec2' selected>ec2</option>" in html
    assert "<select name='dag'><option value=''>all</option>" in html
    week = re.search(r"<table id='ct-by-week'>(.*?)</table>", html)
    assert week is not None and "2025-W48" in week.group(1) and "$0.6500" in week.group(1)
    only_ui = Filters("7d", dag="ui").apply(RECORDS)
    assert summary(only_ui)["total"]["cost_usd"] == 0.05
    assert Filters("7d", state="failed").apply(RECORDS) == []


RUNNING = {
    "key": "ct-c",
    "dag_id": "retrain",
    "task_id": "train",
    "airflow_run_id": "manual__2",
    "map_index": -1,
    "cloud": "gcspot",
    "instance_id": "vm-c-1",
    "instance_type": "e2-standard-2",
    "nodes": 2,
    "spot": True,
    "launched_at": T0 + 1000,
    "running_s": 150.0,
    "cost_so_far_usd": 0.0042,
    "bucket": "gs://b",
    "live": True,
    "tail": ["step 7 <ok>"],
}


def test_the_page_shows_what_runs_now_and_a_first_attempt_with_its_log_tail() -> None:
    from airflow_cloudtrain.ui.page import run_page

    html = runs_page([], summary([]), Filters("7d"), choices([]), ["gs://b"], [RUNNING])
    live = re.search(r"<table id='ct-running'>(.*?)</table>", html)
    assert live is not None and "Running now (1)" in html
    assert all(x in live.group(1) for x in ("vm-c-1", "e2-standard-2", "2.5 min", "$0.0042", "run/ct-c"))
    assert "<option value='running'>running</option>" in html  # the state filter offers it
    assert "id='ct-running'" not in runs_page([], summary([]), Filters("7d"), choices([]), [], [])
    # a run whose first attempt still runs: its page is that attempt and its log (escaped)
    page = run_page(None, "../", [RUNNING])
    assert (
        "its first attempt is running" in page
        and "<pre class='tail' id='ct-tail'>step 7 &lt;ok&gt;</pre>" in page
    )
    # a run with released attempts and one running: both
    detail = run_detail(RECORDS, "ct-a")
    both = run_page(detail, "../", [{**RUNNING, "key": "ct-a"}])
    assert "id='ct-running'" in both and "id='ct-attempts'" in both and "id='ct-tail'" in both


def test_a_user_who_cannot_read_a_dag_does_not_see_its_runs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The page's records and running attempts are those of the DAGs Airflow's auth manager lets the
    user read (its ``get_authorized_dag_ids``, as for Airflow's own pages). The simple auth manager of
    the deployment tests lets every user read every DAG, so a manager that allows one DAG stands in."""
    import airflow.api_fastapi.app as airflow_app

    from airflow_cloudtrain.ui import app

    asked: list[tuple[object, str]] = []

    class OneDagOnly:
        def get_authorized_dag_ids(self, user: object, method: str) -> set[str]:
            asked.append((user, method))
            return {"ui"}

    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: OneDagOnly())
    user = object()
    assert [r.dag_id for r in app._readable(user, RECORDS)] == ["ui"]
    assert asked == [(user, "GET")]

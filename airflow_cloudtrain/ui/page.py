"""The page's HTML, rendered on the server from ``ui.runs``' rows: no JavaScript, no CDN, no build.

Shown inside Airflow's UI (an iframe under the "Cloud training" nav entry, and the task instance's
"Cloud run" tab); links into Airflow's own pages open in the top window.
"""

from __future__ import annotations

from html import escape
from typing import Any
from urllib.parse import quote

from airflow_cloudtrain.ui.run_timeline import timeline_of
from airflow_cloudtrain.ui.runs import Filters, day, duration

STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;margin-bottom:8px} td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f3f4f6} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
tr.total td{font-weight:bold;border-top:2px solid #999} .muted{color:#666} .bar{fill:#3b7dd8}
td.basis{font-size:12px;max-width:320px} pre.tail{background:#f6f8fa;padding:8px;max-height:360px;overflow:auto;font-size:12px} form{margin:6px 0 10px} input{font-size:13px} .interrupted{color:#d62728;font-weight:bold}
"""


def _usd(value: Any) -> str:
    return "?" if value is None else f"${float(value):.4f}"


def _basis(texts: list[str]) -> str:
    """A short name for each price basis (up to its first colon), the whole text as the tooltip."""
    short = ", ".join(dict.fromkeys(t.split(":", 1)[0] for t in texts))
    return f"<td class='muted basis' title='{escape('; '.join(texts))}'>{escape(short)}</td>"


def _frame(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def _ti_link(row: dict[str, Any]) -> str:
    path = (
        f"/dags/{quote(row['dag_id'], safe='')}/runs/{quote(row['airflow_run_id'], safe='')}"
        f"/tasks/{quote(row['task_id'], safe='')}"
    )
    if row["map_index"] is not None and int(row["map_index"]) >= 0:
        path += f"/mapped/{int(row['map_index'])}"
    return f"<a href='{escape(path)}' target='_top'>{escape(row['task_id'])}</a>"


def _totals_table(rows: list[dict[str, Any]], by: str, total: dict[str, Any] | None, chart: bool) -> str:
    top = max([float(r["cost_usd"]) for r in rows] + [1e-12])
    head = (
        f"<tr><th>{by}</th><th class='num'>runs</th><th class='num'>attempts</th>"
        "<th class='num'>interruptions</th><th class='num'>cost</th>"
        + ("<th></th>" if chart else "")
        + "</tr>"
    )
    body = []
    for r in rows:
        bar = (
            f"<td><svg width='160' height='12'><rect class='bar' width='{160 * float(r['cost_usd']) / top:.1f}' "
            "height='12'/></svg></td>"
            if chart
            else ""
        )
        body.append(
            f"<tr data-{by}='{escape(str(r[by]))}'><td>{escape(str(r[by]))}</td><td class='num'>{r['runs']}</td>"
            f"<td class='num'>{r['attempts']}</td><td class='num'>{r['interruptions']}</td>"
            f"<td class='num cost'>{_usd(r['cost_usd'])}</td>{bar}</tr>"
        )
    if total is not None:
        body.append(
            f"<tr class='total' id='ct-total'><td>TOTAL</td><td class='num'>{total['runs']}</td>"
            f"<td class='num'>{total['attempts']}</td><td class='num'>{total['interruptions']}</td>"
            f"<td class='num cost'>{_usd(total['cost_usd'])}</td>" + ("<td></td>" if chart else "") + "</tr>"
        )
    return f"<table id='ct-by-{by}'>{head}{''.join(body)}</table>"


def _running_table(running: list[dict[str, Any]], link: bool) -> str:
    """The attempts in flight: what each costs so far at its price per hour (every node)."""
    if not running:
        return ""
    rows = []
    for r in running:
        open_link = (
            f"<td><a class='ct-open' href='run/{quote(r['key'], safe='')}'>log</a></td>" if link else ""
        )
        rows.append(
            f"<tr class='ct-live' data-key='{escape(r['key'])}' data-instance='{escape(r['instance_id'])}'>"
            f"<td>{escape(r['dag_id'])}</td><td>{_ti_link(r)}</td><td>{escape(r['airflow_run_id'])}</td>"
            f"<td>{escape(r['cloud'])}</td><td class='muted'>{escape(r.get('operator') or '')}</td>"
            f"<td>{escape(r['instance_id'])}</td>"
            f"<td>{escape(r['instance_type'] or '')}</td><td class='num nodes'>{r['nodes']}</td>"
            f"<td>{'spot' if r['spot'] else 'on-demand'}</td><td class='muted'>{day(r['launched_at'])}</td>"
            f"<td class='num'>{duration(r['running_s'])}</td>"
            f"<td class='num cost'>{_usd(r['cost_so_far_usd'])}</td>{open_link}</tr>"
        )
    return (
        f"<h2>Running now ({len(running)})</h2><table id='ct-running'><tr><th>DAG</th><th>task</th>"
        "<th>Airflow run</th><th>cloud</th><th>operator</th><th>instance / group / job</th><th>type</th>"
        "<th class='num'>nodes / workers / replicas</th>"
        "<th>market</th><th>launched (UTC)</th><th class='num'>running for</th>"
        "<th class='num'>cost so far</th>"
        + ("<th></th>" if link else "")
        + "</tr>"
        + "".join(rows)
        + "</table>"
    )


def _select(name: str, label: str, chosen: str, values: list[str]) -> str:
    """A filter's drop-down: "all", then the period's values (the chosen one kept even if absent)."""
    options = ["<option value=''>all</option>"]
    for value in sorted({*values, chosen} - {""}):
        mark = " selected" if value == chosen else ""
        options.append(f"<option value='{escape(value)}'{mark}>{escape(value)}</option>")
    return f"{label} <select name='{name}'>{''.join(options)}</select> "


def runs_page(
    runs: list[dict[str, Any]],
    summary: dict[str, Any],
    shown: Filters,
    choices: dict[str, list[str]],
    buckets: list[str],
    running: list[dict[str, Any]] | None = None,
) -> str:
    """The list: the totals (per DAG with a bar chart, per week, per day) and every run, newest first,
    for the period and filters of the form above them."""
    rows = []
    for r in runs:
        rows.append(
            f"<tr class='ct-run' data-key='{escape(r['key'])}'>"
            f"<td>{escape(r['dag_id'])}</td><td>{_ti_link(r)}</td><td>{escape(r['airflow_run_id'])}</td>"
            f"<td>{escape(r['cloud'])}</td><td>{escape(', '.join(r['instance_types']))}</td>"
            f"<td class='num'>{r['nodes']}</td><td class='num'>{r['attempts']}</td>"
            f"<td class='num'>{r['interruptions']}</td><td>{escape(r['state'])}</td>"
            f"<td class='muted'>{day(r['ended_at'])}</td><td class='num cost'>{_usd(r['cost_usd'])}</td>"
            f"{_basis(r['basis'])}"
            f"<td><a class='ct-open' href='run/{quote(r['key'], safe='')}'>timeline</a></td></tr>"
        )
    table = (
        "<table id='ct-runs'><tr><th>DAG</th><th>task</th><th>Airflow run</th><th>cloud</th>"
        "<th>instance type(s)</th><th class='num'>nodes</th><th class='num'>attempts</th>"
        "<th class='num'>interruptions</th><th>state</th><th>ended (UTC)</th><th class='num'>cost</th>"
        "<th>basis</th><th></th></tr>" + "".join(rows) + "</table>"
        if rows
        else "<p id='ct-runs' class='muted'>No priced run in these days.</p>"
    )
    body = (
        "<h1>Cloud training</h1>"
        f"<p class='muted'>From the cost index of {escape(', '.join(buckets) or 'no bucket (set [cloudtrain] ui_buckets)')}; "
        "the same totals as <code>cloudtrain costs</code>.</p>"
        f"<form method='get'>since <input name='since' value='{escape(shown.since)}' size='10'> "
        + _select("dag", "DAG", shown.dag, choices["dag"])
        + _select("state", "state", shown.state, [*choices["state"], "running"])
        + _select("cloud", "cloud", shown.cloud, choices["cloud"])
        + "<input type='submit' value='show'></form>"
        + _running_table(running or [], link=True)
        + "<h2>Per DAG</h2>"
        + _totals_table(summary["by_dag"], "dag", summary["total"], chart=True)
        + "<h2>Per week</h2>"
        + _totals_table(summary["by_week"], "week", None, chart=True)
        + "<h2>Per day</h2>"
        + _totals_table(summary["by_day"], "day", None, chart=False)
        + f"<h2>Runs ({len(runs)})</h2>"
        + table
    )
    return _frame("Cloud training", body)


def run_page(
    detail: dict[str, Any] | None,
    back: str,
    running: list[dict[str, Any]] | None = None,
    timeline: str | None = None,
) -> str:
    """One run: the attempt running now with the tail of its job's log, then its attempts as a
    timeline (``timeline``: the SVG ``ui.run_timeline.timeline_of`` drew with its run folder's marks;
    None: the bars alone) and its released attempts as a table."""
    running = running or []
    svg = timeline if timeline is not None else timeline_of(detail, running, read=False)
    live = "".join(
        f"<h2>Log of {escape(r['instance_id'])} (last {len(r.get('tail', []))} lines)</h2>"
        f"<pre class='tail' id='ct-tail'>{escape(chr(10).join(r.get('tail', [])))}</pre>"
        for r in running
        if r.get("live", True)  # a fleet or a Vertex job has no agent beacon to tail
    )
    if detail is None:
        head = running[0]
        body = (
            f"<p><a href='{escape(back)}'>&larr; all runs</a></p>"
            f"<h1>{escape(head['dag_id'])} &middot; {_ti_link(head)} &middot; "
            f"<span class='muted'>{escape(head['airflow_run_id'])}</span></h1>"
            f"<p id='ct-run-summary'>run <code>{escape(head['key'])}</code> on {escape(head['cloud'])}: "
            "its first attempt is running.</p>"
            + _running_table(running, link=False)
            + f"<h2>Timeline</h2>{svg}"
            + live
        )
        return _frame(f"Cloud training: {head['key']}", body)
    rows = []
    for a in detail["attempts_detail"]:
        ended = (
            f"<span class='interrupted'>{escape(a['ended'])}</span>"
            if a["interrupted"]
            else escape(a["ended"])
        )
        rows.append(
            f"<tr class='ct-attempt' data-attempt='{a['attempt']}'><td class='num'>{a['attempt']}</td>"
            f"<td>{escape(a['instance_id'])}</td><td>{escape(a['instance_type'] or '')}</td>"
            f"<td class='num'>{a['nodes']}</td><td>{'spot' if a['spot'] else 'on-demand'}</td>"
            f"<td>{day(a['launched_at']) if a['launched_at'] else '?'}</td><td>{day(a['released_at'])}</td>"
            f"<td>{ended}</td><td class='num cost'>{_usd(a['cost_usd'])}</td>"
            f"{_basis([a['basis']] if a['basis'] else [])}</tr>"
        )
    body = (
        f"<p><a href='{escape(back)}'>&larr; all runs</a></p>"
        f"<h1>{escape(detail['dag_id'])} &middot; {_ti_link(detail)} &middot; "
        f"<span class='muted'>{escape(detail['airflow_run_id'])}</span></h1>"
        f"<p id='ct-run-summary'>run <code>{escape(detail['key'])}</code> on {escape(detail['cloud'])}: "
        f"{detail['attempts']} attempt(s), {detail['interruptions']} interruption(s), state "
        f"{escape(detail['state'])}, cost <b class='cost'>{_usd(detail['cost_usd'])}</b> "
        f"<span class='muted'>({escape(', '.join(detail['basis']))})</span></p>"
        + _running_table(running, link=False)
        + live
        + f"<h2>Timeline</h2>{svg}"
        "<h2>Attempts</h2><table id='ct-attempts'><tr><th class='num'>#</th><th>instance</th><th>type</th>"
        "<th class='num'>nodes</th><th>market</th><th>launched (UTC)</th><th>released (UTC)</th>"
        "<th>ended</th><th class='num'>cost</th><th>basis</th></tr>" + "".join(rows) + "</table>"
    )
    return _frame(f"Cloud training: {detail['key']}", body)


def no_run_page(what: str, back: str) -> str:
    return _frame(
        "Cloud training",
        f"<p><a href='{escape(back)}'>&larr; all runs</a></p><p id='ct-none'>{escape(what)}</p>",
    )

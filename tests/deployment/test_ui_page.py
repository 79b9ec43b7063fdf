"""The Cloud training page in a real browser (Playwright driving Debian's Chromium) against a real
Airflow deployment: the processes ``cloudtrain up`` starts (``cli_up.local_airflow``: api-server,
scheduler, dag-processor, triggerer over the example DAGs), here next to the test's own emulated
clouds so that the test can take spot instances away (``cloudtrain up``'s clouds live in its own
process, out of a test's reach).

``retrain_spot`` runs with two injected interruptions and ``ui_train`` on demand (triggered through the
REST API with the params form's values: they reach the operator, the job's lines reach the task log),
both writing to a bucket of this test's own; then, as a user: a request without a login is refused, the page (logged
in through Airflow's own login form) lists both runs with the costs their XComs report and the totals
``cloudtrain costs --json`` prints, ``retrain_spot``'s timeline shows its three attempts in launch
order with the two interruptions marked, and the task instance's "Cloud run" tab opens that run.

Chromium comes from Debian (``apt-get install --no-install-recommends chromium`` when missing; never
``playwright install``); the test is skipped only when it cannot be installed. Screenshots go to the
test's folder, and to ``$CLOUDTRAIN_UI_SCREENSHOTS`` when set (``docs/img`` holds the committed ones:
``CLOUDTRAIN_UI_SCREENSHOTS=docs/img make test PYTEST_ARGS=tests/deployment/test_ui_page.py``).

Its time (2 cores shared with five other test suites, load average 50-70): 9 to 14 minutes, about
4 to start the deployment and parse the DAGs, 2.5 to 4.5 for the two DAG runs (three spot attempts),
the rest in the browser (Airflow's UI loads slowly on a loaded machine); mostly waiting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from deployment_helpers import TEST_SETTINGS, Api
from waiting import wait_for

from airflow_cloudtrain.catalog import choose_offer
from airflow_cloudtrain.cli_up import EXAMPLE_DAGS, free_port, home_secrets, local_airflow
from airflow_cloudtrain.cli_up_production import APT_LOCK_WAIT
from airflow_cloudtrain.spec import Hardware

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# retrain_spot's first instance is taken (5 s notice) once its job passed step 15, the second once
# its job passed step 30 (example_dags/spot_interrupter.py); the third finishes
PLAN = [(15, 5.0), (30, 5.0)]
# the params form's values, as the UI's trigger form sends them. The job's lines are computed by the
# shell, so the command's own text (in the log too) never matches them; 10 s first: a job ending within
# a second or two of the deferral can race Airflow's LocalExecutor (its late "success" for the
# deferring half fails the resumed task on a busy machine), which is Airflow's, not the case under test
UI_TRAIN_CONF = {
    "cloud": "ec2",
    "cpus": 4,
    "ram": "8g",
    "bid": "",
    "command": "sleep 10; echo job-a-$((40+2)); echo job-b-$((50+3))",
}


# Chromium and its dependencies only: its recommends (107 packages against 19: udev, avahi, samba's
# libraries, a printer dialog, perl's web stack, and upgrades of systemd and perl they pull in) cost a
# fresh machine's `make test` about twice the time and CPU of the install, and headless Chromium uses
# none of them (the fonts come with fontconfig's dependencies). docs/testing.md has the figures.
# APT_LOCK_WAIT (as `cloudtrain up --production` runs apt-get): wait for another apt-get (the production
# case installs PostgreSQL and Redis at the same time on a fresh machine) instead of failing on dpkg's
# lock and skipping
APT_INSTALL = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_LOCK_WAIT, "chromium"]


def _chromium() -> str:
    """Debian's Chromium, installed when missing; a skip only where apt cannot install it."""
    if not CHROMIUM.exists():
        if shutil.which("apt-get") is None:
            pytest.skip("no Chromium and no apt-get to install it")
        apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in (APT_INSTALL, ["apt-get", *APT_LOCK_WAIT, "update"]):
            subprocess.run(args, capture_output=True, text=True, timeout=1200, check=False, env=apt_env)
        if not CHROMIUM.exists():
            done = subprocess.run(APT_INSTALL, capture_output=True, text=True, timeout=1200, env=apt_env)
            if not CHROMIUM.exists():
                pytest.skip(f"Chromium could not be installed: {done.stderr[-400:]}")
    return str(CHROMIUM)


def _interrupter(emu: Any) -> Any:
    spec = importlib.util.spec_from_file_location("spot_interrupter", EXAMPLE_DAGS / "spot_interrupter.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Interrupter(emu, PLAN, timeout_s=500)


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if "json" in resp.headers.get("content-type", "") else body
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _wait_run(api: Api, dag_id: str, run_id: str) -> str:
    """The run's final state; a REST call the loaded api-server answers too late is asked again."""

    def state() -> str | None:
        try:
            found = api.run_state(dag_id, run_id)
        except (TimeoutError, urllib.error.URLError):
            return None
        return found if found in ("success", "failed") else None

    return str(wait_for(state, timeout=900, interval=2, message=f"{dag_id} run {run_id} to end"))


def _usd(value: float) -> str:
    return f"${value:.4f}"


@pytest.mark.timeout(1200)  # a deployment's start and two DAG runs; each wait has its own deadline
def test_the_cloud_training_page_in_a_browser(emu: Any, tmp_path: Path) -> None:
    chromium = _chromium()
    from playwright.sync_api import sync_playwright

    bucket = f"s3://cloudtrain-emulated/ui-page-{uuid.uuid4().hex[:8]}"
    shots = [tmp_path] + ([Path(p)] if (p := os.environ.get("CLOUDTRAIN_UI_SCREENSHOTS")) else [])
    home = tmp_path / "airflow_home"
    cloud_env = {**emu.env(), "CLOUDTRAIN_BUCKET": bucket}  # both example DAGs write there
    settings = {**TEST_SETTINGS, "AIRFLOW__CLOUDTRAIN__UI_BUCKETS": bucket}
    with local_airflow(home, EXAMPLE_DAGS, free_port(), cloud_env, settings) as airflow:
        password = home_secrets(home)["password"]
        api = Api(airflow, password)
        for dag_id in ("retrain_spot", "ui_train"):
            wait_for(lambda d=dag_id: api.has_dag(d), timeout=300, interval=1.0, message=f"{dag_id} parsed")
            api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})

        # the plugin is loaded: the nav entry and the task instance tab are what the UI is told to show
        plugin = next(p for p in api.call("GET", "/plugins")["plugins"] if p["name"] == "cloudtrain_ui")
        views = {v["destination"]: v for v in plugin["external_views"]}
        assert views["nav"]["name"] == "Cloud training" and views["nav"]["url_route"] == "cloudtrain"
        assert views["task_instance"]["url_route"] == "cloudtrain_run"
        assert api.call("GET", "/plugins/importErrors")["total_entries"] == 0
        # the page's API without a login, or with a forged token: refused
        assert _get(f"{airflow.url}/cloudtrain/runs")[0] == 401
        assert _get(f"{airflow.url}/cloudtrain/")[0] == 401
        assert _get(f"{airflow.url}/cloudtrain/runs", token="not-a-jwt")[0] == 403

        interrupter = _interrupter(emu)
        interrupter.start()
        try:
            spot_run = api.trigger("retrain_spot", {})
            ui_run = api.trigger("ui_train", UI_TRAIN_CONF)
            for dag_id, run in (("ui_train", ui_run), ("retrain_spot", spot_run)):
                state = _wait_run(api, dag_id, run)
                assert state == "success", "\n".join(api.log_lines(dag_id, run, "train")[-60:])
        finally:
            injected = interrupter.stop()
        assert len(injected) == 2, injected
        spot = api.xcom("retrain_spot", spot_run, "train")
        ui = api.xcom("ui_train", ui_run, "train")
        # the form's values reached the operator: on-demand, the cheapest type with >= 4 vCPUs and 8 GiB,
        # the job's lines in the task log once each
        assert ui["cloud"] == "ec2" and ui["spot"] is False and ui["exit_code"] == 0, ui
        assert ui["instance_type"] == choose_offer("ec2", Hardware(4, 0, "8g"), "us-east-1").instance_type
        lines = api.log_lines("ui_train", ui_run, "train")
        assert sum("job-a-42" in line for line in lines) == 1, lines
        assert sum("job-b-53" in line for line in lines) == 1, lines
        spot_ids = [row["instance_id"] for row in spot["attempts"]]
        assert spot_ids[:2] == [i["instance_id"] for i in injected] and len(spot_ids) == 3

        # the JSON API (a bearer token, as for Airflow's REST API): the XComs' costs, attempts in order
        token = airflow.token(password)
        status, listing = _get(f"{airflow.url}/cloudtrain/runs?since=1d", token)
        assert status == 200, listing
        runs = {r["key"]: r for r in listing["runs"]}
        assert set(runs) == {spot["run_id"], ui["run_id"]}, runs
        assert runs[spot["run_id"]]["cost_usd"] == pytest.approx(spot["cost_usd"], abs=1e-6)
        assert runs[ui["run_id"]]["cost_usd"] == pytest.approx(ui["cost_usd"], abs=1e-6)
        assert runs[spot["run_id"]]["interruptions"] == 2 and runs[spot["run_id"]]["attempts"] == 3
        status, detail = _get(f"{airflow.url}/cloudtrain/runs/{spot['run_id']}", token)
        assert status == 200, detail
        assert [a["instance_id"] for a in detail["attempts_detail"]] == spot_ids
        assert [a["interrupted"] for a in detail["attempts_detail"]] == [True, True, False]

        # cloudtrain costs on the same bucket: the same totals as the page
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_cloudtrain.cli",
                "costs",
                "--bucket",
                bucket,
                "--since",
                "1d",
                "--json",
            ],
            env={**os.environ, **cloud_env},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        cli_total = json.loads(done.stdout)["total"]
        assert {k: v for k, v in cli_total.items() if k != "dag"} == {
            k: v for k, v in listing["total"].items() if k != "dag"
        }
        assert cli_total["cost_usd"] == pytest.approx(spot["cost_usd"] + ui["cost_usd"], abs=1e-5)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.set_default_timeout(120_000)  # a busy machine; each wait is for a condition
                # Airflow's own login form (the simple auth manager's)
                page.goto(f"{airflow.url}/")
                page.locator("input[name=username]").fill("admin")
                page.locator("input[name=password]").fill(password)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(lambda url: "/auth/" not in url)

                # the nav entry's page, inside Airflow's UI
                page.goto(f"{airflow.url}/plugin/cloudtrain")
                frame = page.frame_locator("iframe")
                total = frame.locator("#ct-total")
                total.wait_for()
                assert _usd(cli_total["cost_usd"]) in total.inner_text()
                for result in (spot, ui):
                    row = frame.locator(f"tr.ct-run[data-key='{result['run_id']}']")
                    assert row.locator("td.cost").inner_text() == _usd(result["cost_usd"])
                _shoot(page, shots, "cloud-training-page.png")

                # retrain_spot's timeline: three bars in launch order, the first two interrupted
                frame.locator(f"tr.ct-run[data-key='{spot['run_id']}'] a.ct-open").click()
                bars = frame.locator("svg.ct-timeline rect.ct-bar")
                bars.first.wait_for()
                assert bars.count() == 3
                xs = [float(bars.nth(i).get_attribute("x") or "nan") for i in range(3)]
                assert xs == sorted(xs) and xs[0] < xs[1] < xs[2], xs
                assert all("spot" in (bars.nth(i).get_attribute("class") or "") for i in range(3))
                marks = frame.locator("svg.ct-timeline .ct-interruption")
                assert [marks.nth(i).get_attribute("data-index") for i in range(marks.count())] == ["0", "1"]
                rows = frame.locator("tr.ct-attempt")
                assert [rows.nth(i).locator("td").nth(1).inner_text() for i in range(3)] == spot_ids
                _shoot(page, shots, "cloud-training-timeline.png")

                # the task instance's tab opens its run
                ti = f"/dags/retrain_spot/runs/{quote(spot_run, safe='')}/tasks/train/plugin/cloudtrain_run"
                page.goto(f"{airflow.url}{ti}")
                summary = page.frame_locator("iframe").locator("#ct-run-summary")
                summary.wait_for()
                assert spot["run_id"] in summary.inner_text() and "3 attempt(s)" in summary.inner_text()
                _shoot(page, shots, "cloud-training-task-tab.png")
            finally:
                browser.close()
        assert emu.running_instances() == []


def _shoot(page: Any, folders: list[Path], name: str) -> None:
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / name))

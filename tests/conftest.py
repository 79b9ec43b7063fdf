"""Test-wide settings and the shared emulated cloud.

AIRFLOW_HOME, the DAGs folder and the catalog cache are isolated before Airflow is imported. The
``emu`` fixture hands out one Emulator per session and, after every test that uses it, checks the
emulated clouds hold no live instance (and no GCE firewall rule) of ours: teardown is a guarantee, so a
leak fails the test.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_rehome import rehome as _rehome
from api_calls_hook import _api_calls  # noqa: F401  (each operator run's calls vs the permission documents)

ROOT = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="cloudtrain-tests-"))
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)  # after the session fixtures' ends
DAGS_FOLDER = _HOME / "dags"
DAGS_FOLDER.mkdir()
os.environ["AIRFLOW_HOME"] = str(_HOME / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_FOLDER)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["CLOUDTRAIN_CACHE_DIR"] = str(_HOME / "cache")
# dag.test() runs triggers in the test process: the triggerer's heap freeze (triggers.heap) would
# freeze each xdist worker at its first deferred test, whichever that was. Its own tests, the
# deployment test's real triggerer and the benchmark run it as a triggerer does.
os.environ["AIRFLOW__CLOUDTRAIN__FREEZE_TRIGGERER_HEAP"] = "False"
# numpy's OpenBLAS starts a thread per core at import (the policy tests import numpy at collection): six
# workers on two cores gain nothing from it, and a worker with a thread of its own does not fork its
# first tries' warm parent (``pytest_collection_finish`` below)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Jobs run in a login shell (``bash -lc``), as on a cloud image. The tests' agents must not read this
# machine's own dotfiles: a ~/.bashrc running ``pyenv init`` rehashes in every job, and a job killed
# mid-rehash leaves pyenv's lock behind, after which every job waits 60 s for it. The image's HOME
# has only the profile the emulator gives its machines (this environment's Python first on PATH).
_IMAGE_HOME = _HOME / "home"
_IMAGE_HOME.mkdir()
(_IMAGE_HOME / ".bash_profile").write_text(f'export PATH="{os.path.dirname(sys.executable)}:$PATH"\n')
os.environ["HOME"] = str(_IMAGE_HOME)
for _var in (
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AWS_ENDPOINT_URL",
):
    os.environ.pop(_var, None)
# Two DAG bundles, as a deployment may configure them: the DAGs the tests write (the DAGs folder) and
# the example DAGs where they are. ``dag.test()`` re-parses the whole bundle that owns its DAG on every
# call (Airflow re-syncs it so that sibling DAGs are in the database): with the examples in a bundle
# of their own, a test DAG's call parses the test's own file, not the 15 examples too (0.08
# CPU-seconds a call, a few hundred calls a suite). ``dag_helpers.load_example`` looks in both.
_LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(
    [
        {"name": "dags-folder", "classpath": _LOCAL_BUNDLE, "kwargs": {}},
        {"name": "example-dags", "classpath": _LOCAL_BUNDLE, "kwargs": {"path": str(ROOT / "example_dags")}},
    ]
)
# A worker forked from the warm parent (``worker_zygote``) has Airflow imported with the controller's
# home: it moves to this worker's now, before any test module or fixture reads Airflow's settings
_rehome(os.environ["AIRFLOW_HOME"])


@pytest.fixture(autouse=True)
def _dag_files_leave_with_their_test() -> Iterator[None]:
    """The DAG files a test wrote into the DAGs folder are removed after it.

    Every ``dag.test()`` parses and re-serializes the whole DAGs folder (Airflow re-syncs the bundle
    that owns the DAG, so that sibling DAGs are in the database): each file an earlier test left there
    made every later call of the worker slower, 5 ms of CPU per file, 0.3 CPU-seconds per call once a
    worker had written 40 of them. Files written before the test (module fixtures, the examples) stay."""
    before = set(os.listdir(DAGS_FOLDER))
    yield
    for name in set(os.listdir(DAGS_FOLDER)) - before:
        path = DAGS_FOLDER / name
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """A migrated metadata DB (sqlite) for dag.test(): a copy of the one the xdist controller migrated
    while the workers collected (``_migrate_a_template``), else migrated here."""
    from airflow.utils import db
    from waiting import wait_for

    template = os.environ.get(_DB_TEMPLATE)
    target = Path(os.environ["AIRFLOW_HOME"]) / "airflow.db"
    if template and not target.exists():
        ready, failed = Path(f"{template}.ready"), Path(f"{template}.failed")
        wait_for(lambda: ready.exists() or failed.exists(), timeout=600, message="the template DB")
        if ready.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(template, f"{target}.part")
            os.replace(f"{target}.part", target)
            return
    db.initdb()


_DB_TEMPLATE = "CLOUDTRAIN_TEST_DB_TEMPLATE"


def _migrate_a_template() -> None:
    """In the xdist controller: migrate one metadata DB, in a process beside the workers' collection,
    for every worker to copy (``airflow_db``) instead of each migrating its own (about 4 CPU-seconds
    each). ``<db>.ready`` or ``<db>.failed`` says how it went; a worker whose template failed migrates."""
    home = _HOME / "template"
    home.mkdir()
    template = home / "airflow.db"
    errors = (home / "initdb.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from airflow.utils import db; db.initdb()"],
        env={**os.environ, "AIRFLOW_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    errors.close()

    def mark() -> None:
        done = proc.wait()
        Path(f"{template}.ready" if done == 0 and template.exists() else f"{template}.failed").touch()

    threading.Thread(target=mark, name="template-db", daemon=True).start()
    os.environ[_DB_TEMPLATE] = str(template)  # the workers, started after this, inherit it


_WORKER_ZYGOTE: list[subprocess.Popen[bytes]] = []


def _fork_the_workers(config: pytest.Config) -> None:
    """In the xdist controller: the workers are forked from one warm parent (``worker_zygote``) that
    imported once the libraries each worker imported again, instead of started as fresh interpreters
    (``worker_fork`` is the "python" xdist starts for each). ``CLOUDTRAIN_TEST_FORK_WORKERS=0``: plain."""
    if os.environ.get("CLOUDTRAIN_TEST_FORK_WORKERS", "1") == "0":
        return
    tx = list(config.getoption("tx") or [])
    if not tx or any(spec != "popen" for spec in tx):  # the user's own --tx: theirs
        return
    import socket

    from worker_fork import SOCKET_SETTING

    path = _HOME / "worker-zygote.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)  # bound here: the workers' requests wait in it while the parent imports
    zygote = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "worker_zygote.py"), str(listener.fileno())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        pass_fds=[listener.fileno()],
    )
    listener.close()
    _WORKER_ZYGOTE.append(zygote)
    os.environ[SOCKET_SETTING] = str(path)  # the workers' "python" (started after this) asks there
    python = f"{sys.executable} {ROOT / 'tests' / 'worker_fork.py'}"
    config.option.tx = [f"popen//python={python}" for _ in tx]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The workers' warm parent ends once its forks have (its stdin closed)."""
    for zygote in _WORKER_ZYGOTE:
        assert zygote.stdin is not None
        zygote.stdin.close()
        try:
            zygote.wait(60)
        except subprocess.TimeoutExpired:
            zygote.kill()


@pytest.fixture(scope="session")
def _emulator() -> Iterator[Any]:
    from airflow_cloudtrain.emulator import Emulator

    with Emulator() as emulator:
        yield emulator


@pytest.fixture()
def emu(_emulator: Any) -> Iterator[Any]:
    """The emulated clouds; fails the test if an instance, a GCE firewall rule of a run or a Vertex AI
    job of ours is still there afterwards."""
    _emulator.clear_faults()
    yield _emulator
    _emulator.clear_faults()
    deadline = time.monotonic() + 60  # a deadline for a loaded machine: ends are usually at once
    left = _emulator.running_instances()
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = _emulator.running_instances()
    if left:
        for inst in left:  # clean up so one leak does not fail every later test
            _emulator._reclaim(inst["id"])
        pytest.fail(f"leaked instances: {left}")
    rules = _run_firewall_rules(_emulator)  # a run's rules go after its VMs (``clouds.gcp_firewall``)
    while rules and time.monotonic() < deadline:
        time.sleep(0.3)
        rules = _run_firewall_rules(_emulator)
    if rules:
        for project, name in rules:
            _emulator.gce.state(project)._firewalls.pop(name, None)
        pytest.fail(f"leaked firewall rules: {rules}")
    jobs = _running_jobs(_emulator)
    while jobs and time.monotonic() < deadline:
        time.sleep(0.3)
        jobs = _running_jobs(_emulator)
    if jobs:
        for job in jobs:
            _emulator.fail_job(job["name"], "left running by a test")
        pytest.fail(f"Vertex AI jobs left running: {[j['name'] for j in jobs]}")


def _run_firewall_rules(emulator: Any) -> list[tuple[str, str]]:
    """(project, name) of the firewall rules runs make (``ct-<digest>-deny``/``-ssh``/``-ssh6``)."""
    from airflow_cloudtrain.clouds.gcp.firewall import digest_of

    return [
        (project, rule["name"])
        for project in emulator.gce.projects()
        for rule in emulator.gce.firewalls(project)
        if digest_of(rule["name"])
    ]


def _running_jobs(emulator: Any) -> list[dict[str, Any]]:
    """Vertex AI jobs of ours not ended (a cancel in progress counts: it ends on its own)."""
    ended = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_CANCELLING"}
    return [
        j
        for j in emulator.vertex.jobs()
        if j["state"] not in ended and (j.get("labels") or {}).get("cloudtrain-managed") == "true"
    ]


# The longest tests start first, each worker with its part of them (``worker_shares``: ``--dist
# worksteal`` cuts the collection into one contiguous share per worker, so the files below are dealt over
# the shares in turns, then the other files in collection order, whole where they fit). The order
# is measured (``make test PYTEST_ARGS="--durations=0"`` of 2026-11-28): the files by their longest test,
# then by their tests' total time; the order inside a file is kept.
HEAVY_FIRST = (
    "tests/deployment/test_production.py",
    "tests/deployment/test_ui_page.py",
    "tests/cloud/test_budget_stop.py",
    "tests/deployment/",
    "tests/cloud/test_orphans_restart.py",
    "tests/cloud/test_spot_fleet.py",
    "tests/dags/test_retrain_spot.py",
    "tests/cloud/test_fleet_killed.py",
    "tests/cloud/test_emulator_cli.py",
    "tests/dags/test_mlengine_example.py",
    "tests/cloud/test_orphans.py",
    "tests/cloud/test_preemptible_group.py",
    "tests/cloud/test_fault_campaign.py",
    "tests/dags/test_spot_sweep.py",
    "tests/cloud/test_gang_resume.py",
    "tests/cloud/test_leave_on_demand.py",
    "tests/dags/test_distributed_train.py",
    "tests/cloud/test_checkpoint_layouts.py",
    "tests/cloud/test_runs.py",
    "tests/cloud/test_agent.py",
    "tests/cloud/test_secrets.py",
    "tests/cloud/test_idle_everywhere.py",
    "tests/cloud/test_orphans_gce.py",
    "tests/cloud/test_zone_move.py",
    "tests/cloud/test_vertex_connection.py",
    "tests/cloud/test_fleet_silent_worker.py",
    "tests/cloud/test_checkpoint_resume.py",
    "tests/dags/test_example_dags.py",
    "tests/cloud/test_resume_killed.py",
    "tests/cloud/test_mlengine_train.py",
    "tests/cloud/test_agent_worker.py",
    "tests/cloud/test_mlengine_killed.py",
    "tests/cloud/test_gang_barrier.py",
    "tests/cloud/test_agent_idle.py",
    "tests/cloud/test_worker_killed.py",
    "tests/cloud/test_vertex_trigger.py",
    "tests/cloud/test_run_trigger_scale.py",
    "tests/cloud/test_gang_run.py",
    "tests/cloud/test_emulator_faults.py",
    "tests/cloud/test_emulator_groups.py",
    "tests/cloud/test_agent_live.py",
    "tests/cloud/test_old_release_adoption.py",
    "tests/cloud/test_gce_firewall.py",
    "tests/cloud/test_gang_killed.py",
    "tests/cloud/test_sensor.py",
    "tests/cloud/test_emulator_sessions.py",
    "tests/cloud/test_gang_example.py",
    "tests/cloud/test_agent_checkpoints.py",
    "tests/dags/test_demo_output.py",
    "tests/unit/test_policy_optimum.py",
    "tests/unit/test_cli.py",
)


# Mirrors: cases whose promise another case of ``make test`` proves through the same code (the same
# checkpoint layouts on the other store, the same loop in the other mode or on the other cloud, the
# same budget check). They run in ``make faults`` (marker ``faults``), and docs/testing.md names the
# case that keeps each promise in ``make test``. A node id that starts with one of these is marked.
FAULTS_MIRRORS = (
    "tests/cloud/test_checkpoint_layouts.py::test_framework_layout_resumes_after_two_interruptions[gs-",
    "tests/cloud/test_checkpoint_layouts.py::test_a_job_killed_while_writing_restores_the_previous_version[gs-",
    "tests/cloud/test_checkpoint_resume.py::test_interruptions_resume_from_the_latest_complete_checkpoint[aws-deferrable]",
    "tests/cloud/test_checkpoint_resume.py::test_interruptions_resume_from_the_latest_complete_checkpoint[gcp-blocking]",
    "tests/cloud/test_budget_stop.py::test_a_run_stops_at_its_budget_with_its_checkpoint[gcp-True]",
    "tests/cloud/test_budget_stop.py::test_a_vertex_job_is_cancelled_at_its_budget[blocking]",
    "tests/cloud/test_runs.py::test_a_run_survives_30_percent_of_compute_engine_and_gcs_calls_throttled[blocking]",
    "tests/cloud/test_runs.py::test_a_run_survives_30_percent_of_ec2_and_s3_calls_throttled[deferrable]",
)


def pytest_configure(config: pytest.Config) -> None:
    """No forced ``gc.collect()`` when a worker ends: pytest runs one at its unconfigure to flush
    unraisable exceptions (PyPy's need, its own comment says), and on a worker's heap (Airflow, moto,
    the parsed botocore models) that took seconds at the very end of every worker's run. Unraisable
    exceptions during the tests are reported as before (the hook stays installed). And the items'
    order for the workers' shares (``_Shares``), and in the xdist controller the workers' template DB."""
    config.pluginmanager.register(_Shares(), "cloudtrain-worker-shares")
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        _migrate_a_template()
        _fork_the_workers(config)
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:  # another pytest: its default
        return
    config.stash[gc_collect_iterations_key] = 0


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(FAULTS_MIRRORS):
            item.add_marker(pytest.mark.faults)


class _Shares:
    """Deals the items over the xdist workers' shares once ``-m`` has deselected (``worker_shares``)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from worker_shares import deal

        heavy: list[list[pytest.Item]] = [[] for _ in HEAVY_FIRST]
        files: dict[str, list[pytest.Item]] = {}
        for item in items:
            path = item.nodeid.split("::", 1)[0]
            rank = next((n for n, prefix in enumerate(HEAVY_FIRST) if path.startswith(prefix)), None)
            if rank is None:
                files.setdefault(path, []).append(item)
            else:
                heavy[rank].append(item)
        workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
        items[:] = deal([g for g in heavy if g] + list(files.values()), workers)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker that may run a kill test forks its first tries' warm parent from itself now, before any
    test started a thread (``first_try.prefork``): one parent started as a script costs what this
    worker pays anyway for its own ``dag.test()`` runs, again."""
    if session.config.option.collectonly:
        return
    if any(getattr(getattr(item, "module", None), "start_first_try", None) for item in session.items):
        import first_try

        first_try.prefork()


# Per-test CPU, for benchmarks/suite_cost.py: with CLOUDTRAIN_TEST_CPU_LOG set, each worker appends one
# JSON line per test: its wall seconds, this process's CPU (every thread: the test, the emulator's servers,
# dag.test()'s task and triggers) and its reaped children's (the agents and jobs the emulator ran,
# dag.test() subprocesses) during the test's setup, call and teardown.
_CPU_LOG = os.environ.get("CLOUDTRAIN_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not _CPU_LOG:
        yield
        return
    import json
    import resource

    def children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    began, wall, own, kids = time.time(), time.monotonic(), time.process_time(), children()
    yield
    line = {
        "test": item.nodeid,
        "start": round(began, 3),  # the suite's timeline: which worker ran what, and when
        "wall_s": round(time.monotonic() - wall, 3),
        "cpu_s": round(time.process_time() - own, 3),
        "children_cpu_s": round(children() - kids, 3),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with open(_CPU_LOG, "a") as out:
        out.write(json.dumps(line) + "\n")

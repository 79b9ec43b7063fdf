"""The randomized fault campaign (issue 26): runs under random faults end as documented, leak nothing,
and never run twice.

    python benchmarks/faults.py --scenarios 200 --seed 7 [--workers 2] [--only s042] [--json]

Each scenario is drawn from ``--seed`` and its number alone (``random.Random(f"{seed}/{n}")``), so
``--only ID --seed S`` replays exactly the scenario a campaign reported as failing: an operator (single
run, checkpoint-resume, a 2-node gang, spot fleet, preemptible group, Vertex AI), a cloud it allows, a
mode (blocking / deferrable), and 1 to 3 faults from ``VOCABULARY`` (docs/reliability.md): at most one
on the Airflow side (a worker SIGKILLed at a drawn point and retried, the triggerer lost with it, the
watcher gone for good so the lease lapses) and the rest on the cloud side (a spot interruption with or
without notice, no capacity at launch for a while, API throttling); then, each drawn after the rest
so earlier draws stay, a burst of server errors, a dead agent, the run folder's writes failing for a
while or for good, the task cleared by hand while it runs, the run folder's writes refused as access
denied for a while or for good, and the task marked failed by hand while it runs.

A scenario runs through real Airflow: each try is ``dag.test()`` in a process of its own, forked
from a warm parent that paid Airflow's start once (``tests/first_try.py``, as the kill tests do),
against emulated clouds owned by the campaign's worker process (one ``Emulator`` and one Airflow
home per worker: a throttle or a capacity fault touches only its own scenario). Afterwards it checks:

    leaks       nothing carrying the run key is left on the emulated cloud (every kind ``cloudtrain gc``
                lists: instances, VMs powered off or not, groups, templates, queues, topics, firewall
                rules, placement groups and policies, secrets, Vertex AI jobs), once the run ended; a
                run whose lease lapsed gets one ``cloudtrain gc`` sweep first (what a deployment
                schedules daily). The run's running index entries gc would delete are reported
                (``index_left``), not counted: nothing bills for them.
    duplicates  never more live instances of the run at once than it may have (1, a gang's nodes, a
                fleet's max_workers: sampled every half second through the cloud's API), a single
                run that was never interrupted launched one instance, however often its worker died,
                and a Vertex AI run submitted one job (two when cleared: the clear asks for a new one).
    outcome     the task's final state is what the faults imply: success, or a named failure
                (``MAY_FAIL``), or for a lapsed lease: ``orphaned.json`` written, the job done, or
                nothing of the run running any more (never launched, taken by the cloud, or its
                workers left their group).
    ledger      a checkpoint-resume run's ledger: its totals are its rows' sums, and once its loop
                ended, every instance it launched has its row (not judged under run-folder faults).

The table counts scenarios per operator x fault; every failing scenario prints its id and seed.
``CLOUDTRAIN_FAULTS_KEEP_LOGS=DIR`` keeps every try's log (``<time>-<dag_id>-try<n>.log``) in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from first_try import start_python  # noqa: E402  (tests/first_try.py: tries forked from a warm parent)

JOBS = str(ROOT / "tests" / "cloud" / "jobs")
VERTEX_CODE = str(ROOT / "example_dags" / "mlengine_code")
BUCKETS = {"aws": "s3://cloudtrain-emulated/faults", "gcp": "gs://cloudtrain-emulated/faults"}
REGION = {"aws": "us-east-1", "gcp": "us-central1"}
TYPE = {"aws": "t3.medium", "gcp": "n1-standard-2"}
PROVIDER = {"ec2": "aws", "ec2spot": "aws", "gcloud": "gcp", "gcspot": "gcp", "vertex": "gcp"}
SHORT_LEASE_S = 6.0  # the lease_lapse fault's orphan_timeout; other scenarios keep runs across retries
LONG_LEASE_S = 600.0
TRY_TIMEOUT_S = 600.0  # one try on a loaded 2-core machine: Airflow's start alone can take a minute

# operator -> (clouds it runs on, the most live instances one run may have at once)
OPERATORS: dict[str, tuple[tuple[str, ...], int]] = {
    "train": (("ec2", "ec2spot", "gcloud", "gcspot"), 1),
    "resume": (("ec2spot", "gcspot"), 1),
    "gang": (("ec2spot", "gcspot"), 2),
    "fleet": (("ec2spot",), 2),
    "group": (("gcspot",), 2),
    "vertex": (("vertex",), 0),
}
AIRFLOW_SIDE = ("kill_after_start", "kill_waiting", "kill_at_end", "triggerer_lost", "lease_lapse")
CLOUD_SIDE = ("preempt_notice", "preempt_now", "capacity", "throttle")
# drawn on its own after the rest, so a campaign's earlier draws stay what they were before it came:
# a burst of server errors (5xx) on 30% of every cloud call for SERVER_ERRORS_S seconds
SERVER_ERRORS, SERVER_ERRORS_P, SERVER_ERRORS_S = "server_errors", 0.2, 20.0
# drawn last, the same way: an instance's agent dies (killed, out of memory) while its machine runs on,
# so nothing reports the job's end; the operator's watchdog (heartbeat_timeout) must notice. Not for
# Vertex AI (no agent of ours there)
AGENT_CRASH, AGENT_CRASH_P, CRASH_HEARTBEAT_TIMEOUT = "agent_crash", 0.15, "15s"
# drawn last, the same way: the run folder's object writes fail (5xx) for the agent, the operator or
# both, from a drawn 0-6 s after the run folder's first object appeared: for WRITES_S seconds (a transient window: the run must
# ride it out with retries) or, in a quarter of them, until the task's last try ended (a long window:
# success or a named failure; nothing left, never launched twice either way). Not for Vertex AI
FOLDER_WRITES, FOLDER_WRITES_LONG, FOLDER_WRITES_P, WRITES_S = (
    "folder_writes",
    "folder_writes_long",
    0.15,
    10.0,
)
WRITES_SIDES = {"agent": "instance", "operator": "airflow", "both": None}  # -> Emulator.fail_writes' side
# drawn last, the same way, in a third of the scenarios without an Airflow-side fault: the task is
# cleared by hand while it runs (a drawn 1-6 s into its wait or deferral): the running try gets SIGTERM,
# so on_kill (or, deferred, the trigger's on_kill, called by the triggerer) releases the run, and the
# task runs again; the next try relaunches (or adopts) cleanly
CLEARED, CLEARED_P = "cleared", 1 / 3
# drawn last, the same way, in the scenarios without a run-folder fault yet (not Vertex AI): the run
# folder's writes refused as access denied (S3 403 AccessDenied, GCS 403 forbidden: a bucket policy or
# an IAM change lands mid-run), for WRITES_S seconds or, in half of them, for good; whose and when
# drawn as for folder_writes. Access denied is not transient: nothing retries it, so the run may fail
# (naming the refusal), and must leave nothing and never launch twice either way
FOLDER_DENIED, FOLDER_DENIED_LONG, FOLDER_DENIED_P = "folder_denied", "folder_denied_long", 0.1
# drawn last, the same way, in a quarter of the scenarios still without an Airflow-side fault: the task
# marked failed by hand while it runs: as for cleared (SIGTERM and on_kill, or the trigger's on_kill),
# but no try follows: the run is released, nothing is left and nothing relaunches it
MARKED_FAILED, MARKED_FAILED_P = "marked_failed", 0.25
BY_HAND = (CLEARED, MARKED_FAILED)  # the task's state changed by hand while it runs
FOLDER_FAULTS = (FOLDER_WRITES, FOLDER_WRITES_LONG, FOLDER_DENIED, FOLDER_DENIED_LONG)
VOCABULARY = (
    AIRFLOW_SIDE
    + CLOUD_SIDE
    + (SERVER_ERRORS, AGENT_CRASH, FOLDER_WRITES, FOLDER_WRITES_LONG, CLEARED)
    + (FOLDER_DENIED, FOLDER_DENIED_LONG, MARKED_FAILED)
)
# what a run whose folder cannot be written for good may fail with: the store's error, or its silent
# agent (its heartbeats are writes to the folder)
WRITE_FAILURE = r"stopped beating|InternalError|ServiceUnavailable|backendError|\b50[03]\b"
# what a run whose folder refuses its writes as access denied must fail with: the refusal itself
DENIED_FAILURE = r"AccessDenied|storage\.objects\.create"
# failures the faults may legitimately cause, by operator: (fault, regex the try's log must match)
MAY_FAIL: dict[str, dict[str, str]] = {
    "train": {
        AGENT_CRASH: r"stopped beating",
        "preempt_notice": r"interrupt|preempt|reclaim",
        "preempt_now": r"interrupt|preempt|reclaim|terminated|lost",
        "capacity": r"capacity|ZONE_RESOURCE_POOL_EXHAUSTED|InsufficientInstanceCapacity",
    },
    "resume": {"capacity": r"capacity|ZONE_RESOURCE_POOL_EXHAUSTED|InsufficientInstanceCapacity"},
    "gang": {"capacity": r"capacity|ZONE_RESOURCE_POOL_EXHAUSTED|InsufficientInstanceCapacity"},
}
for _allowed in (MAY_FAIL.setdefault(op, {}) for op in ("train", "resume", "gang", "fleet", "group")):
    _allowed[FOLDER_WRITES_LONG] = WRITE_FAILURE
    _allowed[FOLDER_DENIED] = _allowed[FOLDER_DENIED_LONG] = DENIED_FAILURE


@dataclass
class Scenario:
    id: str
    seed: int
    operator: str
    cloud: str
    deferrable: bool
    faults: list[str]
    kill_delay_s: float  # when a timed kill fires after the wait (or the deferral) began
    writes_side: str = "both"  # folder_writes: whose writes fail (WRITES_SIDES)
    writes_at_s: float = 0.0  # folder_writes: when the window opens, after the folder's first object
    # appeared (negative: before the first try started; only fixed scenarios do that)

    @property
    def provider(self) -> str:
        return PROVIDER[self.cloud]

    @property
    def dag_id(self) -> str:
        return f"faults_{self.seed}_{self.id}"


def draw(seed: int, n: int) -> Scenario:
    """Scenario ``n`` of campaign ``seed``: the same whatever else the campaign draws."""
    rnd = random.Random(f"{seed}/{n}")
    operator = rnd.choice(sorted(OPERATORS))
    cloud = rnd.choice(OPERATORS[operator][0])
    deferrable = rnd.random() < 0.5
    airflow = [f for f in AIRFLOW_SIDE if deferrable or f != "triggerer_lost"]
    clouds = [f for f in CLOUD_SIDE if operator != "vertex" or f == "throttle"]
    if cloud in ("ec2", "gcloud"):  # on-demand: nothing to interrupt
        clouds = [f for f in clouds if not f.startswith("preempt")]
    count = rnd.randint(1, 3)
    faults = [rnd.choice(airflow)] if rnd.random() < 0.7 else []
    faults += rnd.sample(clouds, min(len(clouds), count - len(faults)))
    faults = faults or [rnd.choice(airflow)]
    if rnd.random() < SERVER_ERRORS_P:
        faults.append(SERVER_ERRORS)
    if operator != "vertex" and rnd.random() < AGENT_CRASH_P:
        faults.append(AGENT_CRASH)
    delay = round(rnd.uniform(1, 6), 1)  # drawn before what came later, so earlier draws stay
    side, at = "both", 0.0
    if operator != "vertex" and rnd.random() < FOLDER_WRITES_P:
        faults.append(FOLDER_WRITES_LONG if rnd.random() < 0.25 else FOLDER_WRITES)
        side, at = rnd.choice(sorted(WRITES_SIDES)), round(rnd.uniform(0, 6), 1)
    if not set(faults) & set(AIRFLOW_SIDE) and rnd.random() < CLEARED_P:
        faults.append(CLEARED)
    if operator != "vertex" and rnd.random() < FOLDER_DENIED_P and not set(faults) & set(FOLDER_FAULTS):
        faults.append(FOLDER_DENIED_LONG if rnd.random() < 0.5 else FOLDER_DENIED)
        side, at = rnd.choice(sorted(WRITES_SIDES)), round(rnd.uniform(0, 6), 1)
    if not set(faults) & {*AIRFLOW_SIDE, CLEARED} and rnd.random() < MARKED_FAILED_P:
        faults.append(MARKED_FAILED)
    return Scenario(f"s{n:03d}", seed, operator, cloud, deferrable, sorted(faults), delay, side, at)


# --- the DAG each scenario runs ---------------------------------------------------------------------

DAG_SOURCE = """
import os
import signal
import threading
from datetime import datetime

from airflow.sdk import DAG

from airflow_cloudtrain.operators import {cls}

KILL = os.environ.get("CT_FAULT_KILL", "")  # set only in the try that plays the lost worker
DELAY = float(os.environ.get("CT_FAULT_DELAY", "0"))
CLEARING = []  # the clear fires once per try
CLEARED_NOW = threading.Event()  # the clear of a deferred try fired: its trigger is cancelled


def die():
    os.kill(os.getpid(), signal.SIGKILL)  # no finally, no on_kill, no trigger cleanup


def die_later():
    timer = threading.Timer(DELAY, die)
    timer.daemon = True
    timer.start()


def clear_later(trigger=None):
    # the task cleared (or marked failed) by hand: a running try gets SIGTERM (Airflow's handler calls on_kill; the
    # override below then ends the process, as the supervisor does); a deferred one's trigger is
    # cancelled by the triggerer, which calls the trigger's on_kill, and the try is over
    def clear():
        if trigger is None:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        # Airflow's triggerer cancels the trigger's run first, then awaits its on_kill: no event of
        # it reaches the task after that (s046: the run went on here and reported the job on_kill
        # cancelled, failing the task)
        CLEARED_NOW.set()
        import asyncio
        asyncio.run(trigger.on_kill())
        die()

    timer = threading.Timer(DELAY, clear)
    timer.daemon = True
    timer.start()


class Faulty({cls}):
    def new_engine(self, context):
        engine = super().new_engine(context)
        start, wait, advance, resume = engine.start, engine.wait, engine.advance, engine.resume

        def start_():
            step = start()
            if KILL == "kill_after_start":  # launched; nobody waits on it yet
                die()
            return step

        def wait_(handle):
            if KILL in ("kill_waiting", "lease_lapse"):
                die_later()
            if KILL in ("cleared", "marked_failed") and not CLEARING:
                CLEARING.append(1)
                clear_later()
            return wait(handle)

        def advance_(handle, outcome):
            if KILL == "kill_at_end":  # the run ended; its release never happened
                die()
            return advance(handle, outcome)

        def resume_(event):
            if CLEARED_NOW.is_set():  # the cancelled trigger's event: it never comes back
                threading.Event().wait()  # until the clear's die()
            if KILL == "kill_at_end":
                die()
            return resume(event)

        engine.start, engine.wait, engine.advance, engine.resume = start_, wait_, advance_, resume_
        return engine

    def on_kill(self):
        super().on_kill()
        if KILL in ("cleared", "marked_failed"):  # released; the supervisor ends the try (cleared: the
            die()  # task is scheduled again; marked failed: it is over)

    def defer(self, *args, **kwargs):
        # dag.test() runs the trigger in this process; a deferred task waits there, so kill_waiting
        # (drawn in either mode) plays as triggerer_lost (it was a no-op in a deferrable scenario)
        if KILL in ("triggerer_lost", "lease_lapse", "kill_waiting"):
            die_later()
        if KILL in ("cleared", "marked_failed") and not CLEARING:
            CLEARING.append(1)
            clear_later(kwargs.get("trigger", args[0] if args else None))
        return super().defer(*args, **kwargs)


with DAG("{dag_id}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    Faulty(task_id="train", deferrable={deferrable}, {kwargs})
"""

TRY = """
import json, os, sys
from datetime import datetime
import importlib.util
spec = importlib.util.spec_from_file_location("scenario_dag", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
when = datetime.fromisoformat({when!r})
run = module.dag.test(logical_date=when, run_after=when)
ti = run.get_task_instance("train")
try:
    result = ti.xcom_pull(task_ids="train")
except Exception:
    result = None
print("CT_FAULTS_RESULT " + json.dumps({{"state": str(ti.state), "xcom": result}}, default=str), flush=True)
os._exit(0)  # the task's end is recorded: a try does not wait for threads the run left (a worker exits)
"""


def operator_kwargs(s: Scenario) -> tuple[str, str]:
    """(operator class, its arguments as source) for a cheap run of the scenario's shape."""
    bucket = BUCKETS[s.provider]
    lease = SHORT_LEASE_S if "lease_lapse" in s.faults else LONG_LEASE_S
    common = (
        f"bucket={bucket!r}, region={REGION[s.provider]!r}, poll_interval=1, live_prices=False, "
        f"orphan_timeout={lease}"
    )
    if AGENT_CRASH in s.faults or FOLDER_WRITES_LONG in s.faults:  # the watchdog that notices a dead
        # (or, its heartbeats failing for good, silent) agent, short enough for a scenario
        common += f", heartbeat_timeout={CRASH_HEARTBEAT_TIMEOUT!r}"
    if s.operator == "vertex":
        return "MLEngineTrainOperator", (
            f"region='us-central1', bucket={bucket!r}, code={VERTEX_CODE!r}, python_module='trainer.task', "
            f"scale_tier='BASIC', job_id={('ct_' + s.dag_id)!r}, poll_interval=1, log_polling_interval=1, "
            f"orphan_timeout={lease}, "
            "training_args=['--steps', '16', '--step-s', '0.25', '--checkpoint-every', '2']"
        )
    machine = f"cloud={s.cloud!r}, instance_type={TYPE[s.provider]!r}, {common}"
    if s.operator == "train":
        job = "echo started; sleep 5; echo trained > $CLOUDTRAIN_OUTPUT_DIR/model.txt"
        return "CloudTrainOperator", f"{machine}, command={job!r}"
    if s.operator in ("resume", "gang"):
        nodes = ", num_nodes=2" if s.operator == "gang" else ""
        # a dead agent is a lost attempt, which spends the error budget (0 by default: the task would
        # fail naming it); error restarts let the loop show it relaunches from the checkpoint: two,
        # since on a loaded machine (CI: six workers on two cores) a live agent's beats can land more
        # than the scenario's 15 s apart, which the watchdog rightly calls a lost agent too
        errors = ", max_restarts_on_errors=2" if AGENT_CRASH in s.faults else ""
        return "CheckpointResumeOperator", (
            f"{machine}, code={JOBS!r}, command='python3 steps.py 16 2 0.4', checkpoint_interval=1, "
            f"max_restarts=4{nodes}{errors}"
        )
    items = [{"steps": 8, "step_s": 0.4, "n": n} for n in range(3)]
    fleet = (
        f"{machine}, code={JOBS!r}, command='python3 item.py', lease_timeout=10, checkpoint_interval=1, "
        f"work_items={items!r}"
    )
    if s.operator == "fleet":
        return "SpotFleetOperator", f"{fleet}, num_workers=2, max_workers=2"
    return "PreemptibleGroupOperator", fleet


def run_key(s: Scenario, when: datetime) -> Any:
    from airflow_cloudtrain.contract.runs import RunKey

    return RunKey(s.dag_id, "train", f"manual__{when.isoformat()}", -1, BUCKETS[s.provider])


# --- one worker process: its own emulator and Airflow home ----------------------------------------

_EMU: Any = None
_HOME: Path | None = None


def _start_worker() -> None:
    """Called once per worker process: an Airflow home with a migrated DB, and the emulated clouds."""
    global _EMU, _HOME
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # Airflow's and the emulator's log lines: stdout
    # is the campaign's own (``--json``)
    _HOME = Path(tempfile.mkdtemp(prefix="cloudtrain-faults-"))
    (_HOME / "dags").mkdir()
    image = _HOME / "home"
    image.mkdir()
    (image / ".bash_profile").write_text(f'export PATH="{os.path.dirname(sys.executable)}:$PATH"\n')
    os.environ.update(
        {
            "AIRFLOW_HOME": str(_HOME / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(_HOME / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
            "AIRFLOW__CLOUDTRAIN__FREEZE_TRIGGERER_HEAP": "False",
            "CLOUDTRAIN_CACHE_DIR": str(_HOME / "cache"),
            "HOME": str(image),  # the jobs' login shell reads no dotfile of this machine's
        }
    )
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS"):
        os.environ.pop(var, None)
    # migrated in a process of its own: this one then holds no connection to the tries' database
    subprocess.run([sys.executable, "-c", "from airflow.utils import db; db.initdb()"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    from airflow_cloudtrain.emulator import Emulator

    _EMU = Emulator(buckets=("cloudtrain-emulated",))
    _EMU.start()
    # a pool's worker exits through multiprocessing's finalizers (atexit does not run there): the
    # emulator stops first (higher priority), then its Airflow home goes
    Finalize(None, _EMU.stop, exitpriority=10)
    Finalize(None, shutil.rmtree, args=(str(_HOME),), kwargs={"ignore_errors": True}, exitpriority=5)


@dataclass
class Outcome:
    scenario: dict[str, Any]
    passed: bool = False
    leaks: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tries: list[str] = field(default_factory=list)  # per try: killed / success / failed
    crashed: list[str] = field(default_factory=list)  # instances whose agent agent_crash killed
    index_left: list[str] = field(default_factory=list)  # running index entries left for gc (``index_left``)
    seconds: float = 0.0


class Sampler:
    """Samples the run's live instances through the cloud's API every half second, and plays the
    cloud-side faults that need a live instance (interruptions)."""

    def __init__(self, s: Scenario, digest: str, folder: Any = None) -> None:
        from airflow_cloudtrain.clouds.registry import backend_for

        self.s, self.digest = s, digest
        self.folder = folder  # the run folder: agent_crash waits for the agent's report there
        cloud = s.cloud if s.cloud != "vertex" else "gcspot"
        self.cloud = backend_for(cloud, region=REGION[s.provider]).cloud
        self.seen: set[str] = set()
        self.most = 0
        self.preempted: list[str] = []
        self.crashed: list[str] = []  # instances whose agent the agent_crash fault killed
        self.errors = 0
        self.quiet_since: float | None = None  # since when the samples saw no live instance of the run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        pending = [f for f in self.s.faults if f.startswith("preempt")]
        first_seen: dict[str, float] = {}
        while not self._stop.wait(0.5):
            try:
                alive = [i for i in self.cloud.find(self.digest) if i.state in ("pending", "running")]
            except Exception:
                self.errors += 1  # throttled: the next sample counts
                continue
            self.seen.update(i.id for i in alive)
            self.most = max(self.most, len(alive))
            running = [i for i in alive if i.state == "running"]
            now = time.monotonic()
            self.quiet_since = None if alive else (self.quiet_since or now)
            for inst in running:
                first_seen.setdefault(inst.id, now)
            if AGENT_CRASH in self.s.faults and not self.crashed:  # once an agent has reported its job
                # running (and run a few seconds), it dies; its machine runs on. Killed before its first
                # report, it would be a bootstrap that never reported: startup_timeout's case, not the
                # heartbeat watchdog's (a loaded machine's agent took more than 3 s to report: s900)
                agents = _EMU.runner.pids()
                ready = [
                    i.id
                    for i in running
                    if i.id in agents and now - first_seen[i.id] > 3.0 and self._job_running(i.id)
                ]
                if ready:
                    _EMU.crash_agent(ready[0])
                    self.crashed.append(ready[0])
            if pending and running:
                fault = pending.pop(0)
                _EMU.interrupt(running[0].id, notice_s=2.0 if fault == "preempt_notice" else 0.0)
                self.preempted.append(running[0].id)

    def _job_running(self, instance_id: str) -> bool:
        """The instance's agent has reported its job running (no folder given: assumed)."""
        if self.folder is None:
            return True
        from airflow_cloudtrain.contract.runs import RunStatus, status_key

        try:
            raw = self.folder.get_text(status_key(instance_id))
        except Exception:  # throttled: the next sample asks again
            return False
        return bool(raw) and RunStatus.from_json(raw).state == "running"

    def nothing_runs(self, for_s: float = 5.0) -> bool:
        """Every instance of the run seen has ended, and no sample saw one alive for ``for_s``: nothing
        is left running to end itself, though nothing in the run folder may say so. The cloud took the
        instance without notice and no watcher relaunched it (s001: no final status), or the run's
        writes were refused for good (s050: the group's worker saw the lease lapse, left its group and
        was terminated, its ``orphaned.json`` refused)."""
        quiet = self.quiet_since
        return bool(self.seen) and quiet is not None and time.monotonic() - quiet >= for_s

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _try(s: Scenario, path: Path, when: datetime, kill: str, number: int) -> tuple[str, str]:
    """One try of the task: ("killed" | "hung" | the task state, its log). The log is kept next to
    the scenario's DAG file (``<id>-try<n>.log``), to read while it runs or after it failed."""
    env = {**os.environ, "CT_FAULT_KILL": kill, "CT_FAULT_DELAY": str(s.kill_delay_s)}
    code = textwrap.dedent(TRY.format(path=str(path), when=when.isoformat()))
    log_path = path.with_name(f"{s.dag_id}-try{number}.log")
    proc = start_python(code, env, output=log_path)  # a fork of a warm parent: Airflow's start paid once
    try:
        proc.wait(timeout=TRY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log = log_path.read_text(errors="replace")
    if keep := os.environ.get("CLOUDTRAIN_FAULTS_KEEP_LOGS"):  # the campaign's home is removed at its end
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, Path(keep) / f"{int(time.time())}-{log_path.name}")
    found = re.findall(r"^CT_FAULTS_RESULT (.*)$", log, re.M)
    if found:
        return json.loads(found[-1])["state"], log
    if proc.returncode == -signal.SIGKILL:
        return ("killed" if kill else "hung"), log
    return f"crashed rc={proc.returncode}", log


def leftovers(s: Scenario, digest: str) -> list[Any]:
    """What ``cloudtrain gc`` lists of this run's resources on the cloud (every kind, any age)."""
    from airflow_cloudtrain.lifecycle.gc import find_leftovers

    found = find_leftovers(s.provider, REGION[s.provider], bucket=BUCKETS[s.provider], older_than_s=0)
    return [x for x in found if x.digest == digest]


def index_left(s: Scenario, digest: str) -> list[str]:
    """The run's entries in the bucket's running index that ``cloudtrain gc --bucket`` would delete
    (named ``<run id>-<instance>``, the run id ``RunKey.short_id``: they carry no digest). Not a leak
    (nothing bills; the Cloud training page hides them and gc deletes them), but reported: a killed
    try's release leaves its attempt's entry (README: "removed at its release")."""
    from airflow_cloudtrain.lifecycle.gc import find_leftovers
    from airflow_cloudtrain.lifecycle.gc_running import KIND as RUNNING_INDEX

    found = find_leftovers(s.provider, REGION[s.provider], bucket=BUCKETS[s.provider], older_than_s=0)
    return [x.id for x in found if x.kind == RUNNING_INDEX and x.id.startswith(f"ct-{digest[:12]}-")]


def _wait(condition: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(1.0)


def run_scenario(raw: dict[str, Any]) -> dict[str, Any]:
    """Play one scenario in this worker process and check its invariants."""
    s = Scenario(**raw)
    out = Outcome(asdict(s))
    started = time.monotonic()
    try:
        _play(s, out)
    except Exception as err:  # a campaign bug or an unexpected error: the scenario fails, loudly
        out.problems.append(f"error: {type(err).__name__}: {err}"[:500])
    finally:
        _EMU.clear_faults()
    out.seconds = round(time.monotonic() - started, 1)
    out.passed = not (out.leaks or out.duplicates or out.problems)
    return asdict(out)


def _play(s: Scenario, out: Outcome) -> None:
    from airflow_cloudtrain.contract.lease import ORPHANED_KEY
    from airflow_cloudtrain.contract.runs import join
    from airflow_cloudtrain.storage import open_run_folder

    assert _HOME is not None
    cls, kwargs = operator_kwargs(s)
    path = _HOME / "dags" / f"{s.dag_id}.py"
    path.write_text(DAG_SOURCE.format(cls=cls, dag_id=s.dag_id, deferrable=s.deferrable, kwargs=kwargs))
    when = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=int(s.id[1:]))
    key = run_key(s, when)
    folder = open_run_folder(join(BUCKETS[s.provider], key.path()))
    kill = next((f for f in s.faults if f in (*AIRFLOW_SIDE, *BY_HAND)), "")
    if "capacity" in s.faults:  # no capacity for this type at launch, for a while
        _EMU.fail_capacity(TYPE[s.provider])
        lift = threading.Timer(12.0, _lift_capacity, args=("throttle" in s.faults,))
        lift.daemon = True
        lift.start()
    if "throttle" in s.faults:
        _EMU.throttle(0.3, seed=s.seed)
    if SERVER_ERRORS in s.faults:  # a burst: the control plane's bad minutes, then it recovers
        _EMU.unavailable(0.3, seed=s.seed + 1)
        calm = threading.Timer(SERVER_ERRORS_S, _EMU.unavailable, args=(0.0,), kwargs={"seed": None})
        calm.daemon = True
        calm.start()
    ended = threading.Event()
    window = threading.Thread(target=_writes_window, args=(s, folder, ended), daemon=True)
    if set(FOLDER_FAULTS) & set(s.faults):
        if s.writes_at_s < 0:  # from before the first try: the operator's first write is refused
            _EMU.fail_writes(folder.uri + "/", 1.0, WRITES_SIDES[s.writes_side], s.seed, _writes_kind(s))
        window.start()
    with Sampler(s, key.digest, folder) as sampler:
        state, log = _try(s, path, when, kill, 1)
        out.tries.append(state)
        if state == "killed" and kill not in ("lease_lapse", MARKED_FAILED):  # the task's retry
            state, log = _try(s, path, when, "", 2)
            out.tries.append(state)
        _end_writes_window(s, folder, ended, window)  # the task's last try ended (s104, below)
        lapsed = kill == "lease_lapse" and state == "killed"  # (a try that ended first lost no watcher)
        if lapsed and s.operator == "vertex":  # no agent of ours: `cloudtrain gc` cancels
            if not _wait(lambda: _vertex_over(s, key.digest), 240):
                out.problems.append(
                    "the lease lapsed but gc did not cancel the Vertex AI job, nor did it end"
                )
        elif lapsed:
            lapses_at = time.monotonic() + SHORT_LEASE_S
            over = _wait(  # (an agent agent_crash killed cannot end its run: only gc can, below; s024)
                lambda: (
                    sampler.crashed
                    or folder.get_text(ORPHANED_KEY)
                    or _finished(folder)
                    or sampler.nothing_runs()
                    or _never_launched(s, key.digest, sampler, lapses_at)
                ),
                240,
            )
            if not over:
                out.problems.append("the lease lapsed but the run did not end itself (no orphaned.json)")
    ended.set()
    out.crashed = list(sampler.crashed)
    if AGENT_CRASH in s.faults and not sampler.crashed and out.tries[-1:] != ["killed"]:
        print(f"{s.id}: agent_crash found no agent to kill (the job ended first)", file=sys.stderr)
    _EMU.clear_faults()
    # the outcome
    if kill in ("lease_lapse", MARKED_FAILED) and state != "killed":  # judged as any other try below
        print(f"{s.id}: {kill} never fired (the try ended {state} first)", file=sys.stderr)
    if kill == "lease_lapse" and state == "killed":  # what a deployment's daily `cloudtrain gc` does,
        # once the lease lapsed: a run the cloud reclaimed can be over before that, and gc keeps a
        # watched run's resources (s024 kept its firewall rule: the only sweep came too early)
        _wait(lambda: all(x.action == "delete" for x in leftovers(s, key.digest)), 120)
        _sweep(s)
    elif kill == MARKED_FAILED and state == "killed":
        pass  # released by on_kill, and over: no try follows (nothing left: checked below)
    elif state != "success":
        allowed = [MAY_FAIL.get(s.operator, {}).get(f) for f in s.faults]
        if state != "failed" or not any(r and re.search(r, log, re.I) for r in allowed):
            out.problems.append(f"task ended {state}, not success or a named failure: {_tail(log)}")
    # duplicates
    most = OPERATORS[s.operator][1]
    if most and sampler.most > most:
        out.duplicates.append(f"{sampler.most} live instances at once (at most {most})")
    # (a cleared task relaunches: its on_kill released the first instance)
    single = s.operator == "train" and not sampler.preempted and not {"lease_lapse", CLEARED} & set(s.faults)
    # (a task marked failed is never relaunched: its run launched one instance, however it ended)
    if single and len(sampler.seen) > 1:
        out.duplicates.append(f"{len(sampler.seen)} instances launched for one run: {sorted(sampler.seen)}")
    if s.operator == "vertex":  # the sampler sees no instance of a Vertex AI job: count the jobs
        jobs = _vertex_jobs(s, key.digest)
        allowed = 2 if CLEARED in s.faults else 1  # a clear cancels the job and asks for a new one
        if len(jobs) > allowed:
            out.duplicates.append(f"{len(jobs)} Vertex AI jobs submitted for one run: {jobs}")
        if not jobs and "success" in out.tries:  # the check (and the leak check) looks by the wrong key
            out.problems.append(f"the run's Vertex AI job is not found by its run key {key.digest}")
    if s.operator in ("resume", "gang") and not set(FOLDER_FAULTS) & set(s.faults):
        # (a gang's attempt an earlier try left has one row, its head's: its nodes are not named)
        out.problems += _ledger_problems(folder, sampler.seen if s.operator == "resume" else set())
    # leaks: everything of the run gone once it ended (ends are asynchronous: a deadline for a busy machine)
    left = _wait(lambda: not leftovers(s, key.digest), 180)
    if not left:
        out.leaks = [f"{x.kind} {x.id} ({x.state}, {x.lease})" for x in leftovers(s, key.digest)]
        _sweep(s)  # one leak must not fail every later scenario of this worker
    out.index_left = index_left(s, key.digest)
    if out.index_left:
        print(f"{s.id}: running index entries left for gc: {out.index_left}", file=sys.stderr)


def _never_launched(s: Scenario, digest: str, sampler: Sampler, lapses_at: float) -> bool:
    """The worker died before anything of the run was launched (s001 of seed 1: killed in the pause
    after a launch found no capacity): no agent exists to write ``orphaned.json``, and nothing is left
    to end. Judged once the lease lapsed (and a few samples later), so a launch the sampler has not
    seen yet is not taken for none."""
    if time.monotonic() < lapses_at + 5.0 or sampler.seen:
        return False
    try:
        return not leftovers(s, digest)
    except Exception:  # throttled: ask again on the next look
        return False


def _writes_window(s: Scenario, folder: Any, ended: threading.Event) -> None:
    """The run folder's writes fail (a server error, or access denied for the ``folder_denied`` faults),
    from ``writes_at_s`` after its first object appeared (the operator is preparing the run: a try's
    start alone takes a while; a negative ``writes_at_s``, never drawn: from before the first try, which
    ``_play`` opened), for ``WRITES_S`` (transient) or until the last try ended (long: ``_play`` then
    clears every fault)."""
    side, kind = WRITES_SIDES[s.writes_side], _writes_kind(s)
    if s.writes_at_s >= 0:
        while not _listed(folder):
            if ended.wait(0.2):
                return
        if ended.wait(s.writes_at_s):
            return
        _EMU.fail_writes(folder.uri + "/", 1.0, side, s.seed, kind)
    if {FOLDER_WRITES, FOLDER_DENIED} & set(s.faults):
        ended.wait(WRITES_S)
        _EMU.fail_writes(folder.uri + "/", 0.0, side, None, kind)


def _end_writes_window(s: Scenario, folder: Any, ended: threading.Event, window: threading.Thread) -> None:
    """The task's last try ended: a run-folder window still open closes (a long one lasts until then,
    as documented). Before s104 of seed 1 it lasted through a lapsed lease's wait too, so a fleet
    worker that saw the lease lapse spent 4 minutes retrying its last uploads (its documented budget
    under failing writes) and was swept by gc before it could end itself."""
    ended.set()
    if window.ident is not None:  # started: the scenario has a run-folder fault
        window.join(timeout=60)
        _EMU.fail_writes(folder.uri + "/", 0.0, WRITES_SIDES[s.writes_side], None, _writes_kind(s))


def _writes_kind(s: Scenario) -> str:
    return "denied" if {FOLDER_DENIED, FOLDER_DENIED_LONG} & set(s.faults) else "unavailable"


def _listed(folder: Any) -> bool:
    try:
        return bool(folder.list())
    except Exception:  # throttled: the next look counts
        return False


def _lift_capacity(throttled: bool) -> None:
    """Capacity is back; the throttle, if any, stays (GCE's clear_faults lifts the shared one too)."""
    _EMU.gce.clear_faults()
    if throttled:
        _EMU.throttle(0.3, seed=None)
    with _EMU.moto.middleware.lock:
        _EMU.moto.middleware.capacity_faults.clear()
        _EMU.moto.middleware.capacity_after.clear()


def _finished(folder: Any) -> bool:
    from airflow_cloudtrain.contract.runs import RunStatus

    keys = [k for k in folder.list("instances/") if k.endswith("/status.json")]
    statuses = [RunStatus.from_json(folder.get_text(k) or "{}") for k in keys]
    return bool(statuses) and all(x.final for x in statuses)


def _vertex_over(s: Scenario, digest: str) -> bool:
    """Has the run's Vertex AI job ended, by itself or cancelled by one round of ``cloudtrain gc`` (which
    cancels it once its lease lapsed, and leaves it alone before)?"""
    from airflow_cloudtrain.lifecycle.gc import gc

    try:
        gc(s.provider, REGION[s.provider], bucket=BUCKETS[s.provider], older_than_s=0)
        return not leftovers(s, digest)
    except Exception:  # throttled: the next round counts
        return False


def _ledger_problems(folder: Any, seen: set[str]) -> list[str]:
    """A checkpoint-resume run's ledger (``ledger/<run id>.json``): its totals are its rows' sums, and
    once the loop ended, every instance the run launched has its row (what it cost is counted). Not
    judged when the run folder's writes failed (the ledger's saves are retried, then given up)."""
    from airflow_cloudtrain.lifecycle.resume.history import RunHistory

    problems = []
    for key in [k for k in folder.list("ledger/") if k.endswith(".json")]:
        data = json.loads(folder.get_text(key) or "{}")
        stored, rows = data.get("totals") or {}, RunHistory.from_dict(data).totals()
        for name in ("attempts", "rows", "launches", "interruptions", "error_restarts", "cost_usd"):
            if stored.get(name) != rows[name]:
                problems.append(f"{key}: totals say {name}={stored.get(name)}, its rows {rows[name]}")
        accounted = {r.get("instance_id") for r in data.get("attempts", [])}
        if data.get("state") in ("succeeded", "failed") and seen - accounted:
            problems.append(f"{key} ({data['state']}) has no row for {sorted(seen - accounted)}")
    return problems


def _vertex_jobs(s: Scenario, digest: str) -> list[str]:
    """Every Vertex AI job of the run key, in any state (the docs promise one: "never submitted
    twice", whether a try died before, inside or after the create call)."""
    from airflow_cloudtrain.lifecycle.gc import sources

    vertex = next(x.backend for x in sources(s.provider, REGION[s.provider]) if x.key == "vertex")
    for look in range(5):
        try:
            return [f"{j.numeric_id} ({j.state})" for j in vertex.find(digest)]
        except Exception:  # a fault's last throttled answer: ask again
            if look == 4:
                raise
            time.sleep(1.0)
    return []


def _sweep(s: Scenario) -> None:
    from airflow_cloudtrain.lifecycle.gc import gc

    for _ in range(3):  # a lease that lapses a moment later is swept on the next round
        found = gc(s.provider, REGION[s.provider], bucket=BUCKETS[s.provider], older_than_s=0)
        if not [x for x in found if x.action == "delete" and x.result != "deleted"]:
            return
        time.sleep(2.0)


def _tail(log: str) -> str:
    """Why a try failed, from its log: the last lines that name an error (Airflow's "Marking run ...
    failed" and the result line left out: they say that it failed, not why), each cut to 400
    characters from its start, so that the reason (``the job failed 2 time(s) ...``) survives."""
    lines = [
        x
        for x in log.splitlines()
        if re.search(r"error|fail|exception", x, re.I)
        and not re.search(r"^CT_FAULTS_RESULT |airflow\.models\.dagrun|Task instance state updated", x)
    ]
    return " | ".join(x[:400] for x in lines[-4:])


# --- the campaign -----------------------------------------------------------------------------------


def table(results: list[dict[str, Any]]) -> str:
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        for fault in r["scenario"]["faults"]:
            rows[(r["scenario"]["operator"], fault)].append(r)
    lines = [
        f"{'operator':<8} {'fault':<17} {'scenarios':>9} {'passed':>6} {'leaks':>5} {'dups':>4} {'seconds':>8}"
    ]
    for (op, fault), rs in sorted(rows.items()):
        lines.append(
            f"{op:<8} {fault:<17} {len(rs):>9} {sum(r['passed'] for r in rs):>6} "
            f"{sum(bool(r['leaks']) for r in rs):>5} {sum(bool(r['duplicates']) for r in rs):>4} "
            f"{sum(r['seconds'] for r in rs):>8.0f}"
        )
    total = len(results)
    lines.append(
        f"{'all':<8} {'(each once)':<17} {total:>9} {sum(r['passed'] for r in results):>6} "
        f"{sum(bool(r['leaks']) for r in results):>5} {sum(bool(r['duplicates']) for r in results):>4} "
        f"{sum(r['seconds'] for r in results):>8.0f}"
    )
    return "\n".join(lines)


def campaign(seed: int, numbers: list[int], workers: int, echo: Any = print) -> list[dict[str, Any]]:
    scenarios = [asdict(draw(seed, n)) for n in numbers]
    results = []
    with ProcessPoolExecutor(workers, initializer=_start_worker) as pool:
        futures = [pool.submit(run_scenario, s) for s in scenarios]
        for future in as_completed(futures):
            r = future.result()
            results.append(r)
            sc = r["scenario"]
            verdict = "ok  " if r["passed"] else "FAIL"
            echo(
                f"{verdict} {sc['id']} seed={sc['seed']} {sc['operator']}/{sc['cloud']}/"
                f"{'deferrable' if sc['deferrable'] else 'blocking'} {'+'.join(sc['faults'])} "
                f"tries={','.join(r['tries'])} {r['seconds']:.0f}s"
                + ("" if r["passed"] else f"  {r['leaks'] + r['duplicates'] + r['problems']}")
            )
    return sorted(results, key=lambda r: r["scenario"]["id"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", action="append", default=[], help="a scenario id (s042) to replay; repeatable")
    p.add_argument("--json", action="store_true", help="the results as JSON on stdout (progress on stderr)")
    args = p.parse_args(argv)
    numbers = [int(x.lstrip("s")) for x in args.only] or list(range(args.scenarios))
    started = time.monotonic()
    results = campaign(
        args.seed, numbers, args.workers, lambda line: print(line, file=sys.stderr, flush=True)
    )
    wall = time.monotonic() - started
    failed = [r for r in results if not r["passed"]]
    if args.json:
        print(json.dumps({"seed": args.seed, "wall_s": round(wall), "results": results}, indent=2))
    else:
        print(table(results))
        print(f"\n{len(results)} scenarios, seed {args.seed}, {args.workers} workers: {wall:.0f} s wall")
    for r in failed:
        print(f"FAILED {r['scenario']['id']}: replay with --seed {args.seed} --only {r['scenario']['id']}",
              file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

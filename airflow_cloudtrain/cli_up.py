"""``cloudtrain up``: a local Airflow with the example DAGs against the emulated clouds, one command.

What a real deployment runs, on one machine: ``airflow api-server``, ``scheduler``, ``dag-processor``
and ``triggerer`` as separate processes (LocalExecutor, SQLite metadata database), in an
``AIRFLOW_HOME`` of their own (default ``.airflow_home/``), with the DAGs folder pointing at the
example DAGs. The emulated clouds run inside this process; their endpoints and the ``aws_default`` /
``google_cloud_default`` connections reach the Airflow processes as environment variables
(``AIRFLOW_CONN_...``, ``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``), so nothing is stored in the
database. Login is Airflow 3's simple auth manager (user ``admin``; the password is generated once and
kept in ``AIRFLOW_HOME``).

It is a small supervisor (``cli_supervisor``): a process that dies is restarted, with a line saying
so. Only Ctrl-C or SIGTERM stops every process (each runs in a session of its own, so the tasks they
started go too) and then the emulator, whose clouds' state is saved in ``<home>/emulator``
(``emulator.state``) and restored on the next start: a task still deferred at the stop picks its run
up again. ``<home>/emulator.env`` has the exports the ``cloudtrain`` CLI needs next to it.

The deployment test (``tests/deployment``) runs ``cloudtrain up`` itself, so what it checks is what a
user starts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

EXAMPLE_DAGS = Path(__file__).resolve().parents[1] / "example_dags"
# Where the example DAGs write (their bucket defaults): what the Cloud training page shows
EXAMPLE_BUCKETS = tuple(
    f"{scheme}://cloudtrain-emulated/{name}"
    for scheme, names in (
        ("s3", ("retrain", "ui-train", "ec2-train", "examples", "distributed")),
        ("gs", ("gce-train", "ui-train", "examples", "mlengine")),
    )
    for name in names
)
DEFAULT_HOME = Path(".airflow_home")
PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")
USER = "admin"
SECRETS_FILE = "cloudtrain-up.json"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"  # the simple auth manager's default
# Stopped first: they run and watch tasks, which report to the api-server's execution API while they
# release their instances (on_kill); the api-server goes last.
STOP_ORDER = ("scheduler", "triggerer", "dag-processor", "api-server")
JWT_SECRET_BYTES = 64  # HS512's recommended minimum key length
EMULATOR_DIR = "emulator"  # in AIRFLOW_HOME: the emulated clouds' work directory and saved state
ENV_FILE = "emulator.env"  # in AIRFLOW_HOME: the exports the cloudtrain CLI needs next to it


PORT_WAIT_S = 30.0  # a restart right after a stop: the old api-server may still be letting go of its port


class UpError(RuntimeError):
    """A process of the deployment could not start or died; the message says which and why."""


def ephemeral_ports_start() -> int:
    """The lowest port the kernel hands out on its own (a connection's local port, a port-0 bind)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port free on loopback now, for a server that binds it a little later: one below the
    kernel's ephemeral range when there is one, since a port from that range (what a port-0 bind
    gives) can be taken by any connection's local port between this check and the server's bind (a
    busy machine with thousands of connections meets it)."""
    import random

    top = ephemeral_ports_start()
    for _ in range(100 if top > 10001 else 0):
        port = random.randrange(10000, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, wait_s: float = 0.0) -> bool:
    """Whether the api-server can listen on ``port``, probed as it binds (``SO_REUSEADDR``, so the
    connections of a deployment stopped a moment ago, still in TIME_WAIT, do not count). ``wait_s``:
    how long to wait for a listener that is going away (a restart right after a stop)."""
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                return True
            except OSError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def home_secrets(home: Path) -> dict[str, str]:
    """The keys every process must share (JWT signing, API session, Fernet for the database) and the
    admin password: made once, kept in ``AIRFLOW_HOME`` (mode 600) so a restart keeps its database
    readable and its login. Airflow 3 writes no ``airflow.cfg``, so unset keys would differ per process."""
    from cryptography.fernet import Fernet

    home.mkdir(parents=True, exist_ok=True)
    path = home / SECRETS_FILE
    saved: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    wanted = {
        # 64 bytes at least: Airflow signs its JWTs with HS512 (the API's with the JWT secret, the log
        # servers' with the API secret key) and warns of a shorter key on every token
        "jwt_secret": lambda: secrets.token_urlsafe(JWT_SECRET_BYTES),
        "api_secret_key": lambda: secrets.token_urlsafe(JWT_SECRET_BYTES),
        "fernet_key": lambda: Fernet.generate_key().decode(),
    }
    for key in ("jwt_secret", "api_secret_key"):
        if len(saved.get(key, "")) < JWT_SECRET_BYTES:  # made by an older version: a new one
            saved.pop(key, None)  # only logins and log reads in flight are lost (a token lives minutes)
    if not all(k in saved for k in wanted):
        saved = {**{k: make() for k, make in wanted.items()}, **saved}
        path.touch(mode=0o600)
        path.write_text(json.dumps(saved))
    # the simple auth manager reads (and only adds missing users to) this file
    passwords_path = home / PASSWORDS_FILE
    passwords = json.loads(passwords_path.read_text() or "{}") if passwords_path.exists() else {}
    if USER not in passwords:
        passwords[USER] = secrets.token_urlsafe(12)
        passwords_path.touch(mode=0o600)
        passwords_path.write_text(json.dumps(passwords) + "\n")
    return {**saved, "password": passwords[USER]}


def airflow_env(
    home: Path,
    dags_folder: Path,
    port: int,
    cloud_env: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment of every Airflow process: ``base`` (default ours) without its ``AIRFLOW__*``
    settings (this deployment is self-contained), the emulator's endpoints and connections, then the
    deployment's settings, then ``extra`` (``AIRFLOW__SECTION__KEY`` overrides)."""
    keys = home_secrets(home)
    home = home.resolve()
    env = {
        k: v for k, v in (base if base is not None else os.environ).items() if not k.startswith("AIRFLOW__")
    }
    env.update(cloud_env)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder.resolve()),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",  # forked LocalExecutor workers, made all at once
            "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://localhost:{port}",
            "AIRFLOW__API__SECRET_KEY": keys["api_secret_key"],
            "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # one machine runs everything: a busy one (the dag-processor's first parse, SQLite's one
            # writer) can hold the api-server's answer for tens of seconds, and the default 5 s per
            # try failed the task before it started
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            # and a restarted api-server (cloudtrain up restarts one that died) takes a while to answer
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "10",
            # the task and trigger log servers: free ports, so a second deployment (or a test) can run
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            # the Cloud training page (airflow_cloudtrain.ui) reads these buckets' cost index
            "AIRFLOW__CLOUDTRAIN__UI_BUCKETS": os.environ.get("CLOUDTRAIN_BUCKET")
            or " ".join(EXAMPLE_BUCKETS),
        }
    )
    env.update(extra or {})
    return env


def session_pids(sid: int) -> list[int]:
    """Every live process of session ``sid`` (Linux ``/proc``): a process started in a new session and
    all it started, even those that moved to a process group of their own (Airflow's task runners)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


class LocalAirflow:
    """Airflow's processes in one ``AIRFLOW_HOME``: migrate, start, kill, restart, stop.

    Each process runs in a session of its own (its output in ``<home>/logs/<name>.out``), so stopping
    it stops everything it started, and a killed process can be restarted alone."""

    def __init__(self, home: Path, env: Mapping[str, str]) -> None:
        self.home = home.resolve()
        self.env = dict(env)
        self.port = int(self.env["AIRFLOW__API__PORT"])
        self.url = f"http://localhost:{self.port}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.sessions: set[int] = set()  # every session started, restarted ones too
        (self.home / "logs").mkdir(parents=True, exist_ok=True)

    def output(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.out"

    processes: tuple[str, ...] = PROCESSES  # what start_all starts (the production shape has more)

    def _command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "airflow", *args]

    def _process_command(self, name: str) -> list[str]:
        """The command of process ``name`` (here ``airflow <name>``; ``--production`` adds others)."""
        return self._command(name)

    def _process_env(self, name: str) -> dict[str, str]:
        """The environment of process ``name`` (here the same for all)."""
        return self.env

    def _process_user(self, name: str) -> str | None:
        """The user process ``name`` runs as (None: ours; PostgreSQL's refuses root)."""
        return None

    def migrate(self, timeout: float = 600.0) -> None:
        """``airflow db migrate``: creates or upgrades the SQLite metadata database."""
        with self.output("db-migrate").open("wb") as out:
            done = subprocess.run(
                self._command("db", "migrate"),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        if done.returncode != 0:
            raise UpError(f"airflow db migrate failed (exit {done.returncode}):\n{self.tail('db-migrate')}")

    def start(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``airflow <name>`` in a new session; its output is appended to its ``.out`` file."""
        if name == "api-server" and not port_is_free(self.port, wait_s=PORT_WAIT_S):
            raise UpError(f"port {self.port} is in use: pick another with --port")
        with self.output(name).open("ab") as out:
            proc = subprocess.Popen(
                self._process_command(name),
                env=self._process_env(name),
                cwd=self.home,  # not the caller's: a source checkout's *.egg-info would load our plugin twice
                user=self._process_user(name),
                group=self._process_user(name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.sessions.add(proc.pid)
        return proc

    def start_all(self, timeout: float = 300.0) -> None:
        """The api-server first, and the others once it answers: after a restart the scheduler and
        triggerer resume deferred tasks at once, and their workers must reach the execution API."""
        self.start("api-server")
        deadline = time.monotonic() + timeout
        while self.health() is None:
            if self.procs["api-server"].poll() is not None:
                raise UpError(f"airflow api-server exited:\n{self.tail('api-server')}")
            if time.monotonic() > deadline:
                raise UpError(f"the api-server did not answer within {timeout:.0f} s")
            time.sleep(0.5)
        for name in self.processes:
            if name not in self.procs:  # the api-server, and the production shape's database and broker
                self.start(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process of ``name``'s session (SIGKILL: as if the machine lost it)."""
        proc = self.procs[name]
        for pid in session_pids(proc.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)

    def reap(self, name: str) -> None:
        """SIGKILL what is left of ``name``'s session (the processes a dead one started)."""
        for pid in session_pids(self.procs[name].pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        self.kill(name, signal.SIGKILL)
        return self.start(name)

    def stop(self, grace_s: float = 60.0) -> None:
        """SIGTERM in ``STOP_ORDER`` (each process ends its tasks, which release their instances), then
        SIGKILL whatever of any session is left after ``grace_s``. Idempotent."""
        for name in STOP_ORDER:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            if name == "scheduler":  # its tasks' on_kill needs the api-server: let them finish first
                self._wait_exit(proc, grace_s)
        for name in STOP_ORDER:
            if name in self.procs:
                self._wait_exit(self.procs[name], grace_s)
        self._kill_what_is_left()

    def _kill_what_is_left(self) -> None:
        """SIGKILL every process still in one of the deployment's sessions (a task's children too),
        then wait up to 30 s for them to be gone."""
        for sid in self.sessions:
            for pid in session_pids(sid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self.left_running() and time.monotonic() < deadline:
            time.sleep(0.2)

    @staticmethod
    def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> None:
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)

    def left_running(self) -> list[int]:
        """Processes of any session this deployment started that are still alive."""
        return [pid for sid in self.sessions for pid in session_pids(sid)]

    def died(self) -> list[str]:
        """Names of processes that exited although nobody stopped them."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.output(name)
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def health(self) -> dict[str, Any] | None:
        """``/api/v2/monitor/health`` (no login needed), or None while the api-server does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=10) as resp:
                return dict(json.loads(resp.read()))
        except (OSError, ValueError):
            return None

    def wait_healthy(self, timeout: float = 300.0) -> None:
        """Until the api-server answers and reports the database, scheduler, triggerer and
        dag-processor healthy; UpError with the process's output if one dies first."""
        deadline = time.monotonic() + timeout
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        health: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            for name in self.died():
                raise UpError(f"airflow {name} exited ({self.procs[name].returncode}):\n{self.tail(name)}")
            health = self.health()
            if health and all((health.get(p) or {}).get("status") == "healthy" for p in parts):
                return
            time.sleep(1)
        raise UpError(f"Airflow not healthy after {timeout:.0f} s: {health}")

    def token(self, password: str, user: str = USER) -> str:
        """A JWT for the public REST API from the simple auth manager's token endpoint."""
        body = json.dumps({"username": user, "password": password}).encode()
        request = urllib.request.Request(
            f"{self.url}/auth/token", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return str(json.loads(resp.read())["access_token"])


@contextmanager
def local_airflow(
    home: Path,
    dags_folder: Path,
    port: int,
    cloud_env: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
) -> Iterator[LocalAirflow]:
    """Migrate, start the four processes, wait until healthy; stop them all on the way out."""
    airflow = LocalAirflow(home, airflow_env(home, dags_folder, port, cloud_env, extra))
    airflow.migrate()
    try:
        airflow.start_all()
        airflow.wait_healthy()
        yield airflow
    finally:
        airflow.stop()


class _Stop(Exception):
    """SIGTERM or SIGINT (Ctrl-C), raised in the main thread."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def run_up(args: argparse.Namespace) -> int:
    """Start the emulated clouds (as the last stop left them), Airflow's processes, and supervise them
    until Ctrl-C or SIGTERM; then stop Airflow and keep the clouds' state in ``<home>/emulator``."""
    from airflow_cloudtrain.cli_supervisor import Supervisor
    from airflow_cloudtrain.emulator import DEFAULT_BUCKET, Emulator, export_lines, write_env_file
    from airflow_cloudtrain.emulator.state import load, restore, save_and_stop

    home = Path(args.home)
    state_dir = home.resolve() / EMULATOR_DIR
    extra = dict(args.set or [])
    # SIGINT too: a shell that starts us in the background leaves SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    emu: Any = None
    restored: list[str] | None = None  # None until the saved state is loaded: a stop before saves nothing
    stopped = ""
    try:
        print("Starting the emulated clouds ...", flush=True)
        saved = load(state_dir)  # before the start: no server thread imports while it unpickles
        emu = Emulator(workdir=state_dir)
        emu.start()
        restored = restore(emu, saved)
        env_file = home.resolve() / ENV_FILE
        write_env_file(env_file, export_lines(emu.env()))
        if restored:
            print(f"Restored the emulated clouds from {state_dir}: {', '.join(restored)}", flush=True)
        print(f"Migrating the metadata database in {home.resolve()} ...", flush=True)
        with _deployment(args)(home, Path(args.dags_folder), args.port, emu.env(), extra) as airflow:
            password = home_secrets(home)["password"]
            print(
                f"\nAirflow is up: {airflow.url}   login: {USER} / {password}\n"
                f"DAGs folder: {Path(args.dags_folder).resolve()}   AIRFLOW_HOME: {home.resolve()}\n"
                f"Processes: {', '.join(airflow.processes)} (output in {home.resolve() / 'logs'}/*.out); "
                "one that dies is restarted\n"
                f"Emulated clouds: AWS {emu.aws_endpoint}, GCE {emu.gce_endpoint}, buckets "
                f"s3://{DEFAULT_BUCKET} and gs://{DEFAULT_BUCKET}; their state is kept in {state_dir}\n"
                f"For the cloudtrain CLI (runs show, jobs list, emulator status) in another shell: "
                f"source {env_file}\n"
                "New DAGs start paused: switch one on, or trigger it. Ctrl-C stops everything.",
                flush=True,
            )
            supervisor = Supervisor(airflow)
            try:
                while True:
                    supervisor.check()
                    time.sleep(1)
            except (KeyboardInterrupt, _Stop):
                # a second Ctrl-C must not cut the teardown short (it is bounded: see stop())
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("\nStopping Airflow, then the emulated clouds (their state is kept) ...", flush=True)
        stopped = "Stopped."  # said once the clouds' state is saved too (finally)
        return 0
    except (KeyboardInterrupt, _Stop):  # while starting
        print("\nStopped while starting.", flush=True)
        return 130
    except (UpError, RuntimeError) as err:
        print(f"cloudtrain up: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the state is being written: let it finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if emu is not None and restored is not None:
            save_and_stop(emu, state_dir)
        elif emu is not None:
            emu.stop()
        if stopped:
            print(stopped, flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _deployment(args: argparse.Namespace) -> Any:
    """``local_airflow``, or with ``--production`` its PostgreSQL/Redis/Celery shape: the factory
    ``add_up_parser`` was given (``cli`` passes ``cli_up_production.production_airflow``, which builds
    on this module, so this module never imports it)."""
    if getattr(args, "production", False):
        if args.production_airflow is None:
            raise UpError("--production is not available here")
        return args.production_airflow
    return local_airflow


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.startswith("AIRFLOW__"):
        raise argparse.ArgumentTypeError(f"--set {text!r}: give AIRFLOW__SECTION__KEY=VALUE")
    return key, value


def add_up_parser(sub: Any, production_airflow: Any = None) -> None:
    """``cloudtrain up``; ``production_airflow``: the deployment ``--production`` starts."""
    up = sub.add_parser(
        "up",
        help="a local Airflow (api-server, scheduler, dag-processor, triggerer) with the example DAGs "
        "against the emulated clouds; a process that dies is restarted; Ctrl-C stops it",
    )
    up.add_argument("--home", default=str(DEFAULT_HOME), help="AIRFLOW_HOME (default: .airflow_home)")
    up.add_argument("--dags-folder", default=str(EXAMPLE_DAGS), help="default: the example DAGs")
    up.add_argument("--port", type=int, default=8080, help="the api-server's (UI's) port")
    up.add_argument(
        "--set",
        action="append",
        type=_setting,
        metavar="AIRFLOW__SECTION__KEY=VALUE",
        help="an Airflow setting for every process (repeatable)",
    )
    up.add_argument(
        "--production",
        action="store_true",
        help="the production shape: PostgreSQL, Redis, CeleryExecutor with two workers, two triggerers "
        "(installs postgresql and redis-server with apt-get when missing and root)",
    )
    up.set_defaults(func=run_up, production_airflow=production_airflow)

"""``cloudtrain up --production``: the same supervisor, shaped as teams run Airflow.

Where the plain ``cloudtrain up`` runs one of each process on SQLite with the LocalExecutor, this
runs what a distributed deployment runs, on one machine: PostgreSQL (the metadata database) and
Redis (the Celery broker) from the machine's packages, Airflow with the ``CeleryExecutor``, two
``airflow celery worker`` s and two ``airflow triggerer`` s next to the scheduler, dag-processor and
api-server, and the emulated clouds. What it exercises is what the provider must survive there: a
task retried on another worker, a trigger moved to the other triggerer when one dies.

Both services keep their data under the deployment's home (``<home>/postgres``, ``<home>/redis``)
and listen on loopback ports of their own, chosen once and kept in ``<home>/production.env`` (mode
600) with the passwords made for them (never printed or logged). PostgreSQL refuses to run as root:
as root, its data folder belongs to the ``postgres`` user and ``initdb`` / ``postgres`` run as that
user, so the home's folders must be traversable by it (the error says which is not). Missing
packages are installed with ``apt-get`` when running as root; otherwise the error names the command.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

from airflow_cloudtrain.cli_up import LocalAirflow, UpError, airflow_env, free_port, session_pids

PROD_ENV_FILE = "production.env"  # in AIRFLOW_HOME: the services' ports and passwords, mode 600
SERVICES = ("postgres", "redis")
WORKERS = ("worker-1", "worker-2")
TRIGGERERS = ("triggerer-1", "triggerer-2")
PRODUCTION_PROCESSES = (*SERVICES, "api-server", "scheduler", "dag-processor", *TRIGGERERS, *WORKERS)
# Airflow's processes first (the scheduler, workers and triggerers end their tasks, which report to
# the api-server), then the broker, and the database last: everything before it still writes to it.
STOP_STAGES = (
    ("scheduler",),
    WORKERS,
    TRIGGERERS,
    ("dag-processor",),
    ("api-server",),
    ("redis",),
    ("postgres",),
)
APT_INSTALL = "apt-get install -y postgresql redis-server"  # as the error tells a user to run it
# As it is run here: without the packages' recommends (none is needed to run them), and waiting up to
# 10 minutes for another apt-get (a second install started beside it, e.g. another test's) to finish
# instead of failing at once on dpkg's lock
APT_LOCK_WAIT = ("-o", "DPkg::Lock::Timeout=600")
APT_RUN = [
    "apt-get",
    "install",
    "-y",
    "-q",
    "--no-install-recommends",
    *APT_LOCK_WAIT,
    "postgresql",
    "redis-server",
]
DB_NAME = DB_USER = "airflow"
SERVICE_WAIT_S = 120.0


def _postgres_bin(name: str) -> str | None:
    """``initdb`` / ``postgres``: on PATH, or in Debian's versioned folder (not on PATH there)."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: p.parts[-3])
    return str(versions[-1]) if versions else None


def ensure_packages() -> dict[str, str]:
    """The paths of ``initdb``, ``postgres`` and ``redis-server``; installs the Debian packages when
    one is missing and we are root, else an UpError naming the command to run."""
    wanted = {"initdb": _postgres_bin("initdb"), "postgres": _postgres_bin("postgres")}
    wanted["redis-server"] = shutil.which("redis-server")
    if all(wanted.values()):
        return {k: str(v) for k, v in wanted.items()}
    missing = ", ".join(k for k, v in wanted.items() if not v)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise UpError(
            f"--production needs PostgreSQL and Redis ({missing} not found): run `sudo {APT_INSTALL}`"
        )
    print(f"Installing PostgreSQL and Redis ({missing} not found): {APT_INSTALL} ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(APT_RUN, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # the package lists may be missing on a fresh machine: update once
        subprocess.run(["apt-get", *APT_LOCK_WAIT, "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(APT_RUN, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UpError(f"`{APT_INSTALL}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return ensure_packages()


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, _, v in pairs}


def production_settings(home: Path) -> dict[str, str]:
    """The services' ports and passwords: made once, kept in ``<home>/production.env`` (mode 600), so a
    restart finds its database again."""
    path = home / PROD_ENV_FILE
    saved = _read_env(path) if path.exists() else {}
    made = {
        "POSTGRES_PORT": lambda: str(free_port()),
        "POSTGRES_SUPERUSER_PASSWORD": lambda: secrets.token_urlsafe(24),
        "AIRFLOW_DB_PASSWORD": lambda: secrets.token_urlsafe(24),
        "REDIS_PORT": lambda: str(free_port()),
        "REDIS_PASSWORD": lambda: secrets.token_urlsafe(24),
    }
    if not all(k in saved for k in made):
        saved = {**{k: make() for k, make in made.items()}, **saved}
        home.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in saved.items()))
    return saved


def production_env(settings: Mapping[str, str]) -> dict[str, str]:
    """The Airflow settings of the production shape, for every Airflow process."""
    db = f"{DB_USER}:{settings['AIRFLOW_DB_PASSWORD']}@127.0.0.1:{settings['POSTGRES_PORT']}/{DB_NAME}"
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__PARALLELISM": "32",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://:{settings['REDIS_PASSWORD']}@127.0.0.1:{settings['REDIS_PORT']}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{db}",
        # two workers share two cores here: eight slots each is what a blocking run or two leaves room for
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "8",
        # warm workers: the provider and the cloud SDKs imported once per worker, before its pool forks
        # (airflow_cloudtrain.worker_warmup: a task process no longer imports them itself)
        "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "airflow_cloudtrain.celery_config.CELERY_CONFIG",
    }


def _pg_user() -> str | None:
    """The user PostgreSQL's commands run as: ``postgres`` when we are root (it refuses root)."""
    return "postgres" if os.geteuid() == 0 else None


def _check_traversable(folder: Path) -> None:
    """As root, the ``postgres`` user must reach its data folder: every folder above it needs o+x."""
    if os.geteuid() != 0:
        return
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise UpError(
                f"PostgreSQL runs as the postgres user, which cannot reach {folder}: {parent} is not "
                f"traversable by others (run `chmod o+x {parent}`, or give --home a folder it can reach)"
            )


def init_postgres(home: Path, bins: Mapping[str, str], settings: Mapping[str, str]) -> Path:
    """``initdb`` a private cluster in ``<home>/postgres/data`` the first time (superuser password from
    a file that is removed at once; passwords required over TCP, no Unix socket); its data folder."""
    root = home / "postgres"
    data = root / "data"
    if (data / "PG_VERSION").exists():
        return data
    _check_traversable(root.parent)
    root.mkdir(parents=True, exist_ok=True)
    pwfile = root / "pwfile"
    pwfile.touch(mode=0o600)
    pwfile.write_text(settings["POSTGRES_SUPERUSER_PASSWORD"] + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        done = subprocess.run(
            [bins["initdb"], "-D", str(data), "-U", "postgres", "--pwfile", str(pwfile)]
            + ["--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C"],
            capture_output=True,
            text=True,
            check=False,
            user=_pg_user(),
            group=_pg_user(),
        )
    finally:
        pwfile.unlink(missing_ok=True)
    if done.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        raise UpError(f"initdb failed (exit {done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
    return data


def write_redis_conf(home: Path, settings: Mapping[str, str]) -> Path:
    """Redis's config (mode 600: it holds the password, which a command line would show in ``ps``)."""
    folder = home / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "redis.conf"
    conf.touch(mode=0o600)
    conf.chmod(0o600)
    lines = [
        "bind 127.0.0.1",
        f"port {settings['REDIS_PORT']}",
        f"dir {folder.resolve()}",
        f"requirepass {settings['REDIS_PASSWORD']}",
        'save ""',  # a broker's queue: Airflow's database, not Redis, is what a restart recovers from
        "appendonly no",
        "daemonize no",
        "loglevel warning",
    ]
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _port_answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def create_airflow_database(settings: Mapping[str, str]) -> None:
    """The ``airflow`` role (its password from the env file) and database, if not there yet."""
    import psycopg2

    conn = psycopg2.connect(
        host="127.0.0.1",
        port=int(settings["POSTGRES_PORT"]),
        user="postgres",
        password=settings["POSTGRES_SUPERUSER_PASSWORD"],
        dbname="postgres",
        connect_timeout=10,
    )
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DB_USER,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE ROLE {DB_USER} LOGIN PASSWORD %s", (settings["AIRFLOW_DB_PASSWORD"],))
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
            if cur.fetchone() is None:
                cur.execute(f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")
    finally:
        conn.close()


class ProductionAirflow(LocalAirflow):
    """PostgreSQL, Redis and Airflow's processes (two workers, two triggerers) in one home, each in a
    session of its own, so the supervisor restarts any of them alone, the services included."""

    processes = PRODUCTION_PROCESSES

    def __init__(self, home: Path, env: Mapping[str, str], bins: Mapping[str, str]) -> None:
        super().__init__(home, env)
        self.bins = dict(bins)
        self.settings = production_settings(self.home)
        self.data = init_postgres(self.home, self.bins, self.settings)
        self.redis_conf = write_redis_conf(self.home, self.settings)
        # each worker and triggerer serves its logs on a port of its own (one machine, one hostname)
        self.own_env = {
            name: {
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            }
            for name in (*WORKERS, *TRIGGERERS)
        }

    def _process_command(self, name: str) -> list[str]:
        if name == "postgres":
            return [
                *(self.bins["postgres"], "-D", str(self.data), "-p", self.settings["POSTGRES_PORT"]),
                *("-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="),  # TCP only
                # Airflow's processes each keep a pool; the Celery result backend adds the workers'
                *("-c", "max_connections=300"),
            ]
        if name == "redis":
            return [self.bins["redis-server"], str(self.redis_conf)]
        if name in TRIGGERERS:
            return self._command("triggerer")
        if name in WORKERS:
            return self._command("celery", "worker", "--celery-hostname", f"{name}@%h")
        return self._command(name)

    def _process_env(self, name: str) -> dict[str, str]:
        return {**self.env, **self.own_env.get(name, {})}

    def _process_user(self, name: str) -> str | None:
        return _pg_user() if name == "postgres" else None

    def start_services(self, timeout: float = SERVICE_WAIT_S) -> None:
        """PostgreSQL and Redis, until both accept connections; then the Airflow role and database."""
        for name, port in (("postgres", "POSTGRES_PORT"), ("redis", "REDIS_PORT")):
            self.start(name)
            deadline = time.monotonic() + timeout
            while not _port_answers(int(self.settings[port])):
                if self.procs[name].poll() is not None:
                    raise UpError(f"{name} exited ({self.procs[name].returncode}):\n{self.tail(name)}")
                if time.monotonic() > deadline:
                    raise UpError(
                        f"{name} did not listen on 127.0.0.1:{self.settings[port]} within {timeout:.0f} s"
                    )
                time.sleep(0.3)
        deadline = time.monotonic() + timeout
        while True:  # the port answers a moment before the database accepts logins
            try:
                create_airflow_database(self.settings)
                return
            except Exception as err:
                if time.monotonic() > deadline:
                    raise UpError(f"could not create the Airflow database: {type(err).__name__}") from None
                time.sleep(0.5)

    def stop(self, grace_s: float = 60.0) -> None:
        """Stage by stage in ``STOP_STAGES``, each waited for (the database last, once nothing writes to
        it); SIGKILL for whatever is left after ``grace_s``. A worker's SIGTERM goes to every process of
        its session: its running tasks then end as a SIGTERMed Airflow task does (``on_kill`` releases
        the instance), not only after Celery's warm shutdown waited for them."""
        for stage in STOP_STAGES:
            running = [n for n in stage if n in self.procs and self.procs[n].poll() is None]
            for name in running:
                sig = signal.SIGINT if name == "postgres" else signal.SIGTERM  # PostgreSQL's fast shutdown
                if name not in WORKERS:
                    with suppress(ProcessLookupError):
                        os.killpg(self.procs[name].pid, sig)
                for pid in session_pids(self.procs[name].pid) if name in WORKERS else []:
                    with suppress(ProcessLookupError):
                        os.kill(pid, sig)
            for name in running:
                self._wait_exit(self.procs[name], grace_s)
        self._kill_what_is_left()


@contextmanager
def production_airflow(
    home: Path,
    dags_folder: Path,
    port: int,
    cloud_env: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
) -> Iterator[LocalAirflow]:
    """``local_airflow``'s production shape: the packages, PostgreSQL and Redis, ``db migrate``
    against PostgreSQL, then Airflow's processes; all stopped on the way out."""
    bins = ensure_packages()
    settings = production_settings(home.resolve())
    env = airflow_env(home, dags_folder, port, cloud_env, {**production_env(settings), **(extra or {})})
    airflow = ProductionAirflow(home, env, bins)
    try:
        airflow.start_services()
        airflow.migrate()
        airflow.start_all()
        airflow.wait_healthy()
        yield airflow
    finally:
        # a second Ctrl-C must not cut the teardown short: the database would outlive it (bounded: stop())
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            airflow.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

"""The emulated instances' agents, forked from a warm parent instead of started cold.

Every emulated instance runs ``python -m airflow_cloudtrain.agent``. Started cold, each pays about half
a CPU-second before its first request: the interpreter, our agent's modules, boto3/botocore and
google-cloud-storage imported again. A test suite or a demo starts hundreds of them on a 2-core
machine, so that start-up was a tenth of ``make test``. This parent (one per emulator, started with the
first agent) imports those modules once, then forks one child per instance; the child becomes what
``subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=STDOUT, start_new_session=True)`` would
have started: its own session, the instance's environment and working directory, the log on its stdout
and stderr, ``sys.argv`` as ``-m`` gives it.

What a fork changes, and why it does not matter here:

- Only modules are imported before the fork, never a client, session or thread (checked before every
  fork: the parent is single-threaded), and none of ours reads the environment at import time; so the
  child builds its clients from the instance's environment exactly as a cold start would. The one
  piece of data prepared is the botocore service models the agents' clients share
  (``storage.service_models``), parsed from botocore's own files: a user's ``~/.aws/models`` on the
  emulated machine would not be read (none has one).
- Interpreter start-up settings (``PYTHONPATH``, ``-X`` options) come from the parent, which is started
  with the emulator's machine-image environment: the same ones a cold agent gets.
- ``/proc/<pid>/environ`` of a forked agent shows the parent's start-up environment, not the instance's:
  the runner ends the agent through its process group (as it always did), and finds the rest of the
  machine (the job, exec'd by the agent) by the machine marker in their environment, which is right.
- Only ``python -m airflow_cloudtrain.agent`` is forked; anything else (a Vertex AI replica's command)
  is started cold.

``CLOUDTRAIN_EMULATOR_FORK_AGENTS=0`` starts every agent cold, to tell a fork's effect from the product's.

Protocol, JSON lines: the client writes ``{"module", "args", "env", "cwd", "log"}`` (and ``"stderr"``, a
file of its own for the child's stderr, else the log takes both) on stdin and gets
``{"started": pid}`` (or ``{"error": text}``) on the stdout the parent was started with; every child's
end comes as ``{"pid": pid, "returncode": rc}`` (``rc`` as ``subprocess`` gives it). When stdin closes
the parent exits; children still running are left to whoever stopped the emulator (the runner kills
its agents first), as cold-started agents were.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import queue
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, NoReturn

log = logging.getLogger(__name__)
FORK_SETTING = "CLOUDTRAIN_EMULATOR_FORK_AGENTS"
READY_TIMEOUT_S = 300.0  # the parent's one start-up (imports), on a loaded machine
START_TIMEOUT_S = 120.0  # one fork's answer
FORKABLE = ("airflow_cloudtrain.agent",)  # the programs ``warm`` prepares for
PRELOAD = ("airflow_cloudtrain.agent.cli", "airflow_cloudtrain.agent.worker")  # their modules
AGENT_SERVICES = ("s3", "sqs", "ssm", "secretsmanager")  # the AWS services agents make clients for


def forking_enabled() -> bool:
    return os.environ.get(FORK_SETTING, "1") != "0"


def module_of(cmd: list[str]) -> str | None:
    """The module of ``cmd`` when it is ``python -m <a module the parent imported> ...`` run by this
    interpreter, else None (a user's ``-m`` module may live in its own working directory, which the
    parent's ``sys.path`` does not hold)."""
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2] in FORKABLE:
        return cmd[2]
    return None


# --- the client (in the emulator's process) -----------------------------------------------------------


class ForkedProcess:
    """A forked agent with the part of ``subprocess.Popen``'s face the runner uses."""

    def __init__(self, server: AgentForkServer, pid: int, args: list[str]) -> None:
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.ended.get(self.pid)
        if self.returncode is None and not self.server.reader.is_alive() and not _pid_alive(self.pid):
            self.returncode = -signal.SIGKILL  # its parent is gone, so is the child: how it ended is lost
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.server.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                self.server.changed.wait(0.5 if left is None else min(0.5, left))
        assert self.returncode is not None
        return self.returncode


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie left for a reaper that is not ours counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class AgentForkServer:
    """The warm parent of one emulator's agents, and what it reported."""

    def __init__(self, env: dict[str, str]) -> None:
        self.log_path = (
            Path(env.get("TMPDIR", "/tmp")) / f"cloudtrain-agent-zygote-{os.getpid()}-{id(self)}.log"
        )
        with self.log_path.open("wb") as errors:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                env=env,
                start_new_session=True,  # a Ctrl-C in the emulator's terminal is the runner's to handle
            )
        self.ended: dict[int, int] = {}
        self.changed = threading.Condition()
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="agent-zygote-reader", daemon=True)
        self.reader.start()
        self._ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if "pid" in message:
                with self.changed:
                    self.ended[int(message["pid"])] = int(message["returncode"])
                    self.changed.notify_all()
            else:
                if "started" in message:  # a pid used again: an earlier child's end is not this one's
                    with self.changed:
                        self.ended.pop(int(message["started"]), None)
                self._answers.put(message)
        with self.changed:
            self.changed.notify_all()
        self._answers.put({"error": "the agents' parent exited"})

    def _answer(self, timeout: float, want: str) -> Any:
        try:
            message = self._answers.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"the agents' parent did not answer in {timeout:.0f} s") from None
        if want not in message:
            raise RuntimeError(f"the agents' parent: {message.get('error', message)}; {self._tail()}")
        return message[want]

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def spawn(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        cwd: str | None,
        log_path: Path,
        stderr_path: Path | None = None,
    ) -> ForkedProcess:
        """``python -m module *args`` forked, its stdout (and its stderr, unless ``stderr_path``) to
        ``log_path``."""
        request = {"module": module, "args": args, "env": env, "cwd": cwd, "log": str(log_path)}
        if stderr_path is not None:
            request["stderr"] = str(stderr_path)
        with self._lock:
            if not self._ready:
                self._answer(READY_TIMEOUT_S, "ready")
                self._ready = True
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            pid = int(self._answer(START_TIMEOUT_S, "started"))
        return ForkedProcess(self, pid, [sys.executable, "-m", module, *args])

    def stop(self) -> None:
        """The parent exits; its children are the runner's to end (it kills its agents first)."""
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        if self.proc.stdout is not None and not self.reader.is_alive():
            self.proc.stdout.close()  # read to its end (else a ResourceWarning in `cloudtrain emulator`)
        self.log_path.unlink(missing_ok=True)


# --- the parent (``python -m airflow_cloudtrain.emulator.agent_zygote``) --------------------------------


def warm() -> None:
    """Import, once, what every agent imports before its first request, parse the service models
    its clients read, and build the agent zip. Modules and data only: no client, session or thread,
    so nothing of this process's state reaches a child but code, parsed JSON and the zip's bytes."""
    import boto3  # noqa: F401
    import botocore.client  # noqa: F401
    import botocore.config  # noqa: F401
    import google.api_core.exceptions  # noqa: F401
    import google.auth  # noqa: F401
    import google.auth.transport.requests  # noqa: F401
    import google.cloud.storage  # noqa: F401
    import requests  # noqa: F401

    for name in PRELOAD:  # by name, as the command names it: the emulator does not build on the agent
        importlib.import_module(name)
    _parse_service_models()
    # the zip every agent started from source copies for its job (``build_agent_zip`` keeps its last
    # build): built once here, not once per agent
    importlib.import_module("airflow_cloudtrain.contract.bootstrap").build_agent_zip()


def _parse_service_models() -> None:
    """Parse once the botocore models every agent's clients read (``storage.service_models``, the
    loader the agent's clients share): each agent parsed them again, about 0.1 CPU-second, a fifth of
    a short agent's CPU. Data only (dicts in the loader's cache): no client, session or socket."""
    from airflow_cloudtrain.storage import service_models

    loader = service_models(None)  # the agents' data path: botocore's own (no AWS_DATA_PATH)
    loader.list_available_services("service-2")
    for name in ("endpoints", "partitions", "sdk-default-configuration", "_retry"):
        loader.load_data(name)
    for service in AGENT_SERVICES:
        for kind in ("service-2", "endpoint-rule-set-1"):
            loader.load_service_model(service, kind)


def run_child(request: dict[str, Any], parents_fds: list[int], in_session: int) -> NoReturn:
    """In the forked child: become the instance's agent; never returns. ``in_session`` is closed once
    the child leads its own session: only then does the parent report it started, so a kill of its
    process group right after the start (a spot reclaim) cannot miss it."""

    def become_agent() -> None:
        os.setsid()
        os.close(in_session)
        signal.set_wakeup_fd(-1)
        for fd in parents_fds:  # only the parent reports; a child must not hold its pipes open
            os.close(fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.get("cwd"):
            os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = (
            os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if "stderr" in request
            else out
        )
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, out, err}:
            os.close(fd)
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)

    run_as_main(become_agent)


def run_as_main(body: Callable[[], object]) -> NoReturn:
    """``body()`` in a forked child, ended as an interpreter would end it: ``sys.exit``'s status, 1
    and the traceback on an error, streams flushed; then ``os._exit``, so a thread left running does
    not hold the child and nothing of the parent's (atexit, buffers) runs twice."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as stop:
        code = exit_code(stop)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def exit_code(stop: SystemExit) -> int:
    """The status an interpreter exits with for ``stop`` (``sys.exit(x)``)."""
    return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)


def send(channel: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(channel, data) :]


def reap(channel: int, children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            send(channel, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _serve(stdin: IO[bytes], channel: int) -> None:
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the select below at once
    children: set[int] = set()
    buffered = b""
    requests = stdin.fileno()
    while True:
        readable, _, _ = select.select([requests, wake_read], [], [], 5.0)
        if wake_read in readable:
            os.read(wake_read, 4096)
        reap(channel, children)
        if requests not in readable:
            continue
        chunk = os.read(requests, 65536)
        if not chunk:
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            request = json.loads(line)
            threads = len(os.listdir("/proc/self/task"))
            if threading.active_count() != 1 or threads != 1:
                send(channel, {"error": f"not single-threaded before a fork: {threads} threads"})
                continue
            session_read, session_write = os.pipe()
            pid = os.fork()
            if pid == 0:
                run_child(request, [channel, wake_read, wake_write, session_read], session_write)
            os.close(session_write)
            os.read(session_read, 1)  # EOF once the child leads its session (or has died)
            os.close(session_read)
            children.add(pid)
            send(channel, {"started": pid})


def main() -> None:
    channel = os.dup(1)  # the messages' pipe; whatever else prints goes to the log instead
    os.dup2(2, 1)
    warm()
    send(channel, {"ready": os.getpid()})
    _serve(sys.stdin.buffer, channel)


if __name__ == "__main__":
    main()

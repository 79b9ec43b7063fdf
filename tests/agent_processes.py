"""Agents the tests start themselves (an agent on a run folder of the test's, not an emulated instance's):
forked from a warm parent, as the emulator forks its instances' agents (``emulator.agent_zygote``).

Why: a cold ``python -m airflow_cloudtrain.agent`` pays about half a CPU-second importing boto3, the
Google storage client and our agent before its first request. The agent tests (checkpoints, gangs,
fleets, live beacons) start over a hundred of them in a suite, so that start-up was about 45
CPU-seconds of ``make test`` on 2 cores. The fork runs the same module with the same arguments,
environment and working directory; what differs from a cold start is said in ``emulator.agent_zygote``.

``start_agent`` returns what these tests used of ``subprocess.Popen(argv, stdout=PIPE, stderr=PIPE)``:
``pid``, ``returncode``, ``poll``, ``wait``, ``communicate`` (bytes, read from the files the fork wrote
once it ended), ``send_signal``, ``terminate``, ``kill``. A fork's ``/proc/<pid>/cmdline`` is its
parent's, so what finds agents by their command line asks here too (``kill_naming``). A command that
is not ``python -m`` the agent (a test's own wrapper) or ``CLOUDTRAIN_EMULATOR_FORK_AGENTS=0`` starts
it as ``Popen`` did.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from airflow_cloudtrain.emulator.agent_zygote import (
    AgentForkServer,
    ForkedProcess,
    forking_enabled,
    module_of,
)

_lock = threading.Lock()
_server: list[AgentForkServer] = []  # this process's warm parent, made at the first start
_started: list[ForkedAgent] = []
_outputs = Path(tempfile.mkdtemp(prefix="cloudtrain-test-agents-"))


class ForkedAgent:
    """A forked agent with ``subprocess.Popen``'s face (the part the tests use)."""

    def __init__(self, proc: ForkedProcess, stdout: Path, stderr: Path) -> None:
        self.proc, self.stdout_path, self.stderr_path = proc, stdout, stderr
        self.pid, self.args = proc.pid, proc.args

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Waits for the end (``subprocess.TimeoutExpired`` past ``timeout``), then its stdout and stderr."""
        self.wait(timeout)
        return self.stdout_path.read_bytes(), self.stderr_path.read_bytes()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


AgentProcess = ForkedAgent | subprocess.Popen[bytes]


def start_agent(argv: list[str], cwd: Path | str, env: dict[str, str]) -> AgentProcess:
    """``subprocess.Popen(argv, cwd=cwd, env=env, stdout=PIPE, stderr=PIPE)``, forked when it can be."""
    module = module_of(argv)
    if module is None or not forking_enabled():
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    folder = Path(tempfile.mkdtemp(dir=_outputs))
    out, err = folder / "stdout", folder / "stderr"
    with _lock:
        if not _server:
            _server.append(AgentForkServer(dict(os.environ)))
        proc = _server[0].spawn(module, argv[3:], env, str(cwd), out, stderr_path=err)
        agent = ForkedAgent(proc, out, err)
        _started.append(agent)
    return agent


def run_agent(
    argv: list[str], cwd: Path | str, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked
    when it can be (the agent is killed past ``timeout``, as ``run`` kills it)."""
    proc = start_agent(argv, cwd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, output=out.decode(), stderr=err.decode()) from expired
    assert proc.returncode is not None
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())


def kill_naming(needle: str) -> None:
    """SIGKILL the forked agents whose command line contains ``needle``: what a search of
    ``/proc/<pid>/cmdline`` finds of a cold one (``test_agent_checkpoints.reap``), where a fork shows
    its parent's command line instead of its own."""
    with _lock:
        named = [a for a in _started if needle in "\0".join(a.args)]
    for agent in named:
        agent.kill()


@atexit.register
def _stop() -> None:
    """Agents a test left running are killed (a cold agent would have been orphaned), then the parent."""
    for agent in _started:
        agent.kill()
    for server in _server:
        server.stop()
    shutil.rmtree(_outputs, ignore_errors=True)

"""The instances' side of the emulated clouds: one local agent process per launched instance.

Nothing in an emulated cloud boots a machine, so this watcher does what the instance would: when an
instance whose user data is our bootstrap appears, it starts the same agent the bootstrap would start
(skipping the bootstrap itself), with the endpoints passed the standard way; when the agent exits
(the instance powers off) it ends the instance; when the instance is terminated from outside it kills
the agent. When an instance is gone, every process it ran goes with it: the job too (it runs in its
own session, so it outlives a crashed agent, as on a real machine), found by the
``CLOUDTRAIN_EMULATED_MACHINE`` marker that the agent's environment hands down to everything it starts.

A "machine" may run another program than the agent: a ``Seen`` with ``argv`` (and ``cwd``) runs that
command instead (a Vertex AI replica, ``gcp/vertex``), under the same marker and the same end; when such
a process exits on its own, ``end_instance`` gets the ``Seen`` with its ``returncode`` set.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_cloudtrain.emulator.agent_zygote import (
    AgentForkServer,
    ForkedProcess,
    forking_enabled,
    module_of,
)

log = logging.getLogger(__name__)
MACHINE_MARKER = "CLOUDTRAIN_EMULATED_MACHINE"
KILL_WAIT_S = 10.0  # how long a killed agent's end is waited for (``InstanceRunner._kill``)


@dataclass
class Seen:
    """An instance the cloud side reports as alive and of ours."""

    cloud: str  # "aws" or "gcp"
    id: str
    run_uri: str
    instance_type: str
    zone: str | None
    spot: bool
    env: dict[str, str] = field(default_factory=dict)  # endpoints for this instance's agent
    argv: list[str] | None = None  # what the machine runs instead of the agent (None: the agent)
    cwd: str | None = None  # its working directory (None: the runner's)
    returncode: int | None = None  # set by the runner when the process exited on its own


@dataclass
class Agent:
    seen: Seen
    process: subprocess.Popen[bytes] | ForkedProcess
    log_path: Path


class InstanceRunner:
    """Polls ``list_alive`` and keeps one agent process per alive instance."""

    def __init__(
        self,
        list_alive: Callable[[], list[Seen]],
        end_instance: Callable[[Seen], None],
        workdir: Path,
        base_env: dict[str, str],
        interval: float = 0.3,
        shutdown_grace_s: float = 8.0,
    ) -> None:
        self.list_alive = list_alive
        self.end_instance = end_instance
        self.workdir = workdir
        self.base_env = base_env
        self.interval = interval
        # a terminated machine shuts its OS down: SIGTERM, this long, then whatever is left is killed
        self.shutdown_grace_s = shutdown_grace_s
        self.shutting_down: set[str] = set()
        self.agents: dict[str, Agent] = {}
        self.finished: set[str] = set()
        self.machines: set[str] = set()  # instances whose processes run here until they are gone
        self.lock = threading.RLock()
        # agents are forked from a warm parent (``agent_zygote``), started with the first of them
        self._forks: AgentForkServer | None = None
        self._fork = forking_enabled()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="emulator-instances", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self.lock:
            for agent in list(self.agents.values()):
                self._kill(agent)
            self.agents.clear()
            for iid in list(self.machines):
                self._power_down(iid)
            self.machines.clear()
            if self._forks is not None:
                self._forks.stop()
                self._forks = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the emulator must keep playing the instances whatever one poll hits
                log.exception("emulator poll failed")
            self._stop.wait(self.interval)

    def tick(self) -> None:
        alive = {s.id: s for s in self.list_alive()}
        with self.lock:
            for iid, seen in alive.items():
                if iid not in self.agents and iid not in self.finished:
                    self.agents[iid] = self._start(seen)
                    self.machines.add(iid)
            for iid, agent in list(self.agents.items()):
                if iid not in alive:  # terminated from outside: the guest OS shuts down
                    del self.agents[iid]
                    self.finished.add(iid)
                    self.shutting_down.add(iid)
                    threading.Thread(
                        target=self._shut_down, args=(agent,), name=f"shutdown-{iid}", daemon=True
                    ).start()
                elif agent.process.poll() is not None:  # agent powered the instance off
                    del self.agents[iid]
                    self.finished.add(iid)
                    agent.seen.returncode = agent.process.returncode
                    self.end_instance(agent.seen)
            gone = [i for i in self.machines if i not in alive and i not in self.shutting_down]
            for iid in gone:  # gone: whatever still ran there dies
                self.machines.discard(iid)
                self._power_down(iid)

    def _start(self, seen: Seen) -> Agent:
        workdir = self.workdir / "instances" / seen.id
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = workdir / "agent.log"
        env = {**self.base_env, **seen.env, MACHINE_MARKER: self._machine(seen.id)}
        cmd = seen.argv or [
            sys.executable,
            "-m",
            "airflow_cloudtrain.agent",
            "--run-uri",
            seen.run_uri,
            "--instance-id",
            seen.id,
            "--workdir",
            str(workdir / "work"),
        ]
        process: subprocess.Popen[bytes] | ForkedProcess | None = self._forked(cmd, env, seen.cwd, log_path)
        if process is None:
            with log_path.open("wb") as out:
                process = subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=seen.cwd
                )
        log.info("emulator: started agent for %s (%s) pid %s", seen.id, seen.instance_type, process.pid)
        return Agent(seen, process, log_path)

    def _forked(
        self, cmd: list[str], env: dict[str, str], cwd: str | None, log_path: Path
    ) -> ForkedProcess | None:
        """``cmd`` forked from the warm parent when it is ``python -m module``; None: start it cold
        (another command, forking off, or the parent failed: then every later agent starts cold)."""
        module = module_of(cmd)
        if module is None or not self._fork:
            return None
        try:
            if self._forks is None:
                self._forks = AgentForkServer(self.base_env)
            return self._forks.spawn(module, cmd[3:], env, cwd, log_path)
        except (OSError, RuntimeError) as err:
            log.warning("emulator: agents start cold from now on (their warm parent failed: %s)", err)
            self._fork = False
            return None

    def _shut_down(self, agent: Agent) -> None:
        """As a terminated EC2 instance or deleted GCE VM: the OS sends SIGTERM (the agent records
        the interruption and stops the job), waits a little, then the machine is gone."""
        iid = agent.seen.id
        if agent.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=self.shutdown_grace_s)
        self._kill(agent)
        self._power_down(iid)  # before letting go: ``held()`` shows the machine until it is gone
        with self.lock:
            self.machines.discard(iid)
            self.shutting_down.discard(iid)

    def _kill(self, agent: Agent) -> None:
        """SIGKILL the agent's group and wait up to ``KILL_WAIT_S`` for its end. A killed process runs
        none of its own code again, so an end reported late (a forked agent's parent busy or paused on a
        loaded machine) is only noted: the stop, and the state saved with it, go on."""
        if agent.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.process.pid, signal.SIGKILL)
            try:
                agent.process.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning(
                    "emulator: the agent of %s (pid %d) was killed; its end was not reported in %g s",
                    agent.seen.id,
                    agent.process.pid,
                    KILL_WAIT_S,
                )

    def _machine(self, instance_id: str) -> str:
        return f"{instance_id}@{self.workdir}"  # unique across emulators on one host

    def _power_down(self, instance_id: str) -> None:
        """Kill every process of the machine (the agent's group is gone already; its job may not be)."""
        try:
            import psutil  # Airflow's dependency
        except ImportError:
            return
        mark = self._machine(instance_id)
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get(MACHINE_MARKER) == mark:
                    proc.kill()

    def held(self) -> set[str]:
        """Ids of the machines the runner still has: an agent (or command) running, shutting down, or
        processes not yet powered down."""
        with self.lock:
            return set(self.agents) | self.shutting_down | self.machines

    def pids(self) -> dict[str, int]:
        """Id -> pid of each running agent (or command) process."""
        with self.lock:
            return {iid: agent.process.pid for iid, agent in self.agents.items()}

    def kill_agent(self, instance_id: str) -> None:
        """The agent dies at once (it crashed, or its machine vanished): no final status. The rest of the
        machine's processes (its job) end when the instance leaves the alive list."""
        with self.lock:
            agent = self.agents.pop(instance_id, None)
            self.finished.add(instance_id)
        if agent is not None:
            self._kill(agent)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self.agents:
                    return True
            time.sleep(0.1)
        return False

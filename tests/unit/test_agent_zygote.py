"""The emulator's warm parent of agents (``emulator.agent_zygote``): a forked child must be what
``subprocess.Popen(cmd, env=..., cwd=..., stdout=log, stderr=STDOUT, start_new_session=True)`` would
have started, and its end must reach the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_cloudtrain.emulator.agent_zygote import AgentForkServer, module_of

PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARKER"),
                      "sid": os.getsid(0), "pid": os.getpid(), "name": __name__}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if "--hang" in sys.argv:
        time.sleep(600)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[AgentForkServer]:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "zygote_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "lib")}  # the parent's start-up settings
    forks = AgentForkServer(env)
    yield forks
    forks.stop()


def test_a_forked_child_gets_its_argv_cwd_environment_session_and_log(
    server: AgentForkServer, tmp_path: Path
) -> None:
    log = tmp_path / "agent.log"
    child = server.spawn("zygote_probe", ["3", "x y"], {"PROBE_MARKER": "i-123"}, str(tmp_path), log)
    assert child.wait(timeout=120) == 3
    first, second = log.read_text().splitlines()[:2]
    seen = json.loads(first)
    assert seen["argv"] == ["3", "x y"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["marker"] == "i-123"  # the instance's environment, not the parent's
    assert seen["sid"] == seen["pid"] == child.pid  # its own session, as start_new_session gives
    assert seen["name"] == "__main__"
    assert second == "to stderr"  # stdout and stderr both in the log


def test_a_child_given_a_stderr_file_writes_its_stderr_there_and_its_stdout_to_the_log(
    server: AgentForkServer, tmp_path: Path
) -> None:
    """As ``Popen(stdout=PIPE, stderr=PIPE)`` keeps them apart (the tests' own agents, ``agent_processes``)."""
    log, errors = tmp_path / "agent.log", tmp_path / "agent.err"
    child = server.spawn("zygote_probe", ["0"], {}, None, log, stderr_path=errors)
    assert child.wait(timeout=120) == 0
    assert [json.loads(line)["argv"] for line in log.read_text().splitlines()] == [["0"]]
    assert errors.read_text() == "to stderr\n"


def test_a_killed_childs_group_ends_and_is_reported_as_killed(
    server: AgentForkServer, tmp_path: Path
) -> None:
    log = tmp_path / "agent.log"
    child = server.spawn("zygote_probe", ["0", "--hang"], {}, None, log)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)  # how the runner ends an agent
    assert child.wait(timeout=120) == -signal.SIGKILL


def test_every_child_gets_its_own_answer(server: AgentForkServer, tmp_path: Path) -> None:
    children = [server.spawn("zygote_probe", [str(n)], {}, None, tmp_path / f"{n}.log") for n in range(5)]
    assert [c.wait(timeout=120) for c in children] == list(range(5))
    assert len({c.pid for c in children}) == 5


def test_only_this_interpreters_module_form_is_forked() -> None:
    assert module_of([sys.executable, "-m", "airflow_cloudtrain.agent", "--run-uri", "s3://b/r"]) == (
        "airflow_cloudtrain.agent"
    )
    assert module_of(["/usr/bin/python3", "-m", "airflow_cloudtrain.agent"]) is None  # another Python
    assert module_of([sys.executable, "trainer.py"]) is None  # a Vertex AI replica's command
    assert module_of([sys.executable, "-m", "trainer.task"]) is None  # a module of its own directory


def test_a_child_whose_parent_died_is_still_seen_to_end(server: AgentForkServer, tmp_path: Path) -> None:
    child = server.spawn("zygote_probe", ["0", "--hang"], {}, None, tmp_path / "agent.log")
    server.proc.kill()  # the warm parent crashes: nobody reports the child's end any more
    server.reader.join(timeout=120)
    assert child.poll() is None  # it still runs
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=120) == -signal.SIGKILL


def test_a_child_leads_its_session_as_soon_as_its_start_is_reported(
    server: AgentForkServer, tmp_path: Path
) -> None:
    """A spot reclaim may kill an agent's group right after its start: the group must exist by then
    (``Popen(start_new_session=True)`` returns after the child's ``setsid`` too)."""
    for n in range(10):
        child = server.spawn("zygote_probe", ["0", "--hang"], {}, None, tmp_path / f"{n}.log")
        assert os.getpgid(child.pid) == child.pid
        os.killpg(child.pid, signal.SIGKILL)  # no ProcessLookupError: the group is there
        assert child.wait(timeout=120) == -signal.SIGKILL

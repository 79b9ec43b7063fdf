"""The xdist workers' warm parent and the "python" xdist starts (``tests/worker_zygote.py``,
``tests/worker_fork.py``): what a worker started through them gets is what ``python -u -c CODE``
gives (its streams, its first stdin line, its environment and directory), it ends with the status
the code ended with, signals reach it, and a killed asker takes its fork with it. The parent runs
``--cold`` here (no preload): what is preloaded does not change any of this."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

TESTS = Path(__file__).resolve().parents[1]
FORK = [sys.executable, str(TESTS / "worker_fork.py")]


@pytest.fixture()
def zygote(tmp_path: Path) -> Iterator[dict[str, str]]:
    path = tmp_path / "z.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "worker_zygote.py"), str(listener.fileno()), "--cold"],
        stdin=subprocess.PIPE,
        pass_fds=[listener.fileno()],
    )
    listener.close()
    try:
        yield {**os.environ, "CLOUDTRAIN_TEST_WORKER_ZYGOTE": str(path), "PROBE": "from the asker"}
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(30) == 0  # it ends once its stdin closed and its forks ended


# what execnet's bootstrap does first: read one line of stdin, and run it
BOOTSTRAP = "import sys;exec(eval(sys.stdin.readline()))"


def _ask(env: dict[str, str], code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FORK, "-u", "-c", BOOTSTRAP],
        input=repr(code) + "\n",
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_fork_runs_the_code_as_python_c_would_and_ends_with_its_status(
    zygote: dict[str, str], tmp_path: Path
) -> None:
    code = (
        "import os, sys\n"
        "own = open('/proc/self/cmdline').read()\n"
        "print('forked', 'worker_zygote.py' in own, os.environ['PROBE'], os.getcwd(), sys.argv, repr(sys.path[0]))\n"
        "print('to stderr', file=sys.stderr)\n"
        "import atexit; atexit.register(print, 'atexit ran')\n"
        "sys.exit(3)\n"
    )
    done = _ask(zygote, code, tmp_path)
    assert done.returncode == 3, done
    assert done.stdout.splitlines() == [f"forked True from the asker {tmp_path} ['-c'] ''", "atexit ran"]
    assert done.stderr == "to stderr\n"


def test_without_a_parent_it_is_the_plain_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "CLOUDTRAIN_TEST_WORKER_ZYGOTE": str(tmp_path / "none.sock")}
    code = "import sys; print(open('/proc/self/cmdline').read().split(chr(0))[1:3]); sys.exit(2)"
    done = _ask(env, code, tmp_path)
    assert (done.returncode, done.stdout) == (2, "['-u', '-c']\n"), done  # exec'd: python -u -c


def test_a_signal_reaches_the_fork_and_a_killed_asker_takes_it_along(
    zygote: dict[str, str], tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    code = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(120)"
    for sig, status in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, None)):
        pids.unlink(missing_ok=True)
        asker = subprocess.Popen(
            [*FORK, "-u", "-c", BOOTSTRAP], stdin=subprocess.PIPE, env=zygote, cwd=tmp_path, text=True
        )
        assert asker.stdin is not None
        asker.stdin.write(repr(code) + "\n")
        asker.stdin.flush()
        fork = int(
            wait_for(lambda: pids.exists() and pids.read_text().endswith("\n") and pids.read_text(), 60)
        )
        asker.send_signal(sig)
        assert asker.wait(60) == -sig
        # SIGTERM: passed on, the fork ended by it (and the asker ended the same way); SIGKILL: the
        # parent saw the asker go and killed the fork
        wait_for(lambda pid=fork: _gone(pid), 60)
        assert status is None or asker.returncode == status


def _gone(pid: int) -> bool:
    """Ended: no process, or one its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True

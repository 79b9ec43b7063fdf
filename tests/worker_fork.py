"""The "python" pytest-xdist starts for each worker under ``make test``: it asks the warm parent
(``worker_zygote``) for a fork that runs the worker, and stands for it until it ends.

pytest-xdist starts ``<python> -u -c "import sys;exec(eval(sys.stdin.readline()))"`` per worker and
talks to it over its stdin and stdout. This program (standard library only: it starts in ~20 ms)
passes its stdin, stdout and stderr, its environment, working directory and arguments to the warm
parent over the Unix socket named by ``CLOUDTRAIN_TEST_WORKER_ZYGOTE``; the fork becomes the worker
on those streams. Signals sent here are passed on to the fork, and this process exits as the fork
did (the same status, or killed by the same signal); if this process is killed, the parent kills
the fork. With no parent to ask (none started, or it is gone), it becomes the plain interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

SOCKET_SETTING = "CLOUDTRAIN_TEST_WORKER_ZYGOTE"
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _plain(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def _lines(conn: socket.socket) -> object:
    buffered = b""
    while True:
        while b"\n" not in buffered:
            chunk = conn.recv(4096)
            if not chunk:
                return
            buffered += chunk
        line, buffered = buffered.split(b"\n", 1)
        yield json.loads(line)


def main(argv: list[str]) -> None:
    path = os.environ.get(SOCKET_SETTING)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError("no warm parent")
        conn.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
        answers = _lines(conn)
        started = next(answers, None)  # type: ignore[call-overload]
    except OSError:
        started = None
    if not isinstance(started, dict) or "pid" not in started:
        conn.close()
        _plain(argv)
        return
    pid = started["pid"]

    def pass_on(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in PASSED_ON:
        signal.signal(sig, pass_on)
    ended = next(answers, None)  # type: ignore[call-overload]
    code = ended["returncode"] if isinstance(ended, dict) else 1
    if code < 0:  # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])

"""What an emulated Vertex AI replica's machine runs: ``python vertex_run.py LAUNCH.json`` (by path, so
nothing of the emulator's package is imported and it starts fast).

It stands in for the training VM's agent: it installs the job's Python packages, runs the replica's
program, and ships every line the program writes to stdout/stderr to the job's log, stamped when the
line was produced (one JSON record a line, ``{"t": unix time, "s": "stdout"|"stderr", "m": text}``,
appended to ``launch["log"]``; the emulated Cloud Logging reads them from there).

``launch`` (written by ``vertex_cluster``): ``argv`` (the command) or ``module`` + ``args`` (a Python
package's ``python -m``), ``packages`` (``gs://`` URIs), ``log``. The working directory is the
replica's (one per attempt).

Installing a package: no ``pip install`` (it needs an index, so the network): each ``packages`` object
is downloaded from the emulated GCS (``google.cloud.storage`` against ``STORAGE_EMULATOR_HOST``, with
the emulator's user agent, so neither counted nor throttled) and unpacked; an sdist's (``.tar.gz``)
top folder goes on ``PYTHONPATH`` (with its ``src/`` when there is one), a wheel's (``.whl``, ``.zip``)
root likewise. Its dependencies are not installed: the emulated image's Python already has this
environment's packages. A failure here is written to the log and ends the replica with status 1.

SIGTERM (the machine shutting down: cancel, preemption, the job ending) is passed on to the program.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import IO, Any

USER_AGENT = "cloudtrain-emulator"  # emulator.faults.EMULATOR_USER_AGENT (not imported: see the doc)


class Log:
    """The replica's log: one JSON record per line, stamped as it is written."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life)

    def write(self, stream: str, text: str) -> None:
        with self._lock:
            record = {"t": time.time(), "s": stream, "m": text}
            self._out.write(json.dumps(record) + "\n")
            self._out.flush()

    def pump(self, stream: str, pipe: IO[bytes]) -> None:
        for raw in iter(pipe.readline, b""):
            self.write(stream, raw.decode("utf-8", "replace").rstrip("\r\n"))
        pipe.close()


def _download(uri: str, dest: Path) -> Path:
    import google.cloud.storage as storage
    from google.api_core.client_info import ClientInfo
    from google.auth.credentials import AnonymousCredentials

    bucket, _, name = uri.removeprefix("gs://").partition("/")
    client = storage.Client(
        project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "cloudtrain-emulated",
        credentials=AnonymousCredentials(),
        client_info=ClientInfo(user_agent=USER_AGENT),
    )
    path = dest / name.rsplit("/", 1)[-1]
    client.bucket(bucket).blob(name).download_to_filename(str(path))
    return path


def _unpack(archive: Path, dest: Path) -> list[str]:
    """Unpack one package; the folders to put on PYTHONPATH."""
    into = dest / (archive.name + ".d")
    into.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as tar:
            tops = {m.name.removeprefix("./").split("/", 1)[0] for m in tar.getmembers()} - {"", "."}
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
            else:  # pragma: no cover (Pythons without extraction filters)
                tar.extractall(into)  # noqa: S202
        top = into / tops.pop() if len(tops) == 1 else into
        root = top if top.is_dir() else into  # an sdist: its one top folder
    elif archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into)
        root = into
    else:
        raise ValueError(f"{archive.name}: not a Python package (.tar.gz sdist, .whl or .zip)")
    return [str(root / "src"), str(root)] if (root / "src").is_dir() else [str(root)]


def _install(uris: list[str]) -> list[str]:
    dest = Path.cwd() / "packages"
    dest.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    for uri in uris:
        paths += _unpack(_download(uri, dest), dest)
    return paths


def main(argv: list[str]) -> int:
    launch: dict[str, Any] = json.loads(Path(argv[1]).read_text())
    log = Log(launch["log"])
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the log as they are printed
    try:
        paths = _install(list(launch.get("packages") or []))
    except Exception as exc:  # the replica fails as a failed install fails it on Vertex
        log.write("stderr", f"Failed to install the training package(s): {type(exc).__name__}: {exc}")
        return 1
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    command = list(launch.get("argv") or [])
    if launch.get("module"):
        command = [sys.executable, "-m", launch["module"], *launch.get("args", [])]
    if not command:
        log.write("stderr", "No command to run: the emulated image has no entrypoint; set command or args.")
        return 1
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        log.write("stderr", f"Failed to start {command[0]!r}: {exc}")
        return 127
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    pumps = [
        threading.Thread(target=log.pump, args=(name, pipe), daemon=True)
        for name, pipe in (("stdout", child.stdout), ("stderr", child.stderr))
    ]
    for pump in pumps:
        pump.start()
    code = child.wait()
    for pump in pumps:
        pump.join(timeout=5)
    return code if code >= 0 else 128 - code  # killed by signal N: status 128 + N, as a container's


if __name__ == "__main__":
    sys.exit(main(sys.argv))

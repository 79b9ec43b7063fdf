r"""Shipping the agent to an instance: the agent zipapp and the user-data / startup script.

The operator uploads ``build_agent_zip()`` to ``runs.AGENT_KEY`` in the run folder and launches the
instance with ``render_user_data(run_uri, cloud, hard_stop_s=...)``, so the instance runs exactly the
operator's agent version without a package index. The script fetches the zip with the instance's own
role (AWS) or service account (GCP): it contains no credentials, keys or tokens, because user data is
readable by anyone who can describe the instance.

The zip carries the contract floor (``contract/``: the run folder's records, the work-queue contract,
the cloud names, secret references, retry classification, ``checkpoint``, which the job imports: the
agent puts the zip on the job's ``PYTHONPATH``), ``storage`` (``RunFolder``) and the agent package,
whole: nothing else of the provider (nor Airflow) is imported on the instance: it imports with the
stdlib and boto3 / google-cloud-storage only. A fleet's workers
(``render_user_data(..., worker=True)``) on GCE also get google-cloud-pubsub and google-cloud-compute
for their queue and group (``agent.queue_pubsub``); on AWS boto3 serves SQS and Auto Scaling too.

Cloud-side hard stop (``hard_stop_s``): the script has a line ``CT_HARD_STOP_S=<seconds>`` (empty
when ``None``; the emulator parses ``^CT_HARD_STOP_S=(\d*)$``). When it is set, the very first thing
the script does after redirecting its output to the log, before installing anything, is to arm a
timer that powers the machine off after that many seconds, whatever becomes of the agent:
``systemd-run --on-active=<s>s --timer-property=AccuracySec=1s <shutdown> -h now``, else
``shutdown -h +<minutes, rounded up>``; if neither works it logs that and goes on (the agent's own
``max_runtime`` and the operator's watch still apply). Instances are launched with
instance-initiated shutdown = terminate, so powering off ends them. The timer counts from the
bootstrap's start, so callers pass ``max_runtime`` plus a margin for boot, setup and upload. GCE
gets its hard stop from ``scheduling.maxRunDuration`` instead, so the operator passes ``None`` for
``gcloud`` / ``gcspot``; the script still honours a value on any cloud.

Testing hooks of the script (unset on a real instance, where nothing changes):

- ``CLOUDTRAIN_ROOT``: prefix for every path the script touches (``$CLOUDTRAIN_ROOT/var/log``,
  ``$CLOUDTRAIN_ROOT/opt/cloudtrain``), so a test can run it in a scratch directory.
- ``CLOUDTRAIN_BOOTSTRAP_STUBS``: a file sourced after the step functions are defined and before they
  run; it may redefine ``ct_install_packages`` (must set ``CT_PYTHON``), ``ct_install_os_packages``,
  ``ct_download_agent`` (must produce ``$CT_AGENT_ZIP``) or ``ct_start_agent``.
- ``PATH``: the steps call ``python3``, ``apt-get``/``dnf``/``yum``, ``setsid``, ``nohup``,
  ``systemd-run`` and ``shutdown`` by name, so shims on PATH can stand in for them (e.g. a
  ``python3`` that records its argv). The hard stop is armed before the stubs file is sourced.
"""

from __future__ import annotations

import io
import math
import re
import shlex
import zipfile
from pathlib import Path
from typing import Any

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.clouds import CLOUDS

_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the zip epoch: same version, same bytes

_ZIP_MAIN = b"""from airflow_cloudtrain.agent.cli import main

raise SystemExit(main())
"""

AWS_DOWNLOAD_PY = """import sys
import boto3
from botocore.config import Config
uri, dest = sys.argv[1], sys.argv[2]
bucket, _, key = uri[len("s3://"):].partition("/")
config = Config(retries={"mode": "standard", "max_attempts": 10})
boto3.client("s3", config=config).download_file(bucket, key, dest)
"""

GCS_DOWNLOAD_PY = """import sys
from google.cloud import storage
uri, dest = sys.argv[1], sys.argv[2]
bucket, _, key = uri[len("gs://"):].partition("/")
client = storage.Client()
client._bucket_metadata_cache = None  # no buckets.get of its own (airflow_cloudtrain.storage.without_bucket_lookups)
client.bucket(bucket).blob(key).download_to_filename(dest)
"""

# (import name, pip package, download snippet) for the run folder's storage.
_SDK = {
    "s3": ("boto3", "boto3", AWS_DOWNLOAD_PY),
    "gs": ("google.cloud.storage", "google-cloud-storage", GCS_DOWNLOAD_PY),
}
# What a worker (``worker=True``) needs besides the storage SDK, per scheme: (import names, pip packages).
# On GCE its queue is a Pub/Sub subscription (``agent.queue_pubsub``); leaving its managed instance group
# is one REST call through google-auth, which google-cloud-storage brings. On AWS boto3 already covers
# SQS and Auto Scaling.
_WORKER_SDK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "s3": ((), ()),
    "gs": (("google.pubsub_v1",), ("google-cloud-pubsub",)),
}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # modules and packages split safely in bash
POWEROFF = "shutdown -h now"


def _version() -> str:
    from airflow_cloudtrain import __version__

    return str(__version__)


# What the zip carries, whole: the package's stdlib-only top (version, the job's ``checkpoint`` name),
# the contract floor, the run-folder storage and the agent. Nothing else of the provider (nor Airflow)
# is importable on the instance; ``tests/unit/test_layers.py`` keeps these floors free of the rest.
SHIPPED_MODULES = ("__init__.py", "checkpoint.py", "storage.py", "transfer.py")
SHIPPED_PACKAGES = ("contract", "agent")


def build_agent_zip() -> bytes:
    """The agent as a zipapp (``python3 agent.zip --run-uri ...``); deterministic for a given version.

    It carries ``SHIPPED_MODULES`` and every module of ``SHIPPED_PACKAGES`` as they are: the
    contract floor imports only the standard library, ``storage`` adds boto3 / google-cloud-storage
    when a folder of that scheme is opened, and the agent imports only those two.

    Built once per process while its files stay as they are (their sizes and modification times
    are the key): every run uploads it, and every agent started from source (the emulated instances)
    copies it for its job, about 12 ms of CPU each time.
    """
    package = Path(__file__).resolve().parent.parent
    paths = [package / name for name in SHIPPED_MODULES]
    for folder in SHIPPED_PACKAGES:
        paths.extend(sorted((package / folder).glob("*.py")))
    stats = [path.stat() for path in paths]
    key = tuple((str(path), st.st_mtime_ns, st.st_size) for path, st in zip(paths, stats, strict=True))
    if _BUILT and _BUILT[0] == key:
        return _BUILT[1]
    files: dict[str, bytes] = {"__main__.py": _ZIP_MAIN}
    for path in paths:
        files[f"airflow_cloudtrain/{path.relative_to(package).as_posix()}"] = path.read_bytes()
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, whatever builds it
            info.external_attr = 0o644 << 16
            archive.writestr(info, files[name])
    _BUILT[:] = [key, buffer.getvalue()]
    return _BUILT[1]


_BUILT: list[Any] = []  # [key, zip bytes] of the last build (``build_agent_zip``)


_TEMPLATE = r"""#!/bin/bash
# cloudtrain bootstrap (airflow-cloudtrain @VERSION@): fetch the agent from the run folder with this
# instance's own role / service account and start it. No credentials are in this script.
set -euo pipefail

CT_ROOT="${CLOUDTRAIN_ROOT:-}"
CT_RUN_URI=@RUN_URI@
CT_AGENT_URI=@AGENT_URI@
CT_CLOUD=@CLOUD@
CT_PY_MODULE=@PY_MODULE@
CT_PIP_PACKAGE=@PIP_PACKAGE@
CT_DOWNLOAD_PY=@DOWNLOAD_PY@
CT_POWEROFF=@POWEROFF@
CT_HARD_STOP_S=@HARD_STOP_S@
CT_LOG_DIR="$CT_ROOT/var/log"
CT_HOME="$CT_ROOT/opt/cloudtrain"
CT_AGENT_ZIP="$CT_HOME/agent.zip"
CT_PYTHON=python3

mkdir -p "$CT_LOG_DIR" "$CT_HOME"
exec >>"$CT_LOG_DIR/cloudtrain-bootstrap.log" 2>&1
echo "cloudtrain bootstrap on $CT_CLOUD at $(date -u +%Y-%m-%dT%H:%M:%SZ) for $CT_RUN_URI"

ct_arm_hard_stop() {
  # Cloud-side hard stop: power off after CT_HARD_STOP_S seconds, whatever becomes of the agent
  # (instance-initiated shutdown terminates the instance). Never fatal: the agent's max_runtime and
  # the operator still apply.
  if [ -z "$CT_HARD_STOP_S" ]; then return 0; fi
  local shutdown_bin minutes pid waited
  shutdown_bin="$(command -v shutdown 2>/dev/null || true)"
  if [ -z "$shutdown_bin" ]; then shutdown_bin=/sbin/shutdown; fi
  if command -v systemd-run >/dev/null 2>&1 &&
    systemd-run --on-active="${CT_HARD_STOP_S}s" --timer-property=AccuracySec=1s "$shutdown_bin" -h now; then
    echo "hard stop armed: a systemd timer powers off in ${CT_HARD_STOP_S} s"
    return 0
  fi
  minutes=$(((CT_HARD_STOP_S + 59) / 60))
  # systemd's shutdown schedules and returns at once; a SysV one waits in the foreground until the
  # time comes. So: run it in the background, and "still waiting after 2 s" counts as armed too.
  "$shutdown_bin" -h "+$minutes" </dev/null &
  pid=$!
  waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 20 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "hard stop armed: $shutdown_bin -h +$minutes is waiting (pid $pid)"
    return 0
  fi
  if wait "$pid"; then
    echo "hard stop armed: $shutdown_bin -h +$minutes"
    return 0
  fi
  echo "cannot arm the hard stop of ${CT_HARD_STOP_S} s (no systemd-run, shutdown failed): going on" >&2
  return 0
}
ct_arm_hard_stop
export HOME="${HOME:-/root}"  # cloud-init may leave it unset; pip wants one

ct_give_up() {
  # A bootstrap that cannot start the agent must not leave the machine running (and billing).
  echo "cloudtrain bootstrap failed at line $1: powering off" >&2
  $CT_POWEROFF || true
}
trap 'ct_give_up $LINENO' ERR

ct_install_os_packages() {
  # python3 with venv and pip from the distribution, with whichever package manager is here.
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -y -q && apt-get install -y -q python3 python3-venv python3-pip
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3 python3-pip
  elif command -v yum >/dev/null 2>&1; then
    yum install -y -q python3 python3-pip
  else
    echo "no apt-get, dnf or yum here: cannot install python3" >&2
    return 1
  fi
}

ct_install_packages() {
  # Sets CT_PYTHON to an interpreter that imports the storage SDK: the system one if it already
  # does (most ML images), else a venv under $CT_HOME/venv (no clash with distribution packages).
  if command -v python3 >/dev/null 2>&1 && python3 -c "import $CT_PY_MODULE" >/dev/null 2>&1; then
    CT_PYTHON=python3
    return 0
  fi
  if [ -x "$CT_HOME/venv/bin/python" ] && "$CT_HOME/venv/bin/python" -c "import $CT_PY_MODULE" >/dev/null 2>&1; then
    CT_PYTHON="$CT_HOME/venv/bin/python"
    return 0
  fi
  if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    ct_install_os_packages
  fi
  python3 -m venv --system-site-packages "$CT_HOME/venv"
  "$CT_HOME/venv/bin/python" -m pip install -q --upgrade @PIP_ARGS@
  CT_PYTHON="$CT_HOME/venv/bin/python"
}

ct_download_agent() {
  # With the instance's role / service account, found by the SDK itself.
  "$CT_PYTHON" -c "$CT_DOWNLOAD_PY" "$CT_AGENT_URI" "$CT_AGENT_ZIP.part" && mv -f "$CT_AGENT_ZIP.part" "$CT_AGENT_ZIP"
}

ct_start_agent() {
  cd "$CT_HOME"
  local detach=""  # a plain word, not an array: empty arrays trip `set -u` on bash < 4.4
  if command -v setsid >/dev/null 2>&1; then detach=setsid; fi
  $detach nohup "$CT_PYTHON" "$CT_AGENT_ZIP" --run-uri "$CT_RUN_URI" --poweroff "$CT_POWEROFF" \
    >>"$CT_LOG_DIR/cloudtrain-agent.log" 2>&1 </dev/null &
  echo "cloudtrain agent started (pid $!)"
}

if [ -n "${CLOUDTRAIN_BOOTSTRAP_STUBS:-}" ]; then
  . "$CLOUDTRAIN_BOOTSTRAP_STUBS"  # tests only: redefine ct_* steps (see airflow_cloudtrain.contract.bootstrap)
fi

ct_install_packages
for attempt in 1 2 3 4 5 6 7 8 9 10; do  # the role may take a moment to reach a new instance
  if ct_download_agent; then break; fi
  if [ "$attempt" = 10 ]; then
    echo "cannot download the agent from $CT_AGENT_URI" >&2
    ct_give_up "$LINENO"
    exit 1
  fi
  sleep $((attempt * 3))
done
ct_start_agent
trap - ERR  # from here on the agent owns the machine's life
"""


def render_user_data(
    run_uri: str,
    cloud: str,
    agent_key: str = runs.AGENT_KEY,
    hard_stop_s: int | None = None,
    *,
    worker: bool = False,
) -> str:
    """The bash user data (EC2) / startup-script (GCE) that starts the agent for ``run_uri``.

    The storage SDK installed is the one of the run folder's scheme (boto3 for s3://,
    google-cloud-storage for gs://), since that is what the agent talks to. ``hard_stop_s`` (seconds,
    > 0; a float is rounded up) arms the cloud-side hard stop described in the module docstring; the
    script gets ``CT_HARD_STOP_S=<int>``, or ``CT_HARD_STOP_S=`` (nothing armed) for ``None``.

    ``worker``: the agent will run in worker mode, so it also needs its queue's and group's SDKs: for
    gs:// google-cloud-pubsub and google-cloud-compute (``CT_PY_MODULE`` is then an import list,
    ``a, b, c``, checked in one ``import``, and ``CT_PIP_PACKAGE`` the packages separated by spaces,
    installed together when any import fails); for s3:// boto3 does it all. Without ``worker`` the
    script is exactly what it always was.
    """
    if cloud not in CLOUDS:
        raise ValueError(f"cloud must be one of {', '.join(CLOUDS)}; got {cloud!r}")
    hard_stop = ""
    if hard_stop_s is not None:
        if (
            isinstance(hard_stop_s, bool)
            or not isinstance(hard_stop_s, (int, float))
            or not math.isfinite(hard_stop_s)
            or hard_stop_s <= 0
        ):
            raise ValueError(f"hard_stop_s must be a positive number of seconds or None; got {hard_stop_s!r}")
        hard_stop = str(math.ceil(hard_stop_s))
    scheme = runs.split_uri(run_uri)[0]
    module, package, download_py = _SDK[scheme]
    modules, packages = [module], [package]
    if worker:
        more_modules, more_packages = _WORKER_SDK[scheme]
        modules += more_modules
        packages += more_packages
    assert all(_PLAIN_NAME.match(name) for name in modules + packages), (modules, packages)
    values = {
        "@VERSION@": _version(),
        "@RUN_URI@": shlex.quote(run_uri),
        "@AGENT_URI@": shlex.quote(runs.join(run_uri, agent_key)),
        "@CLOUD@": shlex.quote(cloud),
        "@PY_MODULE@": shlex.quote(", ".join(modules)),  # import a, b, c
        "@PIP_PACKAGE@": shlex.quote(" ".join(packages)),
        # one package: quoted, as it always was; several: split on the spaces (plain names only)
        "@PIP_ARGS@": '"$CT_PIP_PACKAGE"' if len(packages) == 1 else "$CT_PIP_PACKAGE",
        "@DOWNLOAD_PY@": shlex.quote(download_py),
        "@POWEROFF@": shlex.quote(POWEROFF),
        "@HARD_STOP_S@": hard_stop,  # digits or nothing: the emulator reads ^CT_HARD_STOP_S=(\d*)$
    }
    # One pass, so a placeholder-looking run URI is never substituted again.
    return re.sub(r"@[A-Z_]+@", lambda m: values[m.group(0)], _TEMPLATE)

"""The user-data script and the agent zipapp: the only checks they get, since the emulator starts
the agent directly. The script runs for real with bash in a scratch root, with ``python3`` (and the
package managers, ``shutdown`` and ``systemd-run``) replaced by shims on PATH that record what they
were asked to do. The hard stop (``CT_HARD_STOP_S``) is checked the same way: which timer the script
arms, and that it does so before anything is installed."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from airflow_cloudtrain import __version__
from airflow_cloudtrain.contract import bootstrap, runs
from airflow_cloudtrain.contract.bootstrap import build_agent_zip, render_user_data

NASTY_URI = 's3://bucket/runs/my dag/it\'s a "run" $HOME `id` @CLOUD@ ;x/0'

# Stands in for python3 and, copied by "-m venv", for the venv's python. SHIM_SDK=system: the system
# python imports the SDK; SHIM_SDK=venv: only a venv python does. SHIM_ENSUREPIP=0: no venv module.
SHIM = r"""#!/bin/bash
printf '%s\n' "$0 $*" >> "$SHIM_LOG/calls"
if [ "$1" = "-c" ] && [ $# -eq 2 ]; then
  if [ "$2" = "import ensurepip, venv" ]; then [ "${SHIM_ENSUREPIP:-1}" = 1 ]; exit $?; fi
  if [ "$SHIM_SDK" = system ] || [[ "$0" == */venv/bin/python ]]; then exit 0; fi
  exit 1
fi
if [ "$1" = "-c" ]; then
  printf '%s' "$3" > "$SHIM_LOG/download-uri"; printf 'zip' > "$4"; exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = venv ]; then mkdir -p "$4/bin" && cp "$0" "$4/bin/python"; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = pip ]; then printf '%s\n' "$*" >> "$SHIM_LOG/pip"; exit 0; fi
printf '%s\0' "$0" "$@" > "$SHIM_LOG/argv.tmp" && mv "$SHIM_LOG/argv.tmp" "$SHIM_LOG/agent-argv"
"""

PACKAGE_MANAGER_SHIM = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$SHIM_LOG/os-packages"
"""


@pytest.mark.parametrize(("uri", "cloud"), [("s3://b/runs/x/0", "ec2spot"), ("gs://b/runs/x/0", "gcspot")])
def test_script_parses(uri: str, cloud: str, tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(uri, cloud))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_rejects_unknown_cloud() -> None:
    with pytest.raises(ValueError, match="cloud must be one of"):
        render_user_data("s3://b/r", "azure")


def test_no_credentials_in_script(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLESESSION",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    for uri, cloud in [("s3://b/runs/x/0", "ec2"), ("gs://b/runs/x/0", "gcloud")]:
        script = render_user_data(uri, cloud)
        for value in secrets.values():
            assert value not in script
        assert not re.search(
            r"AKIA|ASIA[0-9A-Z]{8}|aws_secret_access_key|secret|token|password", script, re.I
        )


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# Records its argv, in the same "calls" log as python3 (so the order shows), and exits SHIM_SYSTEMD_RC.
SYSTEMD_RUN_SHIM = r"""#!/bin/bash
printf '%s\n' "systemd-run $*" >> "$SHIM_LOG/calls"
printf '%s\0' "$@" > "$SHIM_LOG/systemd-run"
exit "${SHIM_SYSTEMD_RC:-0}"
"""
# never the real one: a failing bootstrap powers the machine off; exits SHIM_SHUTDOWN_RC
SHUTDOWN_SHIM = r"""#!/bin/bash
printf '%s\n' "shutdown $*" >> "$SHIM_LOG/calls"
printf '%s\n' "$*" >> "$SHIM_LOG/shutdown"
exit "${SHIM_SHUTDOWN_RC:-0}"
"""


def _system_path_without(tmp_path: Path, hidden: set[str]) -> str:
    """A PATH with the system's commands except ``hidden`` (links in one folder, first one wins)."""
    sysbin = tmp_path / "sysbin"
    sysbin.mkdir()
    for folder in SYSTEM_PATH.split(":"):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = sysbin / entry.name
            if entry.name in hidden or target.exists() or target.is_symlink():
                continue
            target.symlink_to(entry.path)
    return str(sysbin)


def _run_script(
    tmp_path: Path,
    uri: str,
    cloud: str,
    env_extra: dict[str, str],
    stubs: str | None = None,
    hard_stop_s: int | None = None,
    hide: set[str] | None = None,
    worker: bool = False,
) -> tuple[Path, Path]:
    """Run the rendered script in a scratch root with shims; returns (root, shim log dir).

    ``hide``: commands absent from PATH altogether (our shims and the system's); e.g. systemd-run.
    """
    hide = hide or set()
    root, bin_dir, shim_log = tmp_path / "root", tmp_path / "bin", tmp_path / "shimlog"
    for directory in (root, bin_dir, shim_log):
        directory.mkdir()
    shims = {"python3": SHIM, "shutdown": SHUTDOWN_SHIM, "systemd-run": SYSTEMD_RUN_SHIM}
    shims.update(dict.fromkeys(("apt-get", "dnf", "yum"), PACKAGE_MANAGER_SHIM))
    for name, text in shims.items():
        if name not in hide:
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(uri, cloud, hard_stop_s=hard_stop_s, worker=worker))
    system_path = _system_path_without(tmp_path, hide) if hide else SYSTEM_PATH
    env = {
        "PATH": f"{bin_dir}:{system_path}",
        "CLOUDTRAIN_ROOT": str(root),
        "SHIM_LOG": str(shim_log),
        **env_extra,
    }
    if stubs is not None:
        (tmp_path / "stubs.sh").write_text(stubs)
        env["CLOUDTRAIN_BOOTSTRAP_STUBS"] = str(tmp_path / "stubs.sh")
    done = subprocess.run(["bash", str(script)], env=env, timeout=60, capture_output=True, text=True)
    log = (root / "var/log/cloudtrain-bootstrap.log").read_text()
    if env_extra.get("EXPECT_FAILURE"):
        assert done.returncode != 0, log
        return root, shim_log
    assert done.returncode == 0, log + done.stderr
    assert done.stdout == ""  # everything goes to the bootstrap log
    return root, shim_log


def _agent_argv(shim_log: Path) -> list[str]:
    """The argv the detached agent was started with (it runs in the background: wait for it)."""
    deadline = time.monotonic() + 120  # a process start on a loaded machine
    record = shim_log / "agent-argv"
    while not record.exists():
        assert time.monotonic() < deadline, "the agent was not started"
        time.sleep(0.05)
    return record.read_text().split("\0")[:-1]


@pytest.mark.parametrize(
    ("uri", "cloud", "package"),
    [
        (NASTY_URI, "ec2spot", "boto3"),
        (NASTY_URI.replace("s3://", "gs://"), "gcspot", "google-cloud-storage"),
    ],
)
def test_starts_agent_with_system_python(uri: str, cloud: str, package: str, tmp_path: Path) -> None:
    root, shim_log = _run_script(tmp_path, uri, cloud, {"SHIM_SDK": "system"})
    argv = _agent_argv(shim_log)
    agent_zip = str(root / "opt/cloudtrain/agent.zip")
    assert argv == [
        str(tmp_path / "bin/python3"),
        agent_zip,
        "--run-uri",
        uri,
        "--poweroff",
        "shutdown -h now",
    ]
    assert (shim_log / "download-uri").read_text() == runs.join(uri, runs.AGENT_KEY)
    assert Path(agent_zip).read_text() == "zip"
    assert not (shim_log / "pip").exists() and not (shim_log / "os-packages").exists()
    assert "started" in (root / "var/log/cloudtrain-bootstrap.log").read_text()


@pytest.mark.parametrize("ensurepip", ["1", "0"])
def test_installs_sdk_into_venv(ensurepip: str, tmp_path: Path) -> None:
    env = {"SHIM_SDK": "venv", "SHIM_ENSUREPIP": ensurepip}
    root, shim_log = _run_script(tmp_path, "gs://b/runs/x/0", "gcloud", env)
    venv_python = str(root / "opt/cloudtrain/venv/bin/python")
    assert _agent_argv(shim_log)[:2] == [venv_python, str(root / "opt/cloudtrain/agent.zip")]
    assert (shim_log / "pip").read_text().split() == [
        "-m",
        "pip",
        "install",
        "-q",
        "--upgrade",
        "google-cloud-storage",
    ]
    if ensurepip == "1":
        assert not (shim_log / "os-packages").exists()
    else:  # no venv module: the distribution's packages first (apt-get is the first manager found)
        installs = (shim_log / "os-packages").read_text().splitlines()
        assert installs[-1] == "apt-get install -y -q python3 python3-venv python3-pip"


# Leaving its managed instance group is one REST call through google-auth (agent.queue_pubsub.GroupsRest):
# no google-cloud-compute on the VM
GCE_WORKER_MODULES = "google.cloud.storage, google.pubsub_v1"
GCE_WORKER_PACKAGES = ["google-cloud-storage", "google-cloud-pubsub"]


@pytest.mark.parametrize("sdk", ["venv", "system"])
def test_gce_worker_needs_pubsub_too(sdk: str, tmp_path: Path) -> None:
    """A worker on GCE talks to Pub/Sub besides GCS: one import check covers both modules, and pip gets
    both packages as separate arguments."""
    root, shim_log = _run_script(tmp_path, "gs://b/runs/x/0", "gcspot", {"SHIM_SDK": sdk}, worker=True)
    checks = [c for c in _calls(shim_log) if " -c import google" in c]  # not the download snippet
    assert checks and all(c.endswith(f" -c import {GCE_WORKER_MODULES}") for c in checks), checks
    if sdk == "venv":
        venv_python = str(root / "opt/cloudtrain/venv/bin/python")
        assert _agent_argv(shim_log)[0] == venv_python
        pip = (shim_log / "pip").read_text().splitlines()
        assert pip == [" ".join(["-m", "pip", "install", "-q", "--upgrade", *GCE_WORKER_PACKAGES])]
    else:  # the image has them all: nothing installed
        assert _agent_argv(shim_log)[0] == str(tmp_path / "bin/python3")
        assert not (shim_log / "pip").exists()


def test_worker_rendering(tmp_path: Path) -> None:
    """Only a gs:// worker's script differs; s3:// workers need nothing but boto3."""
    for uri, cloud in [("s3://b/runs/x/0", "ec2spot"), ("gs://b/runs/x/0", "gcspot")]:
        assert render_user_data(uri, cloud, worker=False) == render_user_data(uri, cloud)
    assert render_user_data("s3://b/r", "ec2spot", worker=True) == render_user_data("s3://b/r", "ec2spot")
    script = render_user_data("gs://b/r", "gcspot", hard_stop_s=60, worker=True)
    lines = script.splitlines()
    assert f"CT_PY_MODULE='{GCE_WORKER_MODULES}'" in lines
    assert f"CT_PIP_PACKAGE='{' '.join(GCE_WORKER_PACKAGES)}'" in lines
    assert HARD_STOP_LINE.findall(script) == ["60"]
    plain = render_user_data("gs://b/r", "gcspot")
    assert "CT_PY_MODULE=google.cloud.storage" in plain.splitlines()
    assert 'pip install -q --upgrade "$CT_PIP_PACKAGE"' in plain  # one package, quoted as ever
    (tmp_path / "user-data.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "user-data.sh")], check=True)


def test_stub_hook_replaces_steps(tmp_path: Path) -> None:
    stubs = """
ct_install_packages() { CT_PYTHON=python3; echo stubbed-install; }
ct_download_agent() { printf 'stub' > "$CT_AGENT_ZIP"; printf '%s' "$CT_AGENT_URI" > "$SHIM_LOG/stub-uri"; }
"""
    root, shim_log = _run_script(tmp_path, NASTY_URI, "ec2", {"SHIM_SDK": "none"}, stubs=stubs)
    assert _agent_argv(shim_log)[1:] == [
        str(root / "opt/cloudtrain/agent.zip"),
        "--run-uri",
        NASTY_URI,
        "--poweroff",
        "shutdown -h now",
    ]
    assert (shim_log / "stub-uri").read_text() == runs.join(NASTY_URI, runs.AGENT_KEY)
    assert "stubbed-install" in (root / "var/log/cloudtrain-bootstrap.log").read_text()
    assert not (shim_log / "calls").read_text().count(" -c ")  # neither import checks nor download ran


def test_the_kept_agent_zip_is_built_again_when_its_files_changed() -> None:
    built = build_agent_zip()
    key = bootstrap._BUILT[0]
    assert build_agent_zip() is built  # the files as they were: the last build
    bootstrap._BUILT[:] = [
        (*key[:-1], (key[-1][0], key[-1][1] + 1, key[-1][2])),
        b"stale",
    ]  # one file touched
    assert build_agent_zip() == built


def test_agent_zip_is_deterministic_and_self_contained(tmp_path: Path) -> None:
    data = build_agent_zip()
    bootstrap._BUILT.clear()  # built again from the files, not the process's last build
    assert data == build_agent_zip()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        stub = archive.read("airflow_cloudtrain/__init__.py").decode()
    assert "__main__.py" in names and "airflow_cloudtrain/contract/runs.py" in names
    assert {"airflow_cloudtrain/agent/cli.py", "airflow_cloudtrain/storage.py"} <= set(names)
    assert {"airflow_cloudtrain/checkpoint.py", "airflow_cloudtrain/agent/checkpoints.py"} <= set(names)
    assert all(n == "__main__.py" or n.startswith("airflow_cloudtrain/") for n in names)
    assert f'__version__ = "{__version__}"' in stub  # the package top, whole: stdlib only
    agent_zip = tmp_path / "agent.zip"
    agent_zip.write_bytes(data)
    # -S: no site-packages, so the installed airflow_cloudtrain cannot stand in for the zip's copy
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-S", str(agent_zip), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--run-uri" in done.stdout and "--poweroff" in done.stdout
    # the job side: the zip on PYTHONPATH (as the agent puts it) imports the checkpoint helpers alone
    code = "from airflow_cloudtrain import checkpoint; print(checkpoint.__file__, checkpoint.step_of('ckpt-7.pt'))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(agent_zip)},
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{agent_zip}/airflow_cloudtrain/contract/checkpoint.py", "7"]


def test_a_failing_bootstrap_powers_the_machine_off(tmp_path: Path) -> None:
    """No agent, no one to power off: the script itself must, or the instance runs (and bills) on."""
    stubs = "ct_install_packages() { echo 'pip: no route to the index' >&2; return 1; }\n"
    root, shim_log = _run_script(tmp_path, "s3://b/runs/x/0", "ec2", {"EXPECT_FAILURE": "1"}, stubs)
    assert (shim_log / "shutdown").read_text().strip() == "-h now"
    assert not (shim_log / "agent-argv").exists()
    assert "cloudtrain bootstrap failed" in (root / "var/log/cloudtrain-bootstrap.log").read_text()


def test_a_started_agent_is_not_powered_off_by_the_bootstrap(tmp_path: Path) -> None:
    _, shim_log = _run_script(tmp_path, "s3://b/runs/x/0", "ec2", {"SHIM_SDK": "system"})
    assert _agent_argv(shim_log)  # waits for the detached agent to start
    assert not (shim_log / "shutdown").exists()


# -- the cloud-side hard stop (CT_HARD_STOP_S) ---------------------------------------------------------

HARD_STOP_LINE = re.compile(r"^CT_HARD_STOP_S=(\d*)$", re.M)  # what the emulator parses


@pytest.mark.parametrize(
    ("hard_stop_s", "line"), [(None, ""), (3600, "3600"), (90, "90"), (1.2, "2"), (7200.0, "7200")]
)
@pytest.mark.parametrize(("uri", "cloud"), [("s3://b/runs/x/0", "ec2spot"), ("gs://b/runs/x/0", "gcloud")])
def test_hard_stop_line(hard_stop_s: float | None, line: str, uri: str, cloud: str, tmp_path: Path) -> None:
    script = render_user_data(uri, cloud, hard_stop_s=hard_stop_s)  # type: ignore[arg-type]
    assert HARD_STOP_LINE.findall(script) == [line]
    assert render_user_data(uri, cloud) == render_user_data(uri, cloud, hard_stop_s=None)
    # among the other CT_* settings, before the log redirection and everything the script does
    lines = script.splitlines()
    at = lines.index(f"CT_HARD_STOP_S={line}")
    assert lines[at - 1].startswith("CT_POWEROFF=") and at < lines.index("set -euo pipefail") + 20
    (tmp_path / "user-data.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "user-data.sh")], check=True)


@pytest.mark.parametrize("bad", [0, -5, True, float("inf"), float("nan"), "3600"])
def test_hard_stop_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ValueError, match="hard_stop_s"):
        render_user_data("s3://b/r", "ec2", hard_stop_s=bad)  # type: ignore[arg-type]


def _calls(shim_log: Path) -> list[str]:
    return (shim_log / "calls").read_text().splitlines()


def test_hard_stop_armed_with_systemd_run_before_anything_else(tmp_path: Path) -> None:
    root, shim_log = _run_script(
        tmp_path, "s3://b/runs/x/0", "ec2spot", {"SHIM_SDK": "venv"}, hard_stop_s=3600
    )
    assert _agent_argv(shim_log)  # the run goes on as usual
    argv = (shim_log / "systemd-run").read_text().split("\0")[:-1]
    assert argv == [
        "--on-active=3600s",
        "--timer-property=AccuracySec=1s",
        str(tmp_path / "bin/shutdown"),  # the path, resolved by the script
        "-h",
        "now",
    ]
    calls = _calls(shim_log)
    assert calls[0].startswith("systemd-run ") and len(calls) > 1  # armed before python3 is even asked
    assert not (shim_log / "shutdown").exists()  # the timer is armed: no shutdown fallback, no power-off
    assert (shim_log / "pip").exists()  # installing came after
    assert "hard stop armed" in (root / "var/log/cloudtrain-bootstrap.log").read_text()


@pytest.mark.parametrize(("hard_stop_s", "minutes"), [(3600, 60), (3601, 61), (90, 2), (1, 1)])
def test_hard_stop_falls_back_to_shutdown_without_systemd_run(
    hard_stop_s: int, minutes: int, tmp_path: Path
) -> None:
    root, shim_log = _run_script(
        tmp_path,
        "s3://b/runs/x/0",
        "ec2",
        {"SHIM_SDK": "system"},
        hard_stop_s=hard_stop_s,
        hide={"systemd-run"},
    )
    assert _agent_argv(shim_log)
    assert (shim_log / "shutdown").read_text().splitlines() == [f"-h +{minutes}"]
    assert _calls(shim_log)[0] == f"shutdown -h +{minutes}"  # before anything else
    assert not (shim_log / "systemd-run").exists()
    assert (
        f"hard stop armed: {tmp_path / 'bin/shutdown'} -h +{minutes}"
        in (root / "var/log/cloudtrain-bootstrap.log").read_text()
    )


def test_hard_stop_falls_back_to_shutdown_when_systemd_run_fails(tmp_path: Path) -> None:
    """systemd-run is there but cannot reach systemd (e.g. a container): shutdown -h +N instead."""
    env = {"SHIM_SDK": "system", "SHIM_SYSTEMD_RC": "1"}
    _, shim_log = _run_script(tmp_path, "s3://b/runs/x/0", "ec2spot", env, hard_stop_s=600)
    assert _agent_argv(shim_log)
    assert [c.split()[0] for c in _calls(shim_log)[:2]] == ["systemd-run", "shutdown"]
    assert (shim_log / "shutdown").read_text().splitlines() == ["-h +10"]


def test_hard_stop_that_cannot_be_armed_is_logged_and_the_run_goes_on(tmp_path: Path) -> None:
    env = {"SHIM_SDK": "system", "SHIM_SHUTDOWN_RC": "1"}
    root, shim_log = _run_script(
        tmp_path, "s3://b/runs/x/0", "ec2", env, hard_stop_s=600, hide={"systemd-run"}
    )
    assert _agent_argv(shim_log)[2:4] == ["--run-uri", "s3://b/runs/x/0"]
    assert (shim_log / "shutdown").read_text().splitlines() == ["-h +10"]  # tried once, not as a give-up
    assert "cannot arm the hard stop of 600 s" in (root / "var/log/cloudtrain-bootstrap.log").read_text()


def test_hard_stop_honoured_on_gce_when_given(tmp_path: Path) -> None:
    """The operator relies on maxRunDuration on GCE, but a value given is armed all the same."""
    _, shim_log = _run_script(tmp_path, "gs://b/runs/x/0", "gcspot", {"SHIM_SDK": "system"}, hard_stop_s=120)
    assert _agent_argv(shim_log)
    assert (shim_log / "systemd-run").read_text().split("\0")[0] == "--on-active=120s"


@pytest.mark.parametrize("cloud", ["ec2spot", "gcspot"])
def test_no_hard_stop_arms_nothing(cloud: str, tmp_path: Path) -> None:
    uri = "s3://b/runs/x/0" if cloud == "ec2spot" else "gs://b/runs/x/0"
    _, shim_log = _run_script(tmp_path, uri, cloud, {"SHIM_SDK": "system"})
    assert _agent_argv(shim_log)
    assert not (shim_log / "systemd-run").exists() and not (shim_log / "shutdown").exists()
    assert not any(c.startswith(("systemd-run", "shutdown")) for c in _calls(shim_log))

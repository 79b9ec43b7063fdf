"""The user-data script and the agent zipapp: the only checks they get, since the emulator starts
the agent directly. The script runs for real with bash in a scratch root, with ``python3`` (and the
package managers) replaced by shims on PATH that record what they were asked to do."""

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

from airflow_cloudtrain import __version__, runs
from airflow_cloudtrain.agent.bootstrap import build_agent_zip, render_user_data

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


def _run_script(
    tmp_path: Path, uri: str, cloud: str, env_extra: dict[str, str], stubs: str | None = None
) -> tuple[Path, Path]:
    """Run the rendered script in a scratch root with shims; returns (root, shim log dir)."""
    root, bin_dir, shim_log = tmp_path / "root", tmp_path / "bin", tmp_path / "shimlog"
    for directory in (root, bin_dir, shim_log):
        directory.mkdir()
    (bin_dir / "python3").write_text(SHIM)
    for manager in ("apt-get", "dnf", "yum"):
        (bin_dir / manager).write_text(PACKAGE_MANAGER_SHIM)
    # never the real one: a failing bootstrap powers the machine off
    (bin_dir / "shutdown").write_text('#!/bin/bash\nprintf "%s\\n" "$*" >> "$SHIM_LOG/shutdown"\n')
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(uri, cloud))
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
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
    deadline = time.monotonic() + 10
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


def test_agent_zip_is_deterministic_and_self_contained(tmp_path: Path) -> None:
    data = build_agent_zip()
    assert data == build_agent_zip()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        stub = archive.read("airflow_cloudtrain/__init__.py").decode()
    assert "__main__.py" in names and "airflow_cloudtrain/runs.py" in names
    assert {"airflow_cloudtrain/agent/cli.py", "airflow_cloudtrain/agent/storage.py"} <= set(names)
    assert all(n == "__main__.py" or n.startswith("airflow_cloudtrain/") for n in names)
    assert f"__version__ = {__version__!r}" in stub and "get_provider_info" not in stub
    agent_zip = tmp_path / "agent.zip"
    agent_zip.write_bytes(data)
    # -S: no site-packages, so the installed airflow_cloudtrain cannot stand in for the zip's copy
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-S", str(agent_zip), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--run-uri" in done.stdout and "--poweroff" in done.stdout


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

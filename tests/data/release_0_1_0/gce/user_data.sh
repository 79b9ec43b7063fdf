#!/bin/bash
# cloudtrain bootstrap (airflow-cloudtrain 0.1.0): fetch the agent from the run folder with this
# instance's own role / service account and start it. No credentials are in this script.
set -euo pipefail

CT_ROOT="${CLOUDTRAIN_ROOT:-}"
CT_RUN_URI=gs://cloudtrain-emulated/release-0-1-0/runs/release_0_1_0_gce/train/manual__2026-01-01T00_00_00_00_00/-1
CT_AGENT_URI=gs://cloudtrain-emulated/release-0-1-0/runs/release_0_1_0_gce/train/manual__2026-01-01T00_00_00_00_00/-1/agent/airflow_cloudtrain.zip
CT_CLOUD=gcspot
CT_PY_MODULE=google.cloud.storage
CT_PIP_PACKAGE=google-cloud-storage
CT_DOWNLOAD_PY='import sys
from google.cloud import storage
uri, dest = sys.argv[1], sys.argv[2]
bucket, _, key = uri[len("gs://"):].partition("/")
storage.Client().bucket(bucket).blob(key).download_to_filename(dest)
'
CT_POWEROFF='shutdown -h now'
CT_HARD_STOP_S=605400
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
  "$CT_HOME/venv/bin/python" -m pip install -q --upgrade "$CT_PIP_PACKAGE"
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
  . "$CLOUDTRAIN_BOOTSTRAP_STUBS"  # tests only: redefine ct_* steps (see airflow_cloudtrain.agent.bootstrap)
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

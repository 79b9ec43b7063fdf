"""``cloudtrain emulator`` runs the emulated clouds in the foreground and says how to use them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def test_cloudtrain_emulator_prints_its_endpoints_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_cloudtrain.cli", "emulator"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("Bucket:"):
                break
        exports = "".join(lines)
        assert "export AWS_ENDPOINT_URL='http://127.0.0.1:" in exports
        assert "export AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT=" in exports
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0

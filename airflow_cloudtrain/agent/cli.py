"""Command line of the agent. The exit code is 0 whatever the job did: the outcome is in status.json."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from airflow_cloudtrain.agent.runner import Agent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="airflow_cloudtrain.agent",
        description="Run a cloudtrain job on this instance, report to the run folder, then power off.",
    )
    parser.add_argument(
        "--run-uri", required=True, help="the run folder, s3://bucket/prefix or gs://bucket/prefix"
    )
    parser.add_argument("--instance-id", help="this instance's id (default: ask the metadata service)")
    parser.add_argument(
        "--workdir",
        help="the job's working directory (default: /var/lib/cloudtrain/work/<id> as root, else a temp dir)",
    )
    parser.add_argument(
        "--poweroff",
        help='shell command run at the very end, e.g. "shutdown -h now" (default: just exit)',
    )
    return parser.parse_args(argv)


def _install_signal_handlers(agent: Agent) -> None:
    """The instance shutting down under us (or Ctrl-C) stops the job like a notice would (the grace
    of a 30 s notice, or ``stop_grace_s`` within it: ``Agent.stop_for_signal``)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        agent.stop_for_signal(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s cloudtrain-agent %(levelname)s %(message)s",
    )
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "google"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    agent = Agent(args.run_uri, instance_id=args.instance_id, workdir=args.workdir, poweroff=args.poweroff)
    _install_signal_handlers(agent)
    return agent.run()

"""Command line of the agent. The exit code is 0 whatever the job did: the outcome is in status.json.

The run folder's spec decides the mode: with ``worker`` set the agent is a worker that takes items
from a queue (``agent.worker``), else it runs the one job (``agent.runner``). A spec that cannot be
read goes to the single run, which reports why under the instance's status and powers off.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from airflow_cloudtrain.agent.runner import Agent, power_off, read_spec
from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.storage import RunFolder, open_run_folder

log = logging.getLogger("cloudtrain.agent")


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


class _SignalRelay:
    """Hands SIGTERM / SIGINT / SIGHUP to whoever runs (``stop_for_signal`` of the Agent or Worker);
    one that came before it was known is handed over when it is."""

    def __init__(self) -> None:
        self.target: Callable[[str], None] | None = None
        self.pending: str | None = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.target is None:
            self.pending = name
        else:
            self.target(name)

    def attach(self, target: Callable[[str], None]) -> None:
        self.target = target
        if self.pending is not None:
            target(self.pending)


def _install_signal_handlers() -> _SignalRelay:
    """The instance shutting down under us (or Ctrl-C) stops the job like a notice would (the grace
    of a 30 s notice, or ``stop_grace_s`` within it: ``Agent.stop_for_signal``); a worker also stops
    taking items."""
    relay = _SignalRelay()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, relay.handler)
    return relay


def _read_spec(run_uri: str) -> tuple[RunFolder | None, runs.RunSpec | None]:
    """The run folder and its spec; (folder or None, None) when either cannot be had (the single
    run's agent then reads it again and reports the error)."""
    try:
        folder = open_run_folder(run_uri)
    except Exception as err:
        log.warning("cannot open the run folder %s: %s: %s", run_uri, type(err).__name__, err)
        return None, None
    try:
        return folder, read_spec(folder)
    except Exception as err:
        log.warning("cannot read the spec: %s: %s", type(err).__name__, err)
        return folder, None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s cloudtrain-agent %(levelname)s %(message)s",
    )
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "google"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    relay = _install_signal_handlers()
    folder, spec = _read_spec(args.run_uri)
    if folder is not None and spec is not None and spec.worker:
        try:
            from airflow_cloudtrain.agent.worker import Worker

            worker = Worker(
                folder, spec, instance_id=args.instance_id, workdir=args.workdir, poweroff=args.poweroff
            )
        except Exception:  # e.g. settings it cannot use: it still must not keep the machine
            log.exception("cannot start the worker")
            power_off(args.poweroff)
            return 0
        relay.attach(worker.stop_for_signal)
        return worker.run()
    agent = Agent(
        args.run_uri,
        instance_id=args.instance_id,
        workdir=args.workdir,
        poweroff=args.poweroff,
        folder=folder,
        spec=spec,
    )
    relay.attach(agent.stop_for_signal)
    return agent.run()

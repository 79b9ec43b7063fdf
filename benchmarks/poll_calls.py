"""How many EC2 requests does waiting on N instances cost per poll? Ours beside the Amazon provider's.

N instances run on the emulated EC2 (moto's server on loopback, requests counted as they arrive).
N triggers wait on them in one event loop, as in one triggerer, each for "running", which every
instance already is: so the measurement is exactly one poll for every watcher, and the table shows
the EC2 requests and the wall time that one poll round costs. Ours share one DescribeInstances per
(connection, region) per poll (up to 1,000 ids a call); ``EC2StateSensorTrigger`` describes per trigger.

    python benchmarks/poll_calls.py [--sizes 1 10 100 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import time

from airflow_cloudtrain.emulator.aws.images import an_image

if "AIRFLOW_HOME" not in os.environ:  # a home of its own, removed at the end
    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="cloudtrain-bench-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], ignore_errors=True)
logging.disable(logging.WARNING)


async def _drain(trigger: object) -> None:
    async with contextlib.aclosing(trigger.run()) as events:  # type: ignore[attr-defined]
        async for _ in events:
            return


async def _one_round(triggers: list[object]) -> None:
    await asyncio.gather(*(_drain(t) for t in triggers))


def measure(emu: object, ids: list[str], impl: str, interval: float) -> tuple[int, float]:
    from airflow.providers.amazon.aws.triggers.ec2 import EC2StateSensorTrigger

    from airflow_cloudtrain.triggers.instances import InstanceStateTrigger

    if impl == "ours":
        triggers = [
            InstanceStateTrigger(
                cloud="ec2",
                instance_ids=[i],
                target_state="running",
                conn_id="aws_default",
                region="us-east-1",
                poll_interval=interval,
            )
            for i in ids
        ]
    else:
        triggers = [
            EC2StateSensorTrigger(
                instance_id=i,
                target_state="running",
                aws_conn_id="aws_default",
                region_name="us-east-1",
                poll_interval=int(interval),
            )
            for i in ids
        ]
    emu.reset_counts()  # type: ignore[attr-defined]
    start = time.perf_counter()
    asyncio.run(_one_round(triggers))
    elapsed = time.perf_counter() - start
    return emu.request_counts().get("DescribeInstances", 0), elapsed  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--interval", type=float, default=5.0, help="poll interval, seconds")
    args = parser.parse_args()

    import boto3

    from airflow_cloudtrain.emulator import Emulator

    print(
        "EC2 DescribeInstances requests for one poll of every watcher, all triggers in one event loop, "
        "moto server on loopback\n"
    )
    print(
        "| watched instances | implementation                  | requests per poll | wall time of the poll (s) |"
    )
    print(
        "|------------------:|---------------------------------|------------------:|--------------------------:|"
    )
    with Emulator() as emu:
        ec2 = boto3.client("ec2")
        image = an_image(ec2)
        for n in args.sizes:
            ids = [
                i["InstanceId"]
                for i in ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=n, MaxCount=n)[
                    "Instances"
                ]
            ]
            for impl, label in (
                ("ours", "cloudtrain InstanceStateTrigger"),
                ("amazon", "EC2StateSensorTrigger"),
            ):
                calls, seconds = measure(emu, ids, impl, args.interval)
                print(f"| {n:>17} | {label:<31} | {calls:>17} | {seconds:>25.2f} |", flush=True)
            ec2.terminate_instances(InstanceIds=ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())

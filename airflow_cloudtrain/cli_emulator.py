"""``cloudtrain emulator status``: what the emulated clouds run now, asked over the wire.

The emulator runs in another process (``cloudtrain up``, ``make airflow`` or ``cloudtrain emulator``),
so this asks it the way any client would: EC2 ``DescribeInstances`` in each emulated region and
Compute Engine's ``instances.aggregatedList``, at the endpoints of its env file (``--env-file``, else
the environment a sourced env file set, else ``.airflow_home/emulator.env`` when it exists). Only
instances of ours (the ``cloudtrain-managed`` tag or label) that are pending or running are listed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_ENV_FILE = Path(".airflow_home") / "emulator.env"


def read_env_file(path: Path) -> dict[str, str]:
    """The ``export KEY=VALUE`` lines of an env file that ``write_env_file`` wrote."""
    env = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = shlex.split(line)[1].partition("=")
            env[key] = value
    return env


def _endpoints(args: argparse.Namespace) -> dict[str, str] | None:
    path = Path(args.env_file) if args.env_file else None
    if path is None and "AWS_ENDPOINT_URL" not in os.environ and DEFAULT_ENV_FILE.exists():
        path = DEFAULT_ENV_FILE
    if path is not None:
        if not path.exists():
            return None
        return read_env_file(path)
    return dict(os.environ) if "AWS_ENDPOINT_URL" in os.environ else None


def _aws(env: dict[str, str]) -> list[dict[str, Any]]:
    import boto3

    from airflow_cloudtrain.contract.runs import TAG_MANAGED
    from airflow_cloudtrain.emulator import AWS_REGIONS

    filters = [
        {"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    out = []
    for region in AWS_REGIONS:
        ec2 = boto3.client(
            "ec2",
            region_name=region,
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID", "testing"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY", "testing"),
        )
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for raw in (i for r in page["Reservations"] for i in r["Instances"]):
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                out.append(
                    {
                        "cloud": "aws",
                        "id": raw["InstanceId"],
                        "type": raw["InstanceType"],
                        "zone": raw["Placement"].get("AvailabilityZone"),
                        "state": raw["State"]["Name"],
                        "spot": raw.get("InstanceLifecycle") == "spot",
                        "name": tags.get("Name", ""),
                    }
                )
    return out


def _gce(env: dict[str, str]) -> list[dict[str, Any]]:
    from airflow_cloudtrain.contract.runs import TAG_MANAGED

    conn = json.loads(env.get("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT") or "{}")
    extra = conn.get("extra") or {}
    endpoint, project = extra.get("compute_endpoint"), extra.get("project")
    if not endpoint or not project:
        return []
    url = f"{endpoint}/compute/v1/projects/{project}/aggregated/instances"
    with urllib.request.urlopen(url, timeout=30) as resp:
        doc = json.loads(resp.read())
    out = []
    for scope in (doc.get("items") or {}).values():
        for vm in scope.get("instances") or []:
            if (vm.get("labels") or {}).get(TAG_MANAGED) != "true":
                continue
            if vm.get("status") not in ("PROVISIONING", "STAGING", "RUNNING"):
                continue
            scheduling = vm.get("scheduling") or {}
            out.append(
                {
                    "cloud": "gcp",
                    "id": vm["name"],
                    "type": str(vm.get("machineType", "")).rsplit("/", 1)[-1],
                    "zone": str(vm.get("zone", "")).rsplit("/", 1)[-1],
                    "state": vm.get("status", "").lower(),
                    "spot": scheduling.get("provisioningModel") == "SPOT"
                    or bool(scheduling.get("preemptible")),
                    "name": "",
                }
            )
    return out


def status(args: argparse.Namespace) -> int:
    """Print one line per running instance of ours in the emulated clouds (or ``no instance``)."""
    env = _endpoints(args)
    if env is None:
        where = args.env_file or "the environment"
        print(
            f"cloudtrain emulator status: no emulator endpoints in {where}: give --env-file PATH (what "
            f"`cloudtrain emulator --env-file` or `make airflow` wrote, e.g. {DEFAULT_ENV_FILE}) or source it",
            file=sys.stderr,
        )
        return 2
    instances = _aws(env) + _gce(env)
    if args.json:
        print(json.dumps(instances, indent=2))
        return 0
    if not instances:
        print("no instance running in the emulated clouds")
        return 0
    print(f"{'cloud':<6}{'instance':<22}{'type':<16}{'zone':<16}{'state':<10}market")
    for i in instances:
        market = "spot" if i["spot"] else "on-demand"
        print(f"{i['cloud']:<6}{i['id']:<22}{i['type']:<16}{i['zone']:<16}{i['state']:<10}{market}")
    return 0

"""Each emulated instance has its own private address, and instances reach each other on it over TCP.

Two instances per cloud boot our agent (from the bootstrap, as any launch does). Their jobs ask the
instance metadata service for the private address (IMDS ``local-ipv4``; GCE
``network-interfaces/0/ip``): one listens on it, the other connects from its own. The describe calls
(DescribeInstances ``PrivateIpAddress`` and ``NetworkInterfaces``; instances.get/list ``networkIP``)
report the same addresses, different for the two instances.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from google.cloud import compute_v1
from waiting import wait_for

from airflow_cloudtrain.contract import runs
from airflow_cloudtrain.contract.bootstrap import render_user_data
from airflow_cloudtrain.emulator import DEFAULT_BUCKET, GCP_PROJECT
from airflow_cloudtrain.emulator.aws.images import an_image
from airflow_cloudtrain.emulator.gcp.gce import compute_client_kwargs
from airflow_cloudtrain.storage import open_run_folder

ZONE = "us-central1-a"
MANAGED = {"cloudtrain-managed": "true"}

# The job: its address from the metadata service, then either side of one TCP exchange. The meeting
# point (where the server listens) is a file in a folder both "machines" see: this host's.
JOB = r"""
import json, os, socket, sys, time, urllib.request
role, meet = sys.argv[1], sys.argv[2]
if os.environ.get("GCE_METADATA_HOST"):
    req = urllib.request.Request("http://" + os.environ["GCE_METADATA_HOST"]
        + "/computeMetadata/v1/instance/network-interfaces/0/ip", headers={"Metadata-Flavor": "Google"})
else:
    base = os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"]
    put = urllib.request.Request(base + "/latest/api/token", method="PUT", data=b"",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    token = urllib.request.urlopen(put).read().decode()
    req = urllib.request.Request(base + "/latest/meta-data/local-ipv4",
        headers={"X-aws-ec2-metadata-token": token})
ip = urllib.request.urlopen(req).read().decode().strip()
if role == "server":
    srv = socket.create_server((ip, 0))
    tmp = meet + ".tmp"
    open(tmp, "w").write(json.dumps(srv.getsockname()))
    os.replace(tmp, meet)
    srv.settimeout(120)
    conn, peer = srv.accept()
    got = conn.recv(100).decode()
    conn.sendall(("hello from " + ip).encode())
    conn.close()
    result = {"ip": ip, "peer": peer[0], "got": got}
else:
    deadline = time.time() + 120
    while not os.path.exists(meet) and time.time() < deadline:
        time.sleep(0.1)
    host, port = json.loads(open(meet).read())
    conn = socket.create_connection((host, port), timeout=60, source_address=(ip, 0))
    conn.sendall(("hi from " + ip).encode())
    result = {"ip": ip, "server": host, "reply": conn.recv(100).decode()}
open(meet + "." + role, "w").write(json.dumps(result))
"""


def run_folder(scheme: str, command: str) -> str:
    uri = f"{scheme}://{DEFAULT_BUCKET}/gang-addresses/{uuid.uuid4().hex[:10]}"
    spec = runs.RunSpec(
        run_id="ct-addr",
        run_uri=uri,
        cloud="ec2" if scheme == "s3" else "gcloud",
        command=command,
        log_interval_s=0.2,
        heartbeat_interval_s=0.5,
        metadata_poll_s=0.5,
    )
    open_run_folder(uri).put_text(runs.SPEC_KEY, spec.to_json())
    return uri


def ec2_launch(uri: str) -> tuple[str, dict[str, Any]]:
    ec2 = boto3.client("ec2")
    image = an_image(ec2)
    tags = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in MANAGED.items()]}]
    raw = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        UserData=render_user_data(uri, "ec2"),
        TagSpecifications=tags,
    )["Instances"][0]
    return raw["InstanceId"], raw


def gce_launch(compute: compute_v1.InstancesClient, uri: str) -> str:
    name = f"vm-{uuid.uuid4().hex[:8]}"
    body = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/n1-standard-2",
        labels=MANAGED,
        disks=[
            {
                "boot": True,
                "auto_delete": True,
                "initialize_params": {"source_image": "projects/debian-cloud/global/images/family/debian-12"},
            }
        ],
        network_interfaces=[{"network": "global/networks/default"}],
        metadata={"items": [{"key": "startup-script", "value": render_user_data(uri, "gcloud")}]},
        scheduling={"automatic_restart": False, "on_host_maintenance": "TERMINATE"},
    )
    compute.insert(project=GCP_PROJECT, zone=ZONE, instance_resource=body).result(timeout=120)
    return name


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_instances_have_their_own_addresses_and_talk_over_tcp(emu: Any, tmp_path: Path, cloud: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    meet = tmp_path / "meet.json"
    scheme = "s3" if cloud == "aws" else "gs"
    uris = {
        role: run_folder(scheme, f"exec {sys.executable} {script} {role} {meet}")
        for role in ("server", "client")
    }
    reported: dict[str, str] = {}
    ids: dict[str, str] = {}
    if cloud == "aws":
        ec2 = boto3.client("ec2")
        for role, uri in uris.items():
            ids[role], raw = ec2_launch(uri)
            assert raw["PrivateIpAddress"] == raw["NetworkInterfaces"][0]["PrivateIpAddress"]
        described = {
            i["InstanceId"]: i
            for r in ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
            for i in r["Instances"]
        }
        for role, iid in ids.items():
            inst = described[iid]
            assert inst["NetworkInterfaces"][0]["PrivateIpAddress"] == inst["PrivateIpAddress"]
            reported[role] = inst["PrivateIpAddress"]
    else:
        compute = compute_v1.InstancesClient(**compute_client_kwargs(emu.gce_endpoint))
        for role, uri in uris.items():
            ids[role] = gce_launch(compute, uri)
        listed = {i.name: i for i in compute.list(project=GCP_PROJECT, zone=ZONE)}
        for role, name in ids.items():
            got = compute.get(project=GCP_PROJECT, zone=ZONE, instance=name)
            assert listed[name].network_interfaces[0].network_i_p == got.network_interfaces[0].network_i_p
            reported[role] = got.network_interfaces[0].network_i_p
    assert reported["server"] != reported["client"]
    assert all(ip.startswith("127.") and not ip.startswith("127.0.") for ip in reported.values()), reported

    def finished(role: str) -> dict[str, Any] | None:
        path = Path(f"{meet}.{role}")
        return json.loads(path.read_text()) if path.exists() else None

    server = wait_for(lambda: finished("server"), timeout=120, message="the server job's exchange")
    client = wait_for(lambda: finished("client"), timeout=60, message="the client job's exchange")
    # each job was served its own address, the one the describe calls report
    assert server["ip"] == reported["server"] and client["ip"] == reported["client"]
    assert client["server"] == reported["server"]
    assert server["peer"] == reported["client"]  # the connection came from the client's address
    assert server["got"] == f"hi from {reported['client']}"
    assert client["reply"] == f"hello from {reported['server']}"

    def succeeded(role: str) -> bool:
        text = open_run_folder(uris[role]).get_text(runs.status_key(ids[role]))
        return bool(text) and runs.RunStatus.from_json(text or "").state == runs.SUCCEEDED

    for role in ids:
        wait_for(lambda r=role: succeeded(r), timeout=60, message=f"the {role} agent's final status")
    if cloud == "gcp":  # powered off (TERMINATED) VMs stay until deleted
        for name in ids.values():
            compute.delete(project=GCP_PROJECT, zone=ZONE, instance=name).result(timeout=120)

"""Emulated clouds on loopback: the embedded default for tests, the demo, and your own DAGs.

    from airflow_cloudtrain.emulator import Emulator

    with Emulator() as emu:
        emu.aws_endpoint                  # "http://127.0.0.1:PORT" (moto's server)
        emu.gce_endpoint, emu.gcs_endpoint          # Compute Engine v1 REST subset, GCS JSON API
        emu.running_instances()           # [{"cloud", "id", "instance_type", "zone", "spot"}]
        emu.interrupt(instance_id, notice_s=5)      # EC2 spot notice / GCE preemption, then reclaimed
        emu.fail_capacity("g5.xlarge", zone=None)   # InsufficientInstanceCapacity (EC2) or
        emu.fail_capacity("n1-standard-4", zone="us-central1-a")  # ZONE_RESOURCE_POOL_EXHAUSTED (GCE)

Inside the block ``AWS_ENDPOINT_URL``, test credentials, ``STORAGE_EMULATOR_HOST`` and the
``aws_default`` / ``google_cloud_default`` connections point at the emulator, so plain boto3, the
Google clients and DAGs work unchanged; the product code makes exactly the calls it makes in
production. Each launched instance gets the real agent as a local process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from airflow_cloudtrain.emulator.runner import InstanceRunner, Seen

DEFAULT_BUCKET = "cloudtrain-emulated"
GCP_PROJECT = "cloudtrain-emulated"
AWS_REGIONS = ("us-east-1", "us-west-2", "eu-west-1")


class Emulator:
    """moto server + instance metadata server + a local agent per launched instance."""

    def __init__(self, region: str = "us-east-1", buckets: tuple[str, ...] = (DEFAULT_BUCKET,),
                 workdir: str | Path | None = None) -> None:  # fmt: skip
        self.region = region
        self.buckets = buckets
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="cloudtrain-emulator-"))
        self.aws_endpoint = ""
        self.gce_endpoint = ""
        self.gcs_endpoint = ""
        self._gce_zones: dict[str, str] = {}
        self._saved_env: dict[str, str | None] = {}
        self._regions: dict[str, str] = {}
        self._timers: list[threading.Timer] = []

    # --- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Emulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        import boto3
        from botocore.config import Config

        from airflow_cloudtrain.emulator.aws import EMULATOR_USER_AGENT, MotoServer, seed_public_parameters
        from airflow_cloudtrain.emulator.gce import GceServer
        from airflow_cloudtrain.emulator.gcs import GcsServer
        from airflow_cloudtrain.emulator.metadata import MetadataServer

        self.moto = MotoServer()
        self.aws_endpoint = self.moto.start()
        self.gce = GceServer(project=GCP_PROJECT)
        self.gce_endpoint = self.gce.start()
        self.gcs = GcsServer()
        self.gcs_endpoint = self.gcs.start()
        self.metadata = MetadataServer()
        self.metadata.start()
        self._set_env(self.env())
        session = boto3.session.Session(region_name=self.region)
        config = Config(user_agent_extra=EMULATOR_USER_AGENT, retries={"max_attempts": 1})
        self._ec2 = {r: session.client("ec2", region_name=r, config=config) for r in AWS_REGIONS}
        s3 = session.client("s3", config=config)
        for bucket in self.buckets:
            s3.create_bucket(Bucket=bucket)
            self.gcs.create_bucket(bucket)
        for region in AWS_REGIONS:
            self._ec2[region].describe_regions()  # makes moto load the region's backends
            seed_public_parameters(region)
        self.runner = InstanceRunner(self._alive, self._powered_off, self.workdir, self._image_env())
        self.runner.start()

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if hasattr(self, "runner"):
            self.runner.stop()
        if hasattr(self, "metadata"):
            self.metadata.stop()
        if hasattr(self, "moto"):
            self.moto.stop()
        if hasattr(self, "gce"):
            self.gce.stop()
        if hasattr(self, "gcs"):
            self.gcs.stop()
        self._restore_env()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def env(self) -> dict[str, str]:
        """The environment that points AWS clients and Airflow's aws_default at the emulator."""
        conn = {
            "conn_type": "aws",
            "login": "testing",
            "password": "testing",
            "extra": {"region_name": self.region, "endpoint_url": self.aws_endpoint},
        }
        gcp = {
            "conn_type": "google_cloud_platform",
            # no Cloud Billing emulation: the emulator answers 404 there and runs keep the snapshot prices
            "extra": {"project": GCP_PROJECT, "compute_endpoint": self.gce_endpoint,
                      "storage_endpoint": self.gcs_endpoint, "billing_endpoint": self.gce_endpoint,
                      "credentials": "anonymous"},
        }  # fmt: skip
        return {
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            "GOOGLE_CLOUD_PROJECT": GCP_PROJECT,
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(gcp),
            "AWS_ENDPOINT_URL": self.aws_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn),
        }

    def _image_env(self) -> dict[str, str]:
        """The emulated machine image: this environment's Python (with boto3 and google-cloud-storage,
        as the clouds' deep-learning images have) is the login shell's python3, set in its profile."""
        home = self.workdir / "image-home"
        home.mkdir(parents=True, exist_ok=True)
        bindir = os.path.dirname(sys.executable)
        (home / ".bash_profile").write_text(f'export PATH="{bindir}:$PATH"\n')
        return {
            **os.environ,
            "HOME": str(home),
            "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        }

    def _set_env(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    # --- what the instances' side sees ---------------------------------------------------------

    def _aws_alive(self) -> list[dict[str, Any]]:
        from airflow_cloudtrain.runs import TAG_MANAGED

        out = []
        filters = [{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]},
                   {"Name": "instance-state-name", "Values": ["pending", "running"]}]  # fmt: skip
        for region, ec2 in self._ec2.items():
            for reservation in ec2.describe_instances(Filters=filters)["Reservations"]:
                for raw in reservation["Instances"]:
                    out.append({**raw, "_region": region})
        return out

    def _alive(self) -> list[Seen]:
        from airflow_cloudtrain.runs import TAG_RUN_URI

        seen = []
        for raw in self._aws_alive():
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            iid = raw["InstanceId"]
            if not tags.get(TAG_RUN_URI):
                continue  # no run folder to run: nothing for an agent to do (tests drive such instances)
            self._regions[iid] = raw["_region"]
            env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.metadata.endpoint_for(iid),
                   "AWS_DEFAULT_REGION": raw["_region"]}  # fmt: skip
            seen.append(Seen("aws", iid, tags.get(TAG_RUN_URI, ""), raw["InstanceType"],
                             raw["Placement"].get("AvailabilityZone"), raw.get("InstanceLifecycle") == "spot", env))  # fmt: skip
        for inst in self._gce_alive():
            run_uri = inst["metadata"].get(TAG_RUN_URI)
            if not run_uri:
                continue
            self._gce_zones[inst["name"]] = inst["zone"]
            env = {"GCE_METADATA_HOST": self.metadata.gce_host_for(inst["name"]),
                   "STORAGE_EMULATOR_HOST": self.gcs_endpoint}  # fmt: skip
            seen.append(
                Seen("gcp", inst["name"], run_uri, inst["machine_type"], inst["zone"], inst["spot"], env)
            )
        return seen

    def _gce_alive(self) -> list[dict[str, Any]]:
        from airflow_cloudtrain.runs import TAG_MANAGED

        return [i for i in self.gce.alive() if i["labels"].get(TAG_MANAGED) == "true"]

    def _powered_off(self, seen: Seen) -> None:
        from airflow_cloudtrain.emulator.aws import end_instance

        if seen.cloud == "gcp":
            with contextlib.suppress(KeyError):  # already deleted by the operator: nothing to power off
                self.gce.shutdown(self._gce_zones[seen.id], seen.id)
            return
        end_instance(self._regions[seen.id], seen.id, "Client.InstanceInitiatedShutdown",
                     "Client.InstanceInitiatedShutdown: Instance initiated shutdown")  # fmt: skip

    # --- the public testing API ----------------------------------------------------------------

    def running_instances(self) -> list[dict[str, Any]]:
        """Every live (pending or running) instance of ours, in every emulated cloud."""
        return [
            {"cloud": "aws", "id": raw["InstanceId"], "instance_type": raw["InstanceType"],
             "zone": raw["Placement"].get("AvailabilityZone"), "spot": raw.get("InstanceLifecycle") == "spot"}
            for raw in self._aws_alive()
        ] + [
            {"cloud": "gcp", "id": i["name"], "instance_type": i["machine_type"], "zone": i["zone"], "spot": i["spot"]}
            for i in self._gce_alive()
            if i.get("status") != "TERMINATED"
        ]  # fmt: skip

    def interrupt(self, instance_id: str, notice_s: float = 5.0) -> None:
        """A spot interruption (EC2) or preemption (GCE): the notice appears in the instance's metadata,
        then, ``notice_s`` later, the cloud takes the instance."""
        if instance_id in self._gce_zones:
            self.metadata.set_preempted(instance_id)
        else:
            self.metadata.set_spot_action(instance_id, "terminate", at=time.time() + notice_s)
        timer = threading.Timer(notice_s, self._reclaim, args=(instance_id,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _reclaim(self, instance_id: str) -> None:
        from airflow_cloudtrain.emulator.aws import end_instance

        self.runner.kill_agent(instance_id)
        if instance_id in self._gce_zones:
            with contextlib.suppress(KeyError):  # gone before the notice ran out
                self.gce.preempt(self._gce_zones[instance_id], instance_id)
            return
        region = self._regions.get(instance_id, self.region)
        end_instance(region, instance_id, "Server.SpotInstanceTermination", "Spot instance termination")

    def crash_agent(self, instance_id: str) -> None:
        """The agent dies (killed, out of memory) and the machine keeps running: nobody powers it off."""
        self.runner.kill_agent(instance_id)

    def fail_capacity(self, instance_type: str, zone: str | None = None) -> None:
        """From now on launches of this type (in this zone, or anywhere) find no capacity."""
        if "." not in instance_type:  # GCE machine types have no dot: n1-standard-4, custom-8-32768
            self.gce.fail_capacity(instance_type, zone)
            return
        with self.moto.middleware.lock:
            self.moto.middleware.capacity_faults.add((instance_type, zone))

    def clear_faults(self) -> None:
        self.gce.clear_faults()
        with self.moto.middleware.lock:
            self.moto.middleware.capacity_faults.clear()

    def request_counts(self) -> dict[str, int]:
        """API requests per action made by anyone but the emulator itself, since start or reset."""
        with self.moto.middleware.lock:
            return {**dict(self.moto.middleware.counts), **self.gce.counts()}

    def reset_counts(self) -> None:
        self.gce.reset_counts()
        with self.moto.middleware.lock:
            self.moto.middleware.counts.clear()

    def agent_log(self, instance_id: str) -> str:
        path = self.workdir / "instances" / instance_id / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_until_idle(self, timeout: float = 30.0) -> bool:
        """True once no agent is running (every instance has powered off or been terminated)."""
        return self.runner.wait_idle(timeout)


def serve_forever() -> int:
    """``cloudtrain emulator``: run until Ctrl-C and print how to point Airflow at it."""
    with Emulator() as emu:
        print("Emulated clouds are up. In the shell that runs Airflow, export:")
        for key, value in emu.env().items():
            print(f"export {key}='{value}'")
        print(f"Bucket: s3://{DEFAULT_BUCKET}   (Ctrl-C to stop)")
        try:
            while True:
                time.sleep(5)
                for inst in emu.running_instances():
                    print(f"running: {inst}")
        except KeyboardInterrupt:
            return 0
    return 0


__all__ = ["Emulator", "DEFAULT_BUCKET", "serve_forever"]

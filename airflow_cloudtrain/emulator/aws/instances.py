"""The AWS half of what the instances' side sees: which EC2 instances boot our agent, what the
machines do by themselves (power off at their hard stop), and what Auto Scaling does with group
members before they are looked at (``groups``).

An instance runs an agent when its user data is our bootstrap (``emulator.userdata``), whatever its
tags. The user data is read with ``DescribeInstanceAttribute userData`` (the emulator's own client:
neither counted nor throttled), once per instance since it never changes. Which instances are live is
read from moto's backend in process, as the hypervisor knows it: this poll runs every 0.3 s, and moto
takes seconds to render a DescribeInstances of 1,000 instances (benchmarks launch that many), so an
instance without any user data is not asked about either.

The bootstrap's ``CT_HARD_STOP_S`` is played as the real machine plays it: ``hard_stop_s`` after launch
(``LaunchTime``, whole seconds) the instance shuts itself down (terminated with
``Client.InstanceInitiatedShutdown``), whether or not its agent lives.

Each instance has its own private address on the loopback range (``emulator.addresses``), which
DescribeInstances reports and IMDS ``local-ipv4`` serves to its agent.
"""

from __future__ import annotations

import base64
import calendar
import logging
import time
from typing import Any

from botocore.exceptions import ClientError

from airflow_cloudtrain.contract.botocore_logs import quiet_botocore
from airflow_cloudtrain.emulator import addresses, calls
from airflow_cloudtrain.emulator.aws import groups
from airflow_cloudtrain.emulator.aws.backend import SHUTDOWN, SPOT_TERMINATION, ec2_backend, end_instance
from airflow_cloudtrain.emulator.faults import EMULATOR_USER_AGENT
from airflow_cloudtrain.emulator.metadata import MetadataServer
from airflow_cloudtrain.emulator.runner import Seen
from airflow_cloudtrain.emulator.userdata import Bootstrap, parse_bootstrap

log = logging.getLogger(__name__)


class AwsInstances:
    def __init__(self, metadata: MetadataServer, regions: tuple[str, ...], default_region: str) -> None:
        import boto3
        from botocore.config import Config

        from airflow_cloudtrain.storage import share_service_models

        config = Config(user_agent_extra=EMULATOR_USER_AGENT, retries={"max_attempts": 1})
        with quiet_botocore():  # the emulator's own clients: no "Found endpoint ..." lines in the test's log
            # on the process's parsed service models: a test worker starts an emulator per session
            session = share_service_models(boto3.session.Session(region_name=default_region))
            self.ec2 = {r: session.client("ec2", region_name=r, config=config) for r in regions}
        addresses.patch_moto()  # each instance its own loopback address (``emulator.addresses``)
        self.metadata = metadata
        self.default_region = default_region
        self.regions: dict[str, str] = {}  # instance id -> region
        self._boot: dict[str, Bootstrap | None] = {}  # instance id -> its bootstrap (None: not ours)

    def _live(self) -> list[tuple[str, Any]]:
        """(region, moto instance) for every pending or running instance (moto copies its reservation
        table under the GIL, so this is safe while requests mutate it)."""
        out = []
        for region in self.ec2:
            for reservation in ec2_backend(region).all_reservations():
                for inst in list(reservation.instances):
                    if inst.state in ("pending", "running"):
                        self.regions[inst.id] = region
                        out.append((region, inst))
        return out

    def managed(self) -> list[dict[str, Any]]:
        """Live instances of ours (``cloudtrain-managed=true``), as ``Emulator.running_instances`` lists them.

        Read from moto's backend in process, as ``_live`` is, not with DescribeInstances: tests poll this
        every 0.1-0.3 s while they wait (and after every test), and each DescribeInstances over HTTP
        in three regions cost the waiting process tens of milliseconds of CPU per look."""
        from airflow_cloudtrain.contract.runs import TAG_MANAGED

        out = []
        for region, inst in self._live():
            tags = ec2_backend(region).tags.get(inst.id, {})
            if tags.get(TAG_MANAGED) != "true":
                continue
            out.append(
                {
                    "cloud": "aws",
                    "id": inst.id,
                    "instance_type": inst.instance_type,
                    "zone": inst.availability_zone,
                    "spot": inst.lifecycle == "spot",
                    "group": tags.get(groups.GROUP_TAG),
                }
            )
        return out

    def bootstrap(self, instance_id: str, region: str) -> Bootstrap | None:
        """The instance's bootstrap settings, None when its user data is not our bootstrap."""
        if instance_id not in self._boot:
            try:
                attr = self.ec2[region].describe_instance_attribute(
                    InstanceId=instance_id, Attribute="userData"
                )
            except ClientError:  # gone since it was listed: ask again next time, if it is still listed
                return None
            value = (attr.get("UserData") or {}).get("Value")
            self._boot[instance_id] = parse_bootstrap(base64.b64decode(value) if value else None)
        return self._boot[instance_id]

    def seen(self, hard_stop_scale: float = 1.0) -> list[Seen]:
        """Instances whose agent should run now; ends those whose hard stop has come. Auto Scaling
        groups are played first (``groups``), so a member is spot or replaced before it is seen."""
        try:
            groups.reconcile(list(self.ec2))
        except Exception:  # the single instances' side must go on whatever a group hits
            log.exception("emulator: Auto Scaling reconcile failed")
        out = []
        for region, inst in self._live():
            if not inst.user_data:
                self._boot.setdefault(inst.id, None)  # nothing given to boot with: nothing to ask
            boot = self.bootstrap(inst.id, region)
            if boot is None:
                continue  # not our bootstrap: nothing would start an agent there
            launched = calendar.timegm(inst.launch_time.utctimetuple())  # LaunchTime, whole seconds, UTC
            if boot.hard_stop_s and time.time() >= launched + boot.hard_stop_s * hard_stop_scale:
                end_instance(region, inst.id, *SHUTDOWN)  # the runner kills the agent: the machine is gone
                continue
            self.metadata.set_address(inst.id, inst.private_ip)  # IMDS local-ipv4
            env = {
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.metadata.endpoint_for(inst.id),
                "AWS_DEFAULT_REGION": region,
                # the instance profile's keys, which tell its calls from the Airflow side's (``calls``)
                "AWS_ACCESS_KEY_ID": calls.INSTANCE_ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": "testing",
            }
            out.append(
                Seen(
                    "aws",
                    inst.id,
                    boot.run_uri,
                    inst.instance_type,
                    inst.availability_zone,
                    inst.lifecycle == "spot",
                    env,
                )
            )
        return out

    def power_off(self, instance_id: str) -> None:
        """The guest shut down (the agent's last act): EC2 terminates it (shutdown behavior terminate)."""
        end_instance(self.region_of(instance_id), instance_id, *SHUTDOWN)

    def notice(self, instance_id: str, notice_s: float) -> None:
        self.metadata.set_spot_action(instance_id, "terminate", at=time.time() + notice_s)

    def reclaim(self, instance_id: str) -> None:
        end_instance(self.region_of(instance_id), instance_id, *SPOT_TERMINATION)

    def region_of(self, instance_id: str) -> str:
        if instance_id not in self.regions:
            self._live()
        return self.regions.get(instance_id, self.default_region)

"""The provider-neutral cloud interface: launch, find, describe many at once, terminate, run folders.

Operators, sensors and triggers speak only this interface; ``aws`` and ``gcp`` implement it.
Records are plain dataclasses so they cross into triggers and XCom as JSON.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_cloudtrain.catalog.offers import Offer

# Normalised instance states (EC2's vocabulary; GCE statuses are mapped onto it).
PENDING, RUNNING, STOPPING, STOPPED = "pending", "running", "stopping", "stopped"
SHUTTING_DOWN, TERMINATED = "shutting-down", "terminated"
STATES = (PENDING, RUNNING, STOPPING, STOPPED, SHUTTING_DOWN, TERMINATED)
ENDED_STATES = frozenset({SHUTTING_DOWN, TERMINATED})
ALIVE_STATES = frozenset({PENDING, RUNNING})


@dataclass
class LaunchRequest:
    """Everything one launch needs; built by the operator, interpreted by the cloud module."""

    offer: Offer
    zone: str | None
    user_data: str
    tags: dict[str, str]
    client_token: str
    disk_gib: int
    max_price: float | None = None  # spot bid in USD/h (EC2 only)
    image_id: str | None = None
    key_name: str | None = None
    subnet_id: str | None = None
    security_group_ids: list[str] = field(default_factory=list)
    iam_instance_profile: str | None = None
    volume_id: str | None = None
    service_account: str | None = None
    provisioning: str | None = None  # GCE: "spot" or "preemptible"
    hard_stop_s: int | None = None  # the cloud ends the instance this long after start, agent or not
    network: str | None = None  # GCE: a network path (None: the default network)
    subnetwork: str | None = None  # GCE: a subnetwork name (in the launch's region) or path
    external_ip: bool = True  # GCE: a public IP (an ONE_TO_ONE_NAT access config)
    placement_group: str | None = None  # EC2: a gang's cluster placement group (by name)
    resource_policies: list[str] = field(default_factory=list)  # GCE: a gang's compact placement policy


@dataclass
class Instance:
    """One instance as the cloud reports it, normalised."""

    id: str
    state: str
    instance_type: str
    zone: str | None
    spot: bool
    launch_time: float | None = None
    state_reason: str = ""
    preempted: bool = False  # the cloud itself says it took the instance back
    tags: dict[str, str] = field(default_factory=dict)
    missing: bool = False  # the cloud does not know this id (never existed, or long gone)
    private_ip: str | None = None  # the address a gang's other nodes reach it on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ended(instance: Instance | None) -> bool:
    """The instance is gone, terminated or stopped (its agent powered it off)."""
    return instance is None or instance.state in ENDED_STATES or instance.state == STOPPED


class Cloud(ABC):
    """One cloud account in one region (or project and zone set)."""

    name: str  # "aws" or "gcp"
    region: str

    @abstractmethod
    def launch(self, request: LaunchRequest) -> Instance:
        """Start one instance. Raises CapacityUnavailable / QuotaExceeded / InvalidRequest."""

    @abstractmethod
    def find(self, run_key_digest: str, ended: bool = False) -> list[Instance]:
        """Instances carrying this run key: alive ones (adoption), or with ``ended`` also those that
        ended but still exist (teardown: a powered-off GCE VM still needs deleting; a terminated EC2
        instance is gone and never returned)."""

    @abstractmethod
    def find_run(self, run_id: str) -> list[Instance]:
        """Every instance (ended ones too, while the cloud still lists them) of a run's short id."""

    @abstractmethod
    def describe(self, ids: list[str]) -> dict[str, Instance]:
        """Current state of many instances in as few calls as the API allows; ids the cloud no longer
        knows come back as terminated."""

    @abstractmethod
    def terminate(self, ids: list[str]) -> None:
        """Terminate (delete) instances; idempotent."""

    @abstractmethod
    def attach_volume(self, instance_id: str, volume_id: str) -> str:
        """Attach an existing volume; returns the device name the instance sees."""

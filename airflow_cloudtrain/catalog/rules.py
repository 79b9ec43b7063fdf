"""The catalog rules of each provider, looked up by cloud name: ``rules("gcspot")`` is ``catalog.gce``.

Machine shapes, zone names and GPU attachment differ between EC2 and GCE; each provider's module
(``catalog.ec2``, ``catalog.gce``) implements ``ShapeRules`` and the parse-time checks and
``choose_offer`` call it, so no code outside those two modules asks which provider it has.
"""

from __future__ import annotations

from typing import Any, Protocol

import airflow_cloudtrain.catalog.ec2 as ec2
import airflow_cloudtrain.catalog.gce as gce
from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.catalog.snapshot import Row
from airflow_cloudtrain.contract.clouds import provider_of


class ShapeRules(Protocol):
    """What ``catalog.ec2`` and ``catalog.gce`` both define (module-level functions and names)."""

    TYPE_HINT: str

    def is_type_name(self, value: str) -> bool: ...
    def family_of(self, instance_type: str) -> str: ...
    def custom_shape_of(self, value: str) -> Any: ...
    def check_custom_shape(self, value: str) -> bool: ...
    def custom_shape_has(
        self, instance_type: str, gpus: int, gpu_type: str | None
    ) -> dict[str, Any] | None: ...
    def predefined_offers(self, rows: tuple[Row, ...], cloud: str) -> list[Offer]: ...
    def custom_offers(
        self,
        rows: tuple[Row, ...],
        cloud: str,
        cpus: int,
        ram_mib: int | None,
        gpus: int,
        gpu_type: str | None,
    ) -> list[Offer]: ...
    def zone_region(self, zone: str) -> str: ...
    def zone_in_region(self, zone: str, region: str, zones: tuple[str, ...]) -> bool: ...
    def zone_names(self, region: str, zones: tuple[str, ...]) -> list[str]: ...
    def offer_in_zone(self, offer_zones: tuple[str, ...], zone: str) -> bool: ...
    def type_gpus(
        self, instance_type: str, row: Row, gpus: int, gpu_type: str | None
    ) -> tuple[str | None, int]: ...
    def nothing_fits_note(self) -> str: ...


RULES: dict[str, ShapeRules] = {"aws": ec2, "gcp": gce}


def rules(cloud: str) -> ShapeRules:
    """The catalog rules of the provider that serves ``cloud``."""
    return RULES[provider_of(cloud)]


PLACEMENTS = (None, "cluster")
# EC2 cluster placement groups take current-generation types except burstable ones (T*), Mac and the
# "flex" types, and of the previous generation only A1, C3, C4, I2, M4, R3 and R4 (EC2 User Guide,
# "Placement group rules and limitations", cluster placement groups:
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-groups-limitations-cluster.html).
_EC2_NO_CLUSTER_OLD = frozenset({"m1", "m2", "m3", "c1", "cc1", "cc2", "cg1", "cr1", "g2", "hi1", "hs1"})
# GCE compact placement policies: the compute-optimized, accelerator-optimized and N2/N2D series
# ("Placement policies overview", compact placement policies:
# https://cloud.google.com/compute/docs/instances/define-instance-placement).
_GCE_COMPACT_SERIES = frozenset(
    {"a2", "a3", "a4", "c2", "c2d", "c3", "c3d", "c4", "c4d", "g2", "g4", "h3", "n2", "n2d", "z3"}
)


def check_placement(placement: object, cloud: str, instance_type: str | None = None) -> str | None:
    """``placement`` of a gang, checked at parse time: None, or ``"cluster"`` (an EC2 cluster placement
    group; a GCE compact placement policy) on an instance type whose family can use it (a type the
    catalog picks later is checked then). Raises ValueError naming the field and what is accepted."""
    if placement is not None and placement != "cluster":
        raise ValueError(
            f"placement={placement!r} is not a placement; use None (the cloud places the nodes) or "
            '"cluster" (nodes close together: an EC2 cluster placement group, a GCE compact placement policy)'
        )
    if placement is None or not instance_type:
        return placement
    if provider_of(cloud) == "aws":
        family = ec2.family_of(instance_type)
        if family.startswith(("t", "mac")) or family.endswith("-flex") or family in _EC2_NO_CLUSTER_OLD:
            raise ValueError(
                f'placement="cluster" cannot be used with instance_type={instance_type!r}: EC2 cluster '
                "placement groups take current-generation types except burstable (T*), Mac and flex types "
                "(e.g. c5n, p4d, g5, m6i); use one of those or placement=None"
            )
        return placement
    series = instance_type.split("-", 1)[0].lower()
    if series not in _GCE_COMPACT_SERIES:
        raise ValueError(
            f'placement="cluster" cannot be used with instance_type={instance_type!r}: GCE compact '
            f"placement policies take the {', '.join(s.upper() for s in sorted(_GCE_COMPACT_SERIES))} "
            "series; use one of those or placement=None"
        )
    return placement

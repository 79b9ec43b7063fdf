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

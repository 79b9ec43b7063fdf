"""EC2's Spot placement scores, which moto lacks: GetSpotPlacementScores, answered in the middleware
(``server``) as EC2 answers it with ``SingleAvailabilityZone=true``: one score (1-10) per zone of each
asked region, by zone id (``use1-az1``), for the instance types and target capacity asked.

What EC2 checks and our code must cope with: ``TargetCapacity`` (1-2,000,000) is required, and so is
exactly one of ``InstanceTypes`` and ``InstanceRequirementsWithMetadata`` (``InvalidParameterValue``,
``MissingParameter``); an account the action is not allowed to answers ``UnauthorizedOperation``
(``Emulator.deny_spot_placement_scores``). The scores themselves are what ``Emulator.set_spot_placement_score``
set for a zone (the type's own, else the zone's); a zone nobody set scores ``DEFAULT_SCORE``, so a
run that asks sees every zone alike unless a test or a user of ``cloudtrain up`` says otherwise.
"""

from __future__ import annotations

import threading
from xml.sax.saxutils import escape

from airflow_cloudtrain.emulator.aws import wire
from airflow_cloudtrain.emulator.aws.backend import ec2_backend

OPERATION = "GetSpotPlacementScores"
DEFAULT_SCORE = 5


class SpotPlacementScores:
    """The scores the emulator answers with, per (instance type or None, zone name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scores: dict[tuple[str | None, str], int] = {}
        self.denied = False

    def set(self, zone: str, score: int, instance_type: str | None = None) -> None:
        if not 1 <= int(score) <= 10:
            raise ValueError(f"a Spot placement score is 1-10; got {score!r}")
        with self._lock:
            self._scores[(instance_type, zone)] = int(score)

    def clear(self) -> None:
        with self._lock:
            self._scores.clear()
            self.denied = False

    def score(self, zone: str, instance_types: list[str]) -> int:
        """A zone's score for a request of ``instance_types``: the lowest of the types' own scores
        there (each must be placed), else the zone's, else ``DEFAULT_SCORE``."""
        with self._lock:
            own = [self._scores[(t, zone)] for t in instance_types if (t, zone) in self._scores]
            return min(own) if own else self._scores.get((None, zone), DEFAULT_SCORE)

    def answer(self, region: str, form: dict[str, list[str]]) -> wire.Reply:
        if self.denied:
            return wire.ec2_error(
                "UnauthorizedOperation", "You are not authorized to perform this operation.", "403 Forbidden"
            )
        types = wire.query_list(form, "InstanceType")
        if "InstanceRequirementsWithMetadata.ArchitectureType.1" in form and types:
            return wire.ec2_error(
                "InvalidParameterValue", "Specify InstanceTypes or InstanceRequirements, not both."
            )
        if not types:
            return wire.ec2_error("MissingParameter", "The request must contain the parameter InstanceTypes.")
        capacity = (form.get("TargetCapacity") or [""])[0]
        if not capacity.isdigit() or not 1 <= int(capacity) <= 2_000_000:
            return wire.ec2_error(
                "InvalidParameterValue", f"Invalid TargetCapacity: {capacity or '(missing)'}"
            )
        regions = wire.query_list(form, "RegionName") or [region]
        items = []
        for name in regions:
            for zone in ec2_backend(name).describe_availability_zones():
                score = self.score(zone.name, types)
                items.append(
                    f"<item><region>{escape(name)}</region><availabilityZoneId>{escape(zone.zone_id)}"
                    f"</availabilityZoneId><score>{score}</score></item>"
                )
        return wire.ec2_ok(
            "GetSpotPlacementScoresResponse",
            f"<spotPlacementScoreSet>{''.join(items)}</spotPlacementScoreSet>",
        )

"""EC2's Spot placement score per zone: how likely a spot request for this type and this many
instances is to succeed there now (1-10), for ranking the zones a spot launch tries
(``policy.zones.rank_zones``).

One GetSpotPlacementScores call per ranking, ``SingleAvailabilityZone=true``, for the run's region;
EC2 answers by zone id (``use1-az1``), which DescribeAvailabilityZones turns into the names the run's
``zones`` use (ids map to different names in different accounts). Best effort: a role without
``ec2:GetSpotPlacementScores``, an account EC2 gives no scores to, throttling or anything else
returns None and the ranking goes on without scores; the caller stops asking after a refusal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REFUSED = ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "OptInRequired")
"""Error codes that say this role or account gets no scores: not asked again for the run."""


class ScoresRefused(Exception):
    """GetSpotPlacementScores was refused for this role or account (``REFUSED``)."""


def spot_placement_scores(
    ec2: Any, instance_type: str, nodes: int, zones: Sequence[str], region: str
) -> dict[str, int]:
    """``{zone name: score}`` for the ``zones`` EC2 scored, for ``nodes`` instances of
    ``instance_type`` in one zone. ScoresRefused when the role or account may not ask; any other
    error propagates (the caller treats it as no scores this time)."""
    from botocore.exceptions import ClientError

    try:
        answer = ec2.get_spot_placement_scores(
            InstanceTypes=[instance_type],
            TargetCapacity=max(1, int(nodes)),
            SingleAvailabilityZone=True,
            RegionNames=[region],
        )
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in REFUSED:
            raise ScoresRefused(str(err)) from err
        raise
    by_id = {
        str(s["AvailabilityZoneId"]): int(s["Score"])
        for s in answer.get("SpotPlacementScores", [])
        if s.get("AvailabilityZoneId") and s.get("Score") is not None
    }
    if not by_id:
        return {}
    found = ec2.describe_availability_zones(ZoneNames=list(zones))["AvailabilityZones"]
    return {str(z["ZoneName"]): by_id[z["ZoneId"]] for z in found if z.get("ZoneId") in by_id}

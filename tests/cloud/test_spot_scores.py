"""EC2's Spot placement scores as the product reads them (``clouds.aws.spot_scores``), from the
emulated EC2's GetSpotPlacementScores (``emulator.aws.spot_scores``): by zone name, for the asked type
and gang size, and a refusal the caller can tell from a failure."""

from __future__ import annotations

import boto3
import pytest

from airflow_cloudtrain.clouds.aws.backend import AwsRunBackend
from airflow_cloudtrain.clouds.aws.spot_scores import ScoresRefused, spot_placement_scores

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]


def test_scores_come_by_zone_name_for_the_asked_type(emu) -> None:
    emu.set_spot_placement_score("us-east-1a", 3)
    emu.set_spot_placement_score("us-east-1b", 8, instance_type="t3.medium")
    emu.set_spot_placement_score("us-east-1b", 2, instance_type="g5.xlarge")
    ec2 = boto3.client("ec2", region_name="us-east-1")
    # EC2 answers by zone id; the names are this account's (moto maps us-east-1a to use1-az6)
    raw = ec2.get_spot_placement_scores(
        InstanceTypes=["t3.medium"], TargetCapacity=1, SingleAvailabilityZone=True
    )
    assert {s["AvailabilityZoneId"] for s in raw["SpotPlacementScores"]} >= {"use1-az6", "use1-az1"}
    assert spot_placement_scores(ec2, "t3.medium", 1, ZONES, "us-east-1") == {
        "us-east-1a": 3,
        "us-east-1b": 8,
        "us-east-1c": 5,  # nobody set it: the emulator's default
    }
    assert spot_placement_scores(ec2, "g5.xlarge", 4, ZONES[:2], "us-east-1") == {
        "us-east-1a": 3,
        "us-east-1b": 2,
    }


def test_a_refusal_is_told_apart_and_the_backend_stops_asking(emu) -> None:
    emu.deny_spot_placement_scores()
    ec2 = boto3.client("ec2", region_name="us-east-1")
    with pytest.raises(ScoresRefused, match="UnauthorizedOperation"):
        spot_placement_scores(ec2, "t3.medium", 1, ZONES, "us-east-1")
    backend = AwsRunBackend(None, "us-east-1")
    emu.reset_counts()
    assert backend.spot_placement_scores("t3.medium", 1, ZONES, None) is None
    assert backend.spot_placement_scores("t3.medium", 1, ZONES, None) is None
    assert emu.request_counts().get("GetSpotPlacementScores") == 1  # asked once, then not again
    emu.deny_spot_placement_scores(False)
    assert AwsRunBackend(None, "us-east-1").spot_placement_scores("t3.medium", 2, ZONES[:1], None) == {
        "us-east-1a": 5.0
    }

"""Root volume prices: what a run's boot disk costs per GB-month, by provider and region.

The instance catalog (``catalog/data``, from SkyPilot's public catalog) prices machines only, so these
few list prices are kept here, with their source, read 2026-11-27:

- AWS: EBS gp3 storage (the volume type ``clouds.aws.ec2`` asks for), from the EBS pricing page
  (https://aws.amazon.com/ebs/pricing/): $0.08 per GB-month in us-east-1 and us-west-2, $0.088 in
  eu-west-1.
- GCP: standard persistent disk (what a Compute Engine boot disk is when no disk type is given, as
  ``clouds.gcp.gce`` does), from the disk pricing page
  (https://cloud.google.com/compute/disks-image-pricing): $0.04 per GB-month in us-central1, us-east1
  and us-west1, $0.044 in europe-west4.

A region not listed is priced at its provider's first price here (the list prices differ by 10 % at most).
"""

from __future__ import annotations

USD_PER_GB_MONTH: dict[str, dict[str, float]] = {
    "aws": {"us-east-1": 0.08, "us-west-2": 0.08, "eu-west-1": 0.088},
    "gcp": {"us-central1": 0.04, "us-east1": 0.04, "us-west1": 0.04, "europe-west4": 0.044},
}


def root_volume_price(provider: str, region: str | None) -> float | None:
    """USD per GB-month of the root volume in ``region`` (None for a provider with no prices here)."""
    prices = USD_PER_GB_MONTH.get(provider)
    if not prices:
        return None
    return prices.get(region or "", next(iter(prices.values())))

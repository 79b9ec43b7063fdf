"""Launching with failover: walk the ranked offers until one has capacity, within a budget.

Pure policy over the cloud interface: it never parses error strings, it reacts to our error
vocabulary (CapacityUnavailable, QuotaExceeded) and lets every other error through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.contract.errors import CapacityUnavailable, QuotaExceeded
from airflow_cloudtrain.core.cloud import Instance, LaunchRequest

log = logging.getLogger(__name__)


class LaunchFailed(RuntimeError):
    """Every offer tried had no capacity (or quota); the message lists what was tried."""

    def __init__(self, tried: list[tuple[str, str, str]]) -> None:
        self.tried = tried
        listing = "; ".join(f"{itype} in {where}: {code}" for itype, where, code in tried)
        super().__init__(f"no capacity for any of {len(tried)} offers tried: {listing}")


def launch_with_failover(
    launch: Callable[[LaunchRequest], Instance],
    offers: Sequence[Offer],
    build: Callable[[Offer, str | None, int], LaunchRequest],
    zones_for: Callable[[Offer], Sequence[str | None]],
    max_attempts: int = 6,
    logger: logging.Logger | None = None,
) -> tuple[Instance, Offer, list[tuple[str, str, str]]]:
    """Try offers in order (each in the zones ``zones_for`` gives); return the first launch.

    ``build(offer, zone, attempt)`` makes the request (client token and bid differ per offer);
    ``launch`` sends it (the attempt wraps the cloud's launch in its ledger).
    """
    logger = logger or log
    tried: list[tuple[str, str, str]] = []
    for offer in offers:
        for zone in zones_for(offer):
            if len(tried) >= max_attempts:
                raise LaunchFailed(tried)
            try:
                instance = launch(build(offer, zone, len(tried)))
            except (CapacityUnavailable, QuotaExceeded) as err:
                where = zone or offer.region
                tried.append((offer.instance_type, where, err.code or type(err).__name__))
                logger.warning(
                    "No capacity for %s in %s (%s); trying the next offer",
                    offer.instance_type,
                    where,
                    err.code or type(err).__name__,
                )
                continue
            return instance, offer, tried
    raise LaunchFailed(tried)


def launch_gang_with_failover(
    launch: Callable[[LaunchRequest], Instance],
    release: Callable[[list[Instance]], None],
    offers: Sequence[Offer],
    build: Callable[[Offer, str | None, int, int], LaunchRequest],
    zones_for: Callable[[Offer], Sequence[str | None]],
    num_nodes: int,
    max_attempts: int = 6,
    logger: logging.Logger | None = None,
) -> tuple[list[Instance], Offer, list[tuple[str, str, str]]]:
    """``num_nodes`` instances of one offer in one zone, all or nothing: node by node, and on a
    capacity or quota answer at node k the k nodes already running are ``release``d (the caller
    waits until they are ending) and the gang moves to the next zone/offer as one unit.

    ``build(offer, zone, attempt, rank)`` makes node ``rank``'s request of gang attempt ``attempt``
    (each with its own client token). Nodes after the first go to the first node's zone: where the
    cloud picks the zone (EC2 without ``zone=``), the gang still ends up in one. Any other error
    propagates with the nodes in the caller's ledger, which releases them."""
    logger = logger or log
    tried: list[tuple[str, str, str]] = []
    for offer in offers:
        for zone in zones_for(offer):
            if len(tried) >= max_attempts:
                raise LaunchFailed(tried)
            got: list[Instance] = []
            try:
                for rank in range(num_nodes):
                    node_zone = zone or (got[0].zone if got else None)
                    got.append(launch(build(offer, node_zone, len(tried), rank)))
            except (CapacityUnavailable, QuotaExceeded) as err:
                where = zone or (got[0].zone if got else None) or offer.region
                code = err.code or type(err).__name__
                why = f"{code} at node {len(got) + 1} of {num_nodes}"
                tried.append((offer.instance_type, where, why))
                logger.warning(
                    "No capacity for %d x %s in %s (%s); releasing the %d node(s) launched and trying "
                    "the next zone or offer",
                    num_nodes,
                    offer.instance_type,
                    where,
                    why,
                    len(got),
                )
                if got:
                    release(got)
                continue
            return got, offer, tried
    raise LaunchFailed(tried)

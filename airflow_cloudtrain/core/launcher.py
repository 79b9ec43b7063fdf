"""Launching with failover: walk the ranked offers until one has capacity, within a budget.

Pure policy over the cloud interface: it never parses error strings, it reacts to our error
vocabulary (CapacityUnavailable, QuotaExceeded) and lets every other error through.
"""

from __future__ import annotations

import functools
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


# A gang's create calls in flight at once: every node's call goes out together (on GCE each waits for
# its insert operation, seconds on a real cloud), up to this many (num_nodes is at most 64)
MAX_PARALLEL_LAUNCHES = 16


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
    """``num_nodes`` instances of one offer in one zone, all or nothing: the nodes' create calls at
    once (``launch_nodes``), and on a capacity or quota answer for any of them the nodes launched are
    ``release``d (the caller waits until they are ending) and the gang moves to the next zone/offer
    as one unit.

    ``build(offer, zone, attempt, rank)`` makes node ``rank``'s request of gang attempt ``attempt``
    (each with its own client token). Where the cloud picks the zone (EC2 without ``zone=``), the
    first node goes alone and the others to its zone, so the gang still ends up in one. Any other
    error propagates with the nodes in the caller's ledger, which releases them."""
    logger = logger or log
    tried: list[tuple[str, str, str]] = []
    for offer in offers:
        for zone in zones_for(offer):
            if len(tried) >= max_attempts:
                raise LaunchFailed(tried)
            request = functools.partial(_node_request, build, offer, len(tried))
            got, err = launch_nodes(launch, request, zone, num_nodes)
            if err is None:
                return got, offer, tried
            where = zone or (got[0].zone if got else None) or offer.region
            code = err.code or type(err).__name__
            why = f"{code} at node {len(got) + 1} of {num_nodes}"  # node k: k - 1 launched before it
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
    raise LaunchFailed(tried)


def _node_request(
    build: Callable[[Offer, str | None, int, int], LaunchRequest],
    offer: Offer,
    attempt: int,
    zone: str | None,
    rank: int,
) -> LaunchRequest:
    return build(offer, zone, attempt, rank)


def launch_nodes(
    launch: Callable[[LaunchRequest], Instance],
    request: Callable[[str | None, int], LaunchRequest],
    zone: str | None,
    num_nodes: int,
) -> tuple[list[Instance], CapacityUnavailable | QuotaExceeded | None]:
    """One gang attempt's nodes, their create calls in flight together (threads: a gang's start
    should cost one launch, not N in turn), each request built here first. Returns the nodes
    launched, in rank order, and the capacity or quota answer of the lowest rank that got one (None:
    every node launched). Any other error is raised once every call has returned, so the caller's
    ledger holds every node that was made."""
    from concurrent.futures import ThreadPoolExecutor

    got: dict[int, Instance] = {}
    ranks = list(range(num_nodes))
    if zone is None and num_nodes:  # the cloud picks the first node's zone; the others follow it
        try:
            got[0] = launch(request(None, 0))
        except (CapacityUnavailable, QuotaExceeded) as err:
            return [], err
        zone, ranks = got[0].zone, ranks[1:]
    errors: dict[int, BaseException] = {}
    if ranks:
        requests = {rank: request(zone, rank) for rank in ranks}
        with ThreadPoolExecutor(min(len(ranks), MAX_PARALLEL_LAUNCHES), "gang-launch") as pool:
            futures = {rank: pool.submit(launch, req) for rank, req in requests.items()}
            for rank, future in futures.items():
                try:
                    got[rank] = future.result()
                except BaseException as err:  # every call returns before anything is decided
                    errors[rank] = err
    nodes = [got[rank] for rank in sorted(got)]
    for rank in sorted(errors):
        if not isinstance(errors[rank], (CapacityUnavailable, QuotaExceeded)):
            raise errors[rank]
    capacity = [e for _, e in sorted(errors.items()) if isinstance(e, (CapacityUnavailable, QuotaExceeded))]
    return nodes, capacity[0] if capacity else None

"""Choosing an offer: filter the catalog on the request, then sort by price. Pure functions.

The studio tool picked "the cheapest instance with higher specs than required, or throw an
exception for too extravagant of a request"; ``rank_offers`` keeps every fitting offer in price
order so a launch can fail over to the next one when a type has no capacity.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from functools import lru_cache

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.catalog.rules import rules
from airflow_cloudtrain.catalog.snapshot import Row
from airflow_cloudtrain.contract.clouds import CLOUDS
from airflow_cloudtrain.spec import SPOT_CLOUDS, Bid, Hardware, parse_cloud


class NoOfferError(ValueError):
    """No offer meets the request; the message says why and what the largest offers are."""


@lru_cache(maxsize=16)
def base_offers(cloud: str, rows: tuple[Row, ...]) -> tuple[Offer, ...]:
    """The request-independent offers of ``cloud``, cheapest first (unpriced ones dropped)."""
    offers = rules(cloud).predefined_offers(rows, cloud)
    priced = [o for o in offers if o.hourly is not None]
    return tuple(sorted(priced, key=_sort_key))


def _sort_key(o: Offer) -> tuple[float, float, float, str, str]:
    return (o.hourly or 0.0, o.vcpus, o.memory_gib, o.instance_type, o.region)


def zone_region(cloud: str, zone: str) -> str:
    """Region of a zone name: ``us-east-1a`` -> ``us-east-1``, ``us-central1-a`` -> ``us-central1``."""
    return rules(cloud).zone_region(zone)


def _excluded(o: Offer, exclude: frozenset[str]) -> bool:
    return o.instance_type in exclude or f"{o.instance_type}@{o.region}" in exclude


def _zone_ok(o: Offer, zone: str | None) -> bool:
    # how a zone is told apart is the provider's rule (AWS snapshot zones are zone *ids*)
    if zone is None or not o.zones:
        return True
    return rules(o.cloud).offer_in_zone(o.zones, zone)


def _fits(o: Offer, hw: Hardware) -> bool:
    if o.vcpus < hw.cpus or o.gpus < hw.gpus:
        return False
    if hw.ram_mib is not None and o.memory_gib * 1024 < hw.ram_mib:
        return False
    return not (hw.gpu_type and (o.gpu_type or "").upper() != hw.gpu_type)


def rank_offers(
    cloud: str,
    hardware: Hardware,
    region: str | None = None,
    zone: str | None = None,
    bid: Bid | str | float | None = None,
    exclude: Iterable[str] = (),
    rows: tuple[Row, ...] | None = None,
) -> list[Offer]:
    """Every offer that meets ``hardware`` (and the bid, region and zone), cheapest first.

    ``exclude`` holds instance types (or ``type@region``) to leave out, e.g. after a capacity error.
    ``rows`` defaults to the current catalog (snapshot plus any fresher live refresh).
    Raises ``NoOfferError`` when nothing fits, naming the largest offers.
    """
    cloud = parse_cloud(cloud)
    if not isinstance(hardware, Hardware):
        raise TypeError(f"hardware must be a Hardware record, got {type(hardware).__name__}")
    if bid is not None and not isinstance(bid, Bid):
        bid = Bid(bid)
    if rows is None:
        from airflow_cloudtrain.catalog.live import current_rows

        rows = current_rows(CLOUDS[cloud])
    if zone and not region:
        region = zone_region(cloud, zone)
    if bid is not None and cloud == "gcspot":
        _warn_bid_on_gcspot(bid)
        bid = None
    if bid is not None and cloud not in SPOT_CLOUDS:
        bid = None  # an on-demand run has no bid: forms often send one anyway (validated, then unused)
    skip = frozenset(str(x) for x in exclude)

    candidates: Iterable[Offer] = base_offers(cloud, rows)
    custom = rules(cloud).custom_offers(
        rows, cloud, hardware.cpus, hardware.ram_mib, hardware.gpus, hardware.gpu_type
    )
    if custom:
        candidates = sorted([*candidates, *(o for o in custom if o.hourly is not None)], key=_sort_key)

    fitting = [
        o
        for o in candidates
        if _fits(o, hardware)
        and (region is None or o.region == region)
        and _zone_ok(o, zone)
        and not _excluded(o, skip)
    ]
    if bid is not None:
        within = [o for o in fitting if _within_bid(o, bid)]
        if fitting and not within:
            cheapest = next((o for o in fitting if o.price is not None or bid.usd is not None), fitting[0])
            means = (
                f"bid means ${bid.max_price(cheapest.price):g}/h there"
                if cheapest.price
                else "no on-demand price"
            )
            raise NoOfferError(
                f"no {cloud} offer for {hardware} has a spot price within bid={bid}: the cheapest fitting "
                f"offer {cheapest.describe()} costs ${cheapest.spot_price:g}/h on spot ({means})"
            )
        fitting = within
    if not fitting:
        raise NoOfferError(_nothing_fits(cloud, hardware, region, zone, rows))
    return fitting


def _within_bid(o: Offer, bid: Bid) -> bool:
    """A percentage bid cannot be priced on an offer with no published on-demand price: skip it."""
    if bid.percent is not None and o.price is None:
        return False
    return (o.spot_price or 0) <= bid.max_price(o.price) + 1e-9


def choose_offer(
    cloud: str,
    hardware: Hardware,
    region: str | None = None,
    zone: str | None = None,
    bid: Bid | str | float | None = None,
    exclude: Iterable[str] = (),
    rows: tuple[Row, ...] | None = None,
) -> Offer:
    """The cheapest offer that meets every requirement (spot price on spot clouds)."""
    return rank_offers(cloud, hardware, region, zone, bid, exclude, rows)[0]


_warned_gcspot_bid = False


def gcspot_bid_message(raw: object) -> str:
    """Why a bid on ``gcspot`` is ignored (the warning's text; operators also log it in the task log)."""
    return (
        f"bid={raw!r} has no effect on cloud='gcspot': GCE Spot VMs have no bid. Google sets the "
        "Spot price, and preempts a Spot VM when it needs the capacity back, never because of price. "
        "To cap the cost, ask for a cheaper machine (fewer cpus/gpus, or an instance_type), or use "
        "cloud='ec2spot', where the bid is the most you pay per hour."
    )


def _warn_bid_on_gcspot(bid: Bid) -> None:
    """GCE Spot VMs have no bid (Google sets the price); say once per process that it is ignored."""
    global _warned_gcspot_bid
    if not _warned_gcspot_bid:
        _warned_gcspot_bid = True
        warnings.warn(gcspot_bid_message(bid.raw), UserWarning, stacklevel=3)


def _largest(offers: list[Offer]) -> str:
    if not offers:
        return "none"
    picks = {
        "vCPUs": max(offers, key=lambda o: (o.vcpus, o.memory_gib)),
        "memory": max(offers, key=lambda o: (o.memory_gib, o.vcpus)),
        "GPUs": max(offers, key=lambda o: (o.gpus, o.memory_gib)),
    }
    return "; ".join(f"most {k}: {o.describe()}" for k, o in picks.items())


def _nothing_fits(
    cloud: str, hw: Hardware, region: str | None, zone: str | None, rows: tuple[Row, ...]
) -> str:
    pool = [o for o in base_offers(cloud, rows) if region is None or o.region == region]
    where = f" in {zone or region}" if (zone or region) else ""
    want = f"{hw.cpus} vCPUs, {hw.gpus} GPUs" + (f" ({hw.gpu_type})" if hw.gpu_type else "")
    want += f", {hw.ram_mib} MiB RAM" if hw.ram_mib else ""
    msg = f"no {cloud} offer{where} has at least {want}. Largest offers{where}: {_largest(pool)}"
    if hw.gpu_type and not any((o.gpu_type or "").upper() == hw.gpu_type for o in pool):
        known = sorted({o.gpu_type for o in pool if o.gpu_type})
        msg += f". gpu_type={hw.gpu_type!r} is not offered{where}; known: {', '.join(known)}"
    return msg + rules(cloud).nothing_fits_note()

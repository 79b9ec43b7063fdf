"""The instance catalog: offers (type, vCPUs, memory, GPUs, prices, zones) and ``choose_offer``.

Data is the shipped snapshot (``data/SOURCE.md`` says where it came from) plus, when a task runs,
live prices cached on disk (``catalog.live``). Selection is pure: filter, then sort by price.
"""

from airflow_cloudtrain.catalog.offers import Offer
from airflow_cloudtrain.catalog.select import NoOfferError, choose_offer, rank_offers
from airflow_cloudtrain.catalog.snapshot import SNAPSHOT_DATE, SNAPSHOT_SOURCE

__all__ = ["Offer", "NoOfferError", "choose_offer", "rank_offers", "SNAPSHOT_DATE", "SNAPSHOT_SOURCE"]

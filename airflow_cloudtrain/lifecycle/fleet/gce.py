"""The GCE fleet run: ``FleetRun``'s order and guarantees over Pub/Sub, an instance template and a MIG.

``FleetRun`` (``lifecycle.fleet``) keeps the order that makes a kill at any point safe (queues, run
folder, items with their marker, template, group) and the single teardown; this subclass makes the
GCP parts, each under the ledger and named from the run key so a retry re-attaches:

1. the dead-letter topic and its subscription (the watch pulls it to fail items whose workers
   vanished too often), 2. the items' topic and pull subscription (ack deadline = the lease,
   dead-letter policy), ... 4. the workers' firewall rule (deny all ingress to the run's network
   tag, ``clouds.gcp_firewall``) and the instance template (a single GCE run's secure shape, carrying
   that tag, Spot or preemptible), 5. a zonal managed instance group of ``num_workers`` in the
   cheapest offer's zone (or ``zone=``), which keeps that size and recreates preempted VMs until
   workers leave.
"""

from __future__ import annotations

from typing import Any

from airflow_cloudtrain.core.retry import call_with_retry
from airflow_cloudtrain.lifecycle.fleet.run import FleetRun


class GceFleetRun(FleetRun):
    provider = "gcp"

    def _queues(self) -> tuple[str, str, str | None]:
        digest = self.ctx.key.digest
        dead_name = self.names.queue_name(digest, dead_letter=True)
        dead_topic = self._ensure_topic(dead_name)
        self._ensure_subscription(dead_name, dead_topic, None)
        name = self.names.queue_name(digest)
        topic = self._ensure_topic(name)
        return self._ensure_subscription(name, topic, dead_topic), dead_topic, topic

    def _worker_extra(self, topic: str | None, offer: Any) -> dict[str, Any]:
        return {"topic": topic, "zone": self._zone(offer), "project": self.cloud.project}

    def _dead_letter_source(self, dead_letter: str) -> str:
        """The watch pulls the dead-letter topic's subscription (of the same name)."""
        return self.cloud.subscription_path(self.names.queue_name(self.ctx.key.digest, dead_letter=True))

    def _tags(self) -> dict[str, str]:
        return {**self.ctx.options.tags, **self.ctx.key.tags()}

    def _ensure_topic(self, name: str) -> str:
        cloud = self.cloud
        found = call_with_retry(lambda: cloud.topic(name))
        if found:
            self.ledger.add("pubsub_topic", found, None)
            return found
        self._check()
        entry = self.ledger.intend("pubsub_topic", None, token=name)
        path = call_with_retry(lambda: cloud.create_topic(name, self._tags()))
        self.ledger.created(entry, path)
        self.log.info("Created topic %s", path)
        return path

    def _ensure_subscription(self, name: str, topic: str, dead_topic: str | None) -> str:
        cloud, fleet = self.cloud, self.ctx.fleet
        found = call_with_retry(lambda: cloud.subscription(name))
        if found:
            self.ledger.add("pubsub_subscription", found, None)
            return found
        self._check()
        entry = self.ledger.intend("pubsub_subscription", None, token=name)
        path = call_with_retry(
            lambda: cloud.create_subscription(
                name, topic, self._tags(), fleet.lease_s, dead_topic, fleet.max_item_attempts
            )
        )
        self.ledger.created(entry, path)
        self.log.info("Created subscription %s", path)
        return path

    def _zone(self, offer: Any) -> str:
        """The group's zone: ``zone=``, else the first zone of the cheapest offer."""
        cloud = self.cloud
        if cloud.zone is None:
            zones = offer.zones
            cloud.zone = self.ctx.config.zone or (zones[0] if zones else f"{cloud.region}-a")
        return str(cloud.zone)

    def _ensure_template(self, request: Any) -> str:
        cloud, name, ctx = self.cloud, self.names.group_name(self.ctx.key.digest), self.ctx
        # the workers' firewall rule first (found on a retry): no member starts reachable from outside
        ctx.backend.protect_network(self.ledger, ctx.key.digest, ctx.options, self._check, self.log)
        found = call_with_retry(lambda: cloud.template(name))
        if found:
            self.ledger.add("instance_template", name, None)
            return found
        self._check()
        entry = self.ledger.intend("instance_template", None, token=name)
        link = call_with_retry(lambda: cloud.create_template(name, request))
        self.ledger.created(entry, name)
        self.log.info("Created instance template %s", name)
        return link

    def _ensure_group(
        self,
        template: str,
        types: list[str],
        spot: bool,
        max_price: float | None,
        desired: int,
        offers: list[Any],
    ) -> None:
        """A group of ``num_workers`` (fewer when fewer items wait): the constant size the studio
        tool's ``--num-workers`` asks for. ``bid`` has no effect on GCE (Spot VMs have no bid)."""
        cloud, name, zone = self.cloud, self.names.group_name(self.ctx.key.digest), self._zone(offers[0])
        if call_with_retry(lambda: cloud.group(name)) is not None:
            self.ledger.add("mig", name, zone)
            self.log.info("Re-attached to group %s", name)
            return
        self._check()
        entry = self.ledger.intend("mig", zone, token=name)
        call_with_retry(lambda: cloud.create_group(name, template, desired))
        self.ledger.created(entry, name, zone)
        self.log.info(
            "Created managed instance group %s in %s: %d %s worker(s) of %s",
            name,
            zone,
            desired,
            "Spot" if spot else "standard",
            types[0],
        )

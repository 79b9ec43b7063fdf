"""A gang (``num_nodes`` > 1): N instances of one offer in one zone running one job, launched, watched
and released as one.

``RunAttempt`` hands the gang's part here: before the first node, the run's gang network (EC2: a
security group that lets in only its own members, a cluster placement group with ``placement=
"cluster"``; GCE: a tag-to-tag allow rule and a compact placement policy), each through the ledger;
the run folder's ``nodes/`` cleared (the barrier's records of an earlier gang must not be read as this
one's). Then the nodes, one create call each through ``RunAttempt._create_instance`` (so every node
is in the ledger before its create call), the calls in flight together (``core.launcher.launch_nodes``:
on GCE each waits for its insert operation, so N calls in turn would cost N launches), all or nothing
(``core.launcher.launch_gang_with_failover``): a capacity answer for any node releases the nodes
launched and waits until they are ending before the next zone or offer is tried, so a gang never
holds two partial gangs' worth of machines. Once every id is
known, ``nodes/ranks.json`` tells each agent its rank (``contract.gang``); the agents meet at the
barrier and run the job with ``MASTER_ADDR`` and friends.

Why launch-then-release rather than EC2 Fleet ``instant`` with ``MinTargetCapacity``: one code path
for both clouds (GCE has no all-or-nothing insert for plain VMs), and every node is written to the
ledger before its create call, so a task killed between two nodes leaves nothing the teardown does not
know of. The price is a few seconds of the partial gang's machines, billed, on a failed zone.

The wait is ``core.waiting.GangWatch``: one describe call for every node per poll, the first node to
fail or vanish ends the gang, naming its rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_cloudtrain.contract.gang import NODES_PREFIX, RANKS_KEY, ranks_json
from airflow_cloudtrain.contract.runs import RunStatus, status_key
from airflow_cloudtrain.core.cloud import ALIVE_STATES, ended
from airflow_cloudtrain.core.retry import TransientBudget, call_with_retry

if TYPE_CHECKING:
    import logging

    from airflow_cloudtrain.catalog.offers import Offer
    from airflow_cloudtrain.core.backend import RunBackend
    from airflow_cloudtrain.core.cloud import Instance, LaunchRequest
    from airflow_cloudtrain.core.ledger import ResourceLedger
    from airflow_cloudtrain.core.records import LaunchRecord, Outcome
    from airflow_cloudtrain.core.waiting import GangWatch
    from airflow_cloudtrain.lifecycle.prepare import GangOptions
    from airflow_cloudtrain.storage import RunFolder

RELEASE_WAIT_S = 300.0  # a partial gang's nodes must be ending before the next zone/offer is tried


class Gang:
    """The gang's part of one attempt, over the attempt's backend, run folder and ledger."""

    def __init__(
        self,
        backend: RunBackend,
        folder: RunFolder,
        ledger: ResourceLedger,
        log: logging.Logger,
        options: GangOptions,
    ) -> None:
        self.backend = backend
        self.folder = folder
        self.ledger = ledger
        self.log = log
        self.options = options

    # --- launch ----------------------------------------------------------------------------------

    def prepare(self, digest: str, launch_options: Any, check: Callable[[], None]) -> dict[str, Any]:
        """The gang's network (through the ledger) and an empty ``nodes/``; returns what every node's
        ``LaunchRequest`` adds."""

        def clear() -> None:
            for key in self.folder.list(NODES_PREFIX):
                self.folder.delete_key(key)

        call_with_retry(clear)
        extra = self.backend.gang_network(
            self.ledger, digest, launch_options, self.options.placement, check, self.log
        )
        self.log.info(
            "Gang of %d nodes: network ready (%s)",
            self.options.num_nodes,
            ", ".join(f"{k}={v}" for k, v in sorted(extra.items()) if v) or "run's firewall rules",
        )
        return extra

    def usable(self, offers: Sequence[Offer], cloud: str) -> list[Offer]:
        """With ``placement="cluster"``, only offers whose family can use it (the catalog may rank a
        burstable type first; ``catalog.rules.check_placement``)."""
        if self.options.placement is None:
            return list(offers)
        from airflow_cloudtrain.catalog.rules import check_placement

        kept = []
        for offer in offers:
            try:
                check_placement(self.options.placement, cloud, offer.instance_type)
            except ValueError:
                continue
            kept.append(offer)
        if not kept:
            raise ValueError(
                f'placement="cluster": none of the {len(offers)} offers that fit can use a cluster placement '
                "(burstable, Mac and flex types cannot); ask for more cpus/ram, set instance_type, or use "
                "placement=None"
            )
        return kept

    def launch(
        self,
        create: Callable[[LaunchRequest], Instance],
        offers: Sequence[Offer],
        build: Callable[[Offer, str | None, int], LaunchRequest],
        zones_for: Callable[[Offer], Sequence[str | None]],
        max_attempts: int,
        extra: dict[str, Any],
    ) -> tuple[list[Instance], Offer, list[tuple[str, str, str]]]:
        """All N nodes of one offer in one zone, or a ``LaunchFailed`` listing what was tried."""
        from airflow_cloudtrain.core.launcher import launch_gang_with_failover

        n = self.options.num_nodes

        def node_request(offer: Offer, zone: str | None, attempt: int, rank: int) -> LaunchRequest:
            # a client token (and a GCE name) per node of each gang attempt
            return replace(build(offer, zone, attempt * n + rank), **extra)

        return launch_gang_with_failover(
            create, self.release_nodes, offers, node_request, zones_for, n, max_attempts, self.log
        )

    def release_nodes(self, instances: list[Instance]) -> None:
        """A partial gang's nodes, through the ledger; returns once none of them is alive any more."""
        ids = {i.id for i in instances}
        only = [r for r in self.ledger.of_kind("instance") if r.id in ids]
        budget = TransientBudget(budget_s=120.0)
        call_with_retry(lambda: self.ledger.release(self.backend, sweep=False, only=only), budget)
        self.log.info("Released the partial gang's node(s): %s", ", ".join(sorted(ids)))
        deadline = time.monotonic() + RELEASE_WAIT_S
        while time.monotonic() < deadline:
            states = call_with_retry(lambda: self.backend.cloud.describe(sorted(ids)))
            if all(s.state not in ALIVE_STATES for s in states.values()):
                return
            time.sleep(1.0)
        self.log.warning(
            "The partial gang's nodes %s were still ending after %.0f s", sorted(ids), RELEASE_WAIT_S
        )

    def node_records(self, instances: list[Instance]) -> list[dict[str, Any]]:
        """Per node, in rank order: rank, instance id, zone and private address (described again when
        the launch's answer did not carry the address yet)."""
        ips = {i.id: i.private_ip for i in instances}
        if not all(ips.values()):
            described = call_with_retry(lambda: self.backend.cloud.describe([i.id for i in instances]))
            ips = {iid: ip or described[iid].private_ip for iid, ip in ips.items()}
        return [
            {"rank": rank, "instance_id": i.id, "zone": i.zone, "private_ip": ips[i.id]}
            for rank, i in enumerate(instances)
        ]

    def publish_ranks(self, instances: list[Instance]) -> None:
        """``nodes/ranks.json``: the agents waiting at the barrier learn their ranks."""
        text = ranks_json([i.id for i in instances])
        call_with_retry(lambda: self.folder.put_text(RANKS_KEY, text))

    # --- wait ------------------------------------------------------------------------------------

    def wait(
        self,
        launch: LaunchRecord,
        watch: GangWatch,
        poll_interval: float,
        check: Callable[[], None],
        stopped: Callable[[], bool],
        heartbeat: Callable[[str], float | None],
        end_marker: Callable[[str], RunStatus | None] = lambda iid: None,
    ) -> Outcome:
        """Until the gang's one outcome, every followed node's log in the task log (``[rank N]``).
        ``end_marker``: a node's final status from the live index, read once it ended without one in
        the run folder (refused: an access denied), as the single run's wait does."""
        from airflow_cloudtrain.core.engine import poll_until
        from airflow_cloudtrain.core.logstream import LogFollower, render_line

        ids, folder, cloud = launch.node_ids, self.folder, self.backend.cloud
        followed = ids if self.options.log_nodes == "all" else ids[:1]
        followers = [(rank, LogFollower(iid)) for rank, iid in enumerate(followed)]

        def stream() -> None:
            for rank, follower in followers:
                for line in follower.poll(folder.list, folder.get_bytes):
                    self.log.info("[rank %d] %s", rank, render_line(line))

        def poll() -> Outcome | None:
            check()
            stream()
            raws = [folder.get_text(status_key(iid)) for iid in ids]
            statuses = [RunStatus.from_json(raw) if raw else None for raw in raws]
            beats = [
                heartbeat(iid) if watch.needs_heartbeat(rank, statuses[rank]) else None
                for rank, iid in enumerate(ids)
            ]
            described = cloud.describe(ids)  # one call for the whole gang
            nodes = [described.get(iid) for iid in ids]
            for n, (iid, node, status) in enumerate(zip(ids, nodes, statuses, strict=True)):
                if (status is None or not status.final) and ended(node):
                    statuses[n] = end_marker(iid) or status
            return watch.decide(statuses, nodes, beats)

        def transient(err: BaseException, delay: float) -> None:
            self.log.warning("Transient error while waiting (%s); polling again in %.0f s", err, delay)

        event = poll_until(poll, poll_interval, stopped=stopped, on_transient=transient)
        call_with_retry(stream)
        return event

"""The lease's decisions (issue 26): the agent's (``agent.lease``), a watcher's renewals
(``core.lease``) and the triggerer's batched ones (``triggers.leases``), over an in-memory folder."""

from __future__ import annotations

import threading
from typing import cast

import pytest

from airflow_cloudtrain.agent.lease import LeaseWatch
from airflow_cloudtrain.contract.lease import LEASE_KEY, ORPHANED_KEY, Lease, Orphaned, check_interval_s
from airflow_cloudtrain.core.lease import LeaseRenewer, read_orphaned
from airflow_cloudtrain.storage import RunFolder
from airflow_cloudtrain.triggers import leases

T0 = 1_800_000_000.0


class MemoryFolder:
    """The get/put calls of the lease code, in memory; ``fail`` makes every call raise."""

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}
        self.puts: list[str] = []
        self.fail = False
        self.lock = threading.Lock()

    def get_text(self, key: str) -> str | None:
        if self.fail:
            raise ConnectionError("store unreachable")
        return self.objects.get(key)

    def put_text(self, key: str, text: str) -> None:
        if self.fail:
            raise ConnectionError("store unreachable")
        with self.lock:
            self.objects[key] = text
            self.puts.append(key)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def watch(folder: MemoryFolder, timeout: float | None, clock: Clock) -> LeaseWatch:
    return LeaseWatch(cast(RunFolder, folder), timeout, started_at=T0, clock=clock)


def put_lease(folder: MemoryFolder, renewed_at: float, timeout: float | None = 600.0) -> None:
    folder.objects[LEASE_KEY] = Lease(renewed_at, timeout, "triggerer").to_json()


def test_a_renewed_lease_keeps_the_run_and_a_lapsed_one_ends_it() -> None:
    folder, clock = MemoryFolder(), Clock(T0 + 1000)
    agent = watch(folder, 600.0, clock)
    put_lease(folder, T0 + 500)
    assert agent.check() is None  # renewed 500 s ago, timeout 600 s
    clock.now = T0 + 1100
    message = agent.check()
    assert message is not None and message.startswith("orphaned: no watcher renewed the lease since ")
    assert "600 s" in message
    agent.record("agent")
    record = Orphaned.from_json(folder.objects[ORPHANED_KEY])
    assert (record.lapsed_at, record.ended_by, record.noticed_at) == (T0 + 1100, "agent", T0 + 1100)


def test_no_lease_at_all_counts_from_the_start() -> None:
    folder, clock = MemoryFolder(), Clock(T0 + 599)
    agent = watch(folder, 600.0, clock)
    assert agent.check() is None
    clock.now = T0 + 600
    assert "within orphan_timeout (600 s) of its start" in (agent.check() or "")


def test_a_read_error_or_a_torn_record_is_not_a_lapse() -> None:
    folder, clock = MemoryFolder(), Clock(T0 + 10_000)  # long past any timeout
    agent = watch(folder, 600.0, clock)
    folder.fail = True
    assert agent.check() is None and agent.read_error and "store unreachable" in agent.read_error
    folder.fail = False
    folder.objects[LEASE_KEY] = '{"renewed_at": '  # a torn write
    assert agent.check() is None
    put_lease(folder, T0)
    assert agent.check() is not None


def test_the_lease_s_own_timeout_wins_and_none_never_lapses() -> None:
    folder, clock = MemoryFolder(), Clock(T0 + 5000)
    put_lease(folder, T0, timeout=6000.0)  # a watcher renewing with a longer timeout
    assert watch(folder, 600.0, clock).check() is None
    put_lease(folder, T0, timeout=None)
    assert watch(folder, 600.0, clock).check() is None


def test_orphan_timeout_none_means_no_check_at_all() -> None:
    """``orphan_timeout=None``: the agent never ends the run for lack of a lease, reads nothing."""
    folder, clock = MemoryFolder(), Clock(T0 + 10**7)
    agent = watch(folder, None, clock)
    assert agent.interval_s is None
    folder.fail = True  # any read would raise
    assert agent.check() is None


@pytest.mark.parametrize(("timeout", "interval"), [(1800.0, 60.0), (6.0, 1.0), (600.0, 60.0), (120.0, 20.0)])
def test_the_agent_checks_six_times_per_timeout_at_most_every_minute(timeout: float, interval: float) -> None:
    assert check_interval_s(timeout) == interval


def test_a_watcher_renews_at_most_every_renew_interval_and_survives_errors() -> None:
    folder, clock = MemoryFolder(), Clock()
    renewer = LeaseRenewer(cast(RunFolder, folder), 1800.0, "worker", clock=clock)
    assert renewer.renew()  # the first poll writes
    for step in range(1, 300):  # a poll every second for 5 minutes less one
        clock.now = T0 + step
        assert not renewer.renew()
    clock.now = T0 + 300
    assert renewer.renew()
    assert folder.puts == [LEASE_KEY, LEASE_KEY]
    lease = Lease.from_json(folder.objects[LEASE_KEY])
    assert (lease.renewed_at, lease.orphan_timeout_s, lease.by) == (T0 + 300, 1800.0, "worker")
    folder.fail = True
    clock.now = T0 + 600
    assert not renewer.renew() and renewer.due()  # logged, retried at the next poll
    folder.fail = False
    assert renewer.renew()
    assert LeaseRenewer(cast(RunFolder, folder), None, "worker").renew(force=True) is False


def test_two_threads_renewing_at_once_never_land_an_older_lease_over_a_newer_one() -> None:
    """A wait's poll and another thread of the same watcher renew at the same moment; the store keeps
    whichever write finishes last. One renewal at a time: the second finds the lease just renewed."""
    entered, release = threading.Event(), threading.Event()

    class SlowFolder(MemoryFolder):
        def put_text(self, key: str, text: str) -> None:
            if not entered.is_set():  # the first write is held in the store until the second asks
                entered.set()
                release.wait(60)
            super().put_text(key, text)

    folder, clock = SlowFolder(), Clock()
    renewer = LeaseRenewer(cast(RunFolder, folder), 6.0, "worker", clock=clock)
    first = threading.Thread(target=renewer.renew)
    first.start()
    assert entered.wait(60)
    clock.now = T0 + 0.01  # the other thread's renewal, a moment later
    second_result: list[bool] = []
    second = threading.Thread(target=lambda: second_result.append(renewer.renew()))
    second.start()
    release.set()
    first.join()
    second.join()
    assert second_result == [False]  # it waited for the first, which had just renewed
    assert folder.puts == [LEASE_KEY]
    assert Lease.from_json(folder.objects[LEASE_KEY]).renewed_at == renewer.renewed_at == T0


def test_read_orphaned_says_what_the_agent_recorded() -> None:
    folder = MemoryFolder()
    assert read_orphaned(cast(RunFolder, folder)) is None
    folder.objects[ORPHANED_KEY] = Orphaned(T0, "agent", T0 + 1).to_json()
    assert read_orphaned(cast(RunFolder, folder)) == Orphaned(T0, "agent", T0 + 1)


def test_the_triggerer_renews_each_run_once_per_interval_in_one_batch() -> None:
    """1,000 deferred runs of one bucket: one write each on the first poll, none on the next ones
    until the renew interval (5 minutes at the default) passed."""
    written: list[str] = []
    book = leases.LeaseBook("s3", "bkt", lambda key, data: written.append(key))
    ids = [f"i-{n:04d}" for n in range(1000)]
    for n, iid in enumerate(ids):
        leases.LEASES[iid] = (f"s3://bkt/runs/d/t/r{n}/-1", 1800.0)
    leases.LEASES["i-elsewhere"] = ("s3://other-bucket/runs/x/-1", 1800.0)  # not this client's bucket
    try:
        book.start_round([*ids, "i-elsewhere"])
        book.wait_round()
        assert len(written) == 1000 and written[0] == "runs/d/t/r0/-1/lease.json"
        book.start_round(ids)
        book.wait_round()
        assert len(written) == 1000  # nothing due yet
        assert book.due(ids, book.renewed[ids[0]] + 300.0) != []  # due again after 5 minutes
        book.forget(ids[0])
        assert [d[0] for d in book.due(ids, book.renewed[ids[1]] + 1)] == [ids[0]]
    finally:
        for iid in [*ids, "i-elsewhere"]:
            leases.LEASES.pop(iid, None)
        book.close()

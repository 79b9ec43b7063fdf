"""One describe call per (connection, region) per poll for every instance watched in this process.

Each trigger that waits on instances registers its ids with the group for its (cloud, connection,
region); one poll task per group describes the union of ids (up to 1,000 per call) and wakes every
watcher with the fresh snapshot. A hundred runs waiting in one triggerer then cost one
DescribeInstances per poll interval instead of a hundred. The group's task stops with its last
watcher; cancellation of a watcher propagates normally. A group may own resources (its SDK client):
``close`` is called once when the group ends; its synchronous part runs at once (so a watcher
arriving next builds fresh ones) and the awaitable it returns, if any, after the poll task stopped.

A watcher is only ever handed a snapshot whose describe asked for all of its ids: one joining
while a describe for the older set of ids is in flight waits for the next poll, which starts early
for it (``interval / 4`` after the last one, not a whole interval). A watcher that judged "absent"
from a poll that never asked for its id would take a live resource for a deleted one.

Nothing here is about instances: the values are whatever ``describe`` answers per id, so queue
depths share the same way (one GetQueueAttributes per queue per poll, ``triggers.queue_depth``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable
from contextlib import aclosing
from typing import Any, Generic, TypeVar

V = TypeVar("V")  # what describe answers per id: an ``Instance``, a queue's depth, ...

Describe = Callable[[list[str]], Awaitable[dict[str, V]]]
Close = Callable[[], Awaitable[None] | None]


class Pool(Generic[V]):
    """Per-key resources (an SDK client, a listing's state) that live exactly as long as the poll
    group of that key: ``get`` builds one on first use (call it from the describe, so a group that
    ended and restarted gets a fresh one), ``close`` is the group's ``close``."""

    def __init__(self, make: Callable[[Hashable], V], finish: Callable[[V], Awaitable[None]]) -> None:
        self._make = make
        self._finish = finish
        self._items: dict[Hashable, V] = {}

    def get(self, key: Hashable) -> V:
        if key not in self._items:
            self._items[key] = self._make(key)
        return self._items[key]

    def peek(self, key: Hashable) -> V | None:
        return self._items.get(key)

    def closer(self, key: Hashable) -> Close:
        def close() -> Awaitable[None] | None:
            item = self._items.pop(key, None)  # at once: the next group of this key builds anew
            return self._finish(item) if item is not None else None

        return close

    def __len__(self) -> int:
        return len(self._items)


class _Group(Generic[V]):
    def __init__(
        self, describe: Describe[V], interval: float, close: Close | None = None, quiet: float | None = None
    ) -> None:
        self.describe = describe
        self.close = close
        self.interval = interval
        # None: every watcher is woken after every poll; else only a watcher one of whose values is
        # a new object (or the error changed), and every watcher at least each ``quiet`` seconds
        self.quiet = quiet
        self.watchers: dict[int, set[str]] = {}
        self.snapshot: dict[str, V] = {}
        self.error: BaseException | None = None
        # the ids the describe under way (or the last one) asked for, and those the published
        # snapshot's describe asked for: a watcher takes only a snapshot that asked for all its ids
        self.asking: frozenset[str] = frozenset()
        self.asked: frozenset[str] = frozenset()
        # set when a watcher joined whose ids the describe under way does not ask for: the next poll
        # then starts after the shortest rest, not a whole interval
        self.newcomer = asyncio.Event()
        self.generation = 0
        self.wakers: dict[int, asyncio.Future[None]] = {}  # token -> what its idle watcher awaits
        self.woken: dict[int, float] = {}  # token -> when it last took a snapshot
        self.task: asyncio.Task[None] | None = None
        # the describe under way: cancelling the loop does not stop a worker thread, so the group's
        # resources are closed only once it returned
        self.inflight: asyncio.Future[Any] | None = None

    async def loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.watchers:
            started = loop.time()
            self.newcomer.clear()  # this describe asks for every watcher's ids
            ids = sorted(set().union(*self.watchers.values()))
            self.asking = frozenset(ids)
            call = self.inflight = asyncio.ensure_future(self.describe(ids))
            call.add_done_callback(_retrieve)
            try:
                snapshot, error = await asyncio.shield(call), None
            except asyncio.CancelledError:
                raise
            except Exception as err:  # reported to every watcher, which decides to retry or fail
                snapshot, error = {}, err
            self.publish(snapshot, error, frozenset(ids), loop.time())
            await self.rest(started)

    async def rest(self, started: float) -> None:
        """A poll every interval, however long it took (at least a quarter interval's rest); a
        watcher waiting for its first snapshot cuts it short after that quarter interval."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.interval / 4)
        left = self.interval - (loop.time() - started)
        if left > 0 and not self.newcomer.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.newcomer.wait(), left)

    def covers(self, ids: set[str]) -> bool:
        """Did the published snapshot's describe ask for all of ``ids``?"""
        return ids <= self.asked

    def publish(
        self, snapshot: dict[str, V], error: BaseException | None, asked: frozenset[str], now: float
    ) -> None:
        before, had_error = self.snapshot, self.error
        self.snapshot, self.error, self.asked = snapshot, error, asked
        self.generation += 1
        for token, ids in self.watchers.items():
            waker = self.wakers.get(token)
            if waker is None or waker.done():
                continue  # busy: it takes the newest snapshot when it comes back
            if not ids <= asked:
                continue  # joined while this describe was under way: the next one asks for it
            if (
                self.quiet is None
                or error is not None
                or had_error is not None
                or token not in self.woken  # its first snapshot (the first that asked for it)
                or now - self.woken[token] >= self.quiet - 0.05
                or any(snapshot.get(i) is not before.get(i) for i in ids)
            ):
                waker.set_result(None)


INFLIGHT_WAIT_S = 60.0  # how long a closing group waits for its last describe (SDK timeouts are shorter)


def _retrieve(call: asyncio.Future[Any]) -> None:
    """A describe nobody awaits any more (its group was cancelled) must not warn about its error."""
    if not call.cancelled():
        call.exception()


_groups: dict[Hashable, _Group[Any]] = {}
_tokens = itertools.count()  # one per watcher; id() of a temporary would be reused at once


async def watch(
    key: Hashable,
    ids: list[str],
    describe: Describe[V],
    interval: float,
    close: Close | None = None,
    quiet: float | None = None,
) -> AsyncGenerator[dict[str, V], None]:
    """Yield ``{id: value}`` (an ``Instance``, a queue depth, ...) for ``ids`` after every shared
    poll of the group ``key``. ``describe`` and ``close`` of the watcher that starts a group serve
    the whole group. With ``quiet``, a poll after which none of this watcher's values is a new
    object is not yielded, unless ``quiet`` seconds passed since the last (a thousand watchers of a
    fast poll then cost nothing while nothing changes for them).

    Raises the describe error to this watcher when a poll failed.
    """
    found: _Group[V] | None = _groups.get(key)
    if found is None or found.task is None or found.task.done():
        found = _groups[key] = _Group(describe, interval, close, quiet)
    group = found
    group.interval = min(group.interval, interval)
    if quiet is None or group.quiet is None:
        group.quiet = None
    else:
        group.quiet = min(group.quiet, quiet)
    token = next(_tokens)
    wanted = group.watchers[token] = set(ids)
    if group.inflight is None or group.inflight.done() or not wanted <= group.asking:
        group.newcomer.set()  # no describe under way asks for it: the next one should start soon
    if group.task is None:
        group.task = asyncio.get_running_loop().create_task(group.loop())
    seen = group.generation
    loop = asyncio.get_running_loop()
    try:
        while True:
            # only a poll that started after this watcher joined (or asked for its ids anyway) is
            # its answer: one that did not ask for an id says nothing about it
            while group.generation == seen or not group.covers(wanted):
                seen = group.generation
                waker = group.wakers[token] = loop.create_future()
                try:
                    await waker
                finally:
                    group.wakers.pop(token, None)
            seen = group.generation
            group.woken[token] = loop.time()
            snapshot, error = group.snapshot, group.error
            if error is not None:
                raise error
            yield {i: snapshot[i] for i in ids if i in snapshot}
    finally:
        group.watchers.pop(token, None)
        group.wakers.pop(token, None)
        group.woken.pop(token, None)
        if not group.watchers and group.task is not None:
            # out of the registry first: a watcher arriving while the task winds down must start a
            # new group, not join one whose poll loop is being cancelled
            if _groups.get(key) is group:
                del _groups[key]
            closing = group.close() if group.close is not None else None
            group.close = None
            group.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await group.task
            if closing is not None:
                if group.inflight is not None and not group.inflight.done():
                    await asyncio.wait([group.inflight], timeout=INFLIGHT_WAIT_S)
                await closing


async def watch_with_retry(
    key: Hashable,
    ids: list[str],
    describe: Describe[V],
    interval: float,
    log: Any = None,
    close: Close | None = None,
    quiet: float | None = None,
) -> AsyncGenerator[dict[str, V], None]:
    """``watch``, with transient describe errors (throttling, 5xx) waited out with backoff for minutes
    (``lifecycle.retry.TransientBudget``); any other error, or one that lasts, is raised."""
    from airflow_cloudtrain.core.retry import TransientBudget

    budget = TransientBudget(base_s=interval)
    while True:
        try:
            async with aclosing(watch(key, ids, describe, interval, close, quiet)) as stream:
                async for snapshot in stream:
                    budget.ok()
                    yield snapshot
        except asyncio.CancelledError:
            raise
        except Exception as err:
            delay = budget.failed(err)  # re-raises when not transient or lasting too long
            if log is not None:
                log.warning("Transient error polling (%s); retrying", err)
            await asyncio.sleep(delay)

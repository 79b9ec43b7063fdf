"""Watchers that join a poll group while its describe is under way: none is ever handed a snapshot
whose describe did not ask for its ids (it would read a live resource as deleted), and a newcomer's
first snapshot comes soon, not a whole interval later."""

from __future__ import annotations

import asyncio
import random
from contextlib import aclosing

import pytest

from airflow_cloudtrain.triggers import shared_poll


class Cloud:
    """Every id exists; a describe answers for the ids it was asked about, as a cloud's does, and
    takes a while (the window in which watchers join)."""

    def __init__(self, seed: int, slow_s: float) -> None:
        self.rng = random.Random(seed)
        self.slow_s = slow_s
        self.calls = 0

    async def describe(self, ids: list[str]) -> dict[str, str]:
        self.calls += 1
        await asyncio.sleep(self.rng.uniform(0.2, 1.0) * self.slow_s)
        return {i: f"alive:{i}" for i in ids}


@pytest.mark.parametrize("quiet", [None, 3600.0], ids=["every-poll", "quiet"])
def test_watchers_joining_during_a_describe_never_see_their_id_missing(quiet: float | None) -> None:
    cloud = Cloud(seed=22, slow_s=0.05)
    missing: list[tuple[str, int]] = []
    firsts: list[str] = []

    async def watcher(ids: list[str], delay: float) -> None:
        await asyncio.sleep(delay)
        stream = shared_poll.watch(("joins", quiet), ids, cloud.describe, 0.08, quiet=quiet)
        seen = 0
        async with aclosing(stream):
            async for snapshot in stream:
                missing.extend((i, seen) for i in ids if i not in snapshot)
                if seen == 0:
                    firsts.append(ids[0])
                seen += 1
                if seen >= (1 if quiet else 3):  # a quiet watcher is woken again only on a change
                    return

    async def main() -> None:
        rng = random.Random(7)
        tasks = []
        for n in range(120):
            # one or two ids, some shared with another watcher (two triggers of one run)
            ids = [f"r-{n}"] + ([f"r-{n - 1}"] if n and rng.random() < 0.2 else [])
            tasks.append(watcher(ids, rng.uniform(0.0, 1.5)))
        await asyncio.wait_for(asyncio.gather(*tasks), 120)

    asyncio.run(main())
    assert missing == [], f"{len(missing)} snapshots lacked a watched id that exists, e.g. {missing[:5]}"
    assert len(firsts) == 120
    assert cloud.calls > 3  # the joins really did land across several polls


def test_an_error_from_a_describe_that_did_not_ask_for_a_newcomer_is_not_its_error() -> None:
    """A describe that fails for the older set of ids says nothing about the newcomer's either."""

    async def main() -> list[object]:
        asked: list[list[str]] = []
        under_way = asyncio.Event()

        async def describe(ids: list[str]) -> dict[str, str]:
            asked.append(ids)
            if len(asked) == 1:
                under_way.set()
                await asyncio.sleep(0.2)
                raise RuntimeError("the first describe failed")
            return {i: "alive" for i in ids}

        async def first(ids: list[str]) -> object:
            stream = shared_poll.watch(("errors",), ids, describe, 0.2)
            async with aclosing(stream):
                try:
                    async for snapshot in stream:
                        return snapshot
                except RuntimeError as err:
                    return err
            return None

        old = asyncio.ensure_future(first(["old"]))
        await under_way.wait()
        new = await asyncio.wait_for(first(["new"]), 60)
        return [await old, new, asked]

    old, new, asked = asyncio.run(main())
    assert isinstance(old, RuntimeError)
    assert new == {"new": "alive"}
    assert asked[0] == ["old"] and "new" in asked[1]


def test_a_newcomer_gets_its_first_snapshot_well_before_a_whole_interval() -> None:
    """It joins just after a poll: the next one starts a quarter interval after the last, for it."""
    interval = 4.0

    async def main() -> float:
        polled = asyncio.Event()

        async def describe(ids: list[str]) -> dict[str, str]:
            polled.set()
            return {i: "alive" for i in ids}

        async def follow(ids: list[str], count: int) -> None:
            stream = shared_poll.watch(("prompt",), ids, describe, interval)
            async with aclosing(stream):
                async for _ in stream:
                    count -= 1
                    if count == 0:
                        return

        loop = asyncio.get_running_loop()
        elder = asyncio.ensure_future(follow(["elder"], 2))  # stays in the group meanwhile
        await polled.wait()  # the group's first poll just went out
        await asyncio.sleep(0.1)
        joined = loop.time()
        await asyncio.wait_for(follow(["newcomer"], 1), 60)
        took = loop.time() - joined
        elder.cancel()
        await asyncio.gather(elder, return_exceptions=True)
        return took

    took = asyncio.run(main())
    # the next regular poll was ~3.9 s away; the newcomer's comes ~0.9 s after it joined
    assert took < interval - 1.0, took

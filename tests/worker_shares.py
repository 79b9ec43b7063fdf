"""The order the suite's items are handed to pytest-xdist's ``worksteal`` scheduler in.

``worksteal`` splits the collection into one contiguous share per worker (the first ``n // w`` items
to the first worker, and so on), and a worker that runs dry takes the back half of the longest queue
left (longest by count). Sorted with the longest files first, the first share held every long test and
most of the files that start instances, so one worker ran them one after another while the others ran
the quick unit tests, then stole from the back of that queue; the long tests, which mostly wait on
emulated instances, met each other at the end, with the cores idle. Dealt instead, the files go over
the shares in turns (0..w-1, then w-1..0, and again), the longest first, then the others in collection
order; a file too big for any share's room (the table of bad inputs: thousands of millisecond cases)
fills the shares up at the end. Every worker then starts in a long test, each share mixes waiting
and computing, and a steal takes quick items from the back.

A file's items stay together in one share (module-scoped fixtures, e.g. a deployment, start once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def share_sizes(count: int, workers: int) -> list[int]:
    """The sizes of the shares ``worksteal`` cuts ``count`` items into for ``workers`` idle workers."""
    sizes, left = [], count
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def deal(groups: Sequence[Sequence[T]], workers: int) -> list[T]:
    """``groups`` (files; the longest first) dealt over the workers' shares in turns, each kept whole
    in one share; one that does not fit its turn's share goes to the share with the most room, and one
    that fits none fills the shares' rest, in order. One list, whose contiguous shares are what each
    worker starts with."""
    count = sum(len(g) for g in groups)
    if workers <= 1 or count == 0:
        return [item for group in groups for item in group]
    sizes = share_sizes(count, workers)
    shares: list[list[T]] = [[] for _ in sizes]
    fill: list[T] = []
    for n, group in enumerate(groups):
        turn, back = divmod(n, workers)
        index = back if turn % 2 == 0 else workers - 1 - back
        if len(shares[index]) + len(group) > sizes[index]:
            index = max(range(workers), key=lambda i: sizes[i] - len(shares[i]))
            if len(shares[index]) + len(group) > sizes[index]:
                fill.extend(group)
                continue
        shares[index].extend(group)
    ordered: list[T] = []
    for share, size in zip(shares, sizes, strict=True):
        room = max(0, size - len(share))
        ordered += share + fill[:room]
        del fill[:room]
    return ordered + fill

"""The suite's order for pytest-xdist's worksteal shares (``tests/worker_shares.py``): the files are
dealt over the workers' shares in turns, each whole, and the shares keep worksteal's sizes."""

from __future__ import annotations

import pytest
from worker_shares import deal, share_sizes


def _shares(items: list[str], workers: int) -> list[list[str]]:
    """The contiguous shares worksteal cuts ``items`` into."""
    out, at = [], 0
    for size in share_sizes(len(items), workers):
        out.append(items[at : at + size])
        at += size
    return out


def _files(share: list[str]) -> list[str]:
    """The files of a share's items (``file:case``), in order, each once."""
    return list(dict.fromkeys(item.split(":")[0] for item in share))


def test_share_sizes_are_worksteals_cut() -> None:
    assert share_sizes(10, 3) == [3, 3, 4] and share_sizes(6790, 6) == [1131, 1131, 1132, 1132, 1132, 1132]
    assert sum(share_sizes(7, 6)) == 7


def test_files_are_dealt_in_turns_and_back_and_a_file_too_big_fills_the_rest() -> None:
    files = [[f"f{n}:a", f"f{n}:b"] for n in range(8)]  # the longest first
    table = [f"table:{n}" for n in range(20)]  # fits no share whole
    ordered = deal([*files, table], 3)
    assert sorted(ordered) == sorted([i for f in files for i in f] + table)  # nothing lost or repeated
    shares = _shares(ordered, 3)
    # turns 0 1 2, back 2 1 0, then 0 1; the table fills each share's rest, in order
    assert [_files(s) for s in shares] == [
        ["f0", "f5", "f6", "table"],
        ["f1", "f4", "f7", "table"],
        ["f2", "f3", "table"],
    ]
    assert [i for s in shares for i in s if i.startswith("table")] == table


def test_a_file_too_big_for_its_turn_goes_where_there_is_room_and_stays_whole() -> None:
    files = [["a:1"] * 3, ["b:1"] * 5, ["c:1"] * 2, ["q:1"] * 2]
    shares = _shares(deal(files, 2), 2)  # shares of 6 and 6
    # b took share 1; c's turn (share 1) had no room, share 0 had; q fits no share whole: it fills
    assert shares == [["a:1"] * 3 + ["c:1"] * 2 + ["q:1"], ["b:1"] * 5 + ["q:1"]]


@pytest.mark.parametrize("workers", [0, 1])
def test_one_process_keeps_the_longest_files_first(workers: int) -> None:
    assert deal([["l1"], ["l2"], ["q"]], workers) == ["l1", "l2", "q"]

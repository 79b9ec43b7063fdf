"""Follow the agent's log chunks in the run folder: in order, each chunk once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from airflow_cloudtrain.contract.runs import Beacon, join, log_key, log_prefix, log_seq, split_stamp


def render_line(line: str) -> str:
    """A job line for the task log: ``[job 08:00:09.602] text`` with the time the job wrote it (UTC,
    as the agent stamped it), ``[job] text`` for a line without a stamp."""
    stamp, text = split_stamp(line)
    return f"[job {stamp[11:23]}] {text}" if stamp else f"[job] {text}"


class LogFollower:
    """Remembers the last chunk shown; ``new_keys`` picks the next ones, strictly in sequence.

    A gap (chunk 5 listed before chunk 4 is visible) stops at the gap, so lines never come out of
    order; the next poll picks up from there.
    """

    def __init__(self, instance_id: str, next_seq: int = 0) -> None:
        self.instance_id = instance_id
        self.next_seq = next_seq
        self.prefix = log_prefix(instance_id)
        self._pending: list[str] = []  # lines of chunks read by a poll that then failed

    def new_keys(self, keys: Iterable[str]) -> list[str]:
        """The next chunks in sequence; the cursor moves only as each is read (``advance``), so a
        read that fails is retried on the next poll instead of losing its lines."""
        by_seq = {log_seq(k): k for k in keys if k.endswith(".log")}
        out = []
        seq = self.next_seq
        while seq in by_seq:
            out.append(by_seq[seq])
            seq += 1
        return out

    def _take(self, raw: bytes | None) -> None:
        self.next_seq += 1
        self._pending.extend((raw or b"").decode(errors="replace").splitlines())

    def _hand_over(self) -> list[str]:
        lines = self._pending
        self._pending = []
        return lines

    def poll(self, list_keys: Callable[[str], list[str]], read: Callable[[str], bytes | None]) -> list[str]:
        """Blocking variant: new lines since the last poll. When a read fails, the lines of the
        chunks read before it are kept and come with the next poll."""
        for key in self.new_keys(list_keys(self.prefix)):
            self._take(read(key))
        return self._hand_over()

    def from_beacon(self, beacon: Beacon, run_uri: str, read_uri: Callable[[str], bytes | None]) -> list[str]:
        """Blocking: new lines up to the beacon's ``log_seq``: from its tail, and chunks older than
        the tail by key (no listing). A chunk that cannot be read yet stops there (next time)."""
        while self.next_seq < min(beacon.tail_from, beacon.log_seq):
            raw = read_uri(join(run_uri, log_key(self.instance_id, self.next_seq)))
            if raw is None:
                return self._hand_over()
            self._take(raw)
        tail = beacon.lines_from(self.next_seq)
        if tail:
            self._pending.extend(tail)
        self.next_seq = max(self.next_seq, beacon.log_seq)
        return self._hand_over()

    async def apoll(
        self, list_keys: Callable[[str], Awaitable[list[str]]], read: Callable[[str], Awaitable[bytes | None]]
    ) -> list[str]:
        """Async variant for triggers."""
        for key in self.new_keys(await list_keys(self.prefix)):
            self._take(await read(key))
        return self._hand_over()

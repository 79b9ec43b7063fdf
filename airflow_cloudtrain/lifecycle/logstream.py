"""Follow the agent's log chunks in the run folder: in order, each chunk once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from airflow_cloudtrain.runs import log_prefix, log_seq


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

    async def apoll(
        self, list_keys: Callable[[str], Awaitable[list[str]]], read: Callable[[str], Awaitable[bytes | None]]
    ) -> list[str]:
        """Async variant for triggers."""
        for key in self.new_keys(await list_keys(self.prefix)):
            self._take(await read(key))
        return self._hand_over()

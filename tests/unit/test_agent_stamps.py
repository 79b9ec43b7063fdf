"""The agent's per-line stamps and its beacon, without any cloud: ``LogStreamer`` stamps each stored line
with the time its first byte was written (pieces of one line get one stamp), keeps its chunk
guarantees, and keeps the tail a ``runs.Beacon`` carries within ``runs.TAIL_MAX``; ``BeaconWriter``
writes nothing non-final after the final beacon; ``StatusWriter`` beats through the beacon when the
run has a live index."""

from __future__ import annotations

import io
import json
import threading
from datetime import datetime, timezone

import pytest

from airflow_cloudtrain.agent import logs
from airflow_cloudtrain.agent.beacon import BeaconWriter
from airflow_cloudtrain.agent.logs import NOTE_PREFIX, LogStreamer, LogTail, stamp_lines
from airflow_cloudtrain.agent.status import StatusWriter
from airflow_cloudtrain.contract import runs

T0 = 1_795_000_000.25  # 2026-11-18T...: any time with a fraction


def stamp(at: float) -> str:
    return runs.format_stamp(at).decode()


def when(stamp_text: str) -> float:
    return datetime.strptime(stamp_text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


class MemoryFolder:
    """The put calls a LogStreamer / StatusWriter / BeaconWriter makes, in memory and in order."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.puts: list[tuple[str, bytes]] = []
        self.fail = False
        self.lock = threading.Lock()

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.fail:
            raise ConnectionError("network down")
        with self.lock:
            self.objects[key] = data
            self.puts.append((key, data))

    def put_text(self, key: str, text: str) -> None:
        self.put_bytes(key, text.encode())


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def streamer(folder: MemoryFolder, clock: Clock, echo: io.BytesIO | None = None) -> LogStreamer:
    return LogStreamer(folder, "i-1", echo=echo or io.BytesIO(), clock=clock)  # type: ignore[arg-type]


def chunks(folder: MemoryFolder) -> list[str]:
    keys = sorted(k for k in folder.objects if k.startswith(runs.log_prefix("i-1")))
    assert [runs.log_seq(k) for k in keys] == list(range(len(keys)))
    return [folder.objects[k].decode() for k in keys]


def test_stamp_format_round_trips() -> None:
    text = stamp(T0)
    assert len(text) == runs.STAMP_LEN and text.endswith("Z ")
    assert runs.split_stamp(text + "hello") == (text[:-1], "hello")
    assert when(text[:-1]) == pytest.approx(T0, abs=0.001)
    assert runs.split_stamp("hello") == (None, "hello")
    assert runs.strip_stamps(f"{text}a\n{text}b\nc\n") == "a\nb\nc\n"


def test_a_line_written_in_pieces_gets_one_stamp_at_its_first_byte() -> None:
    folder, clock, echo = MemoryFolder(), Clock(), io.BytesIO()
    out = streamer(folder, clock, echo)
    out.write(b"ab")  # the first byte of line 1 at T0
    clock.now = T0 + 1
    out.write(b"c\nd")  # line 1 ends, line 2 starts at T0 + 1
    clock.now = T0 + 2
    out.write(b"e\n")
    clock.now = T0 + 3
    out.write(b"f\ng\nh\n")  # three lines at once: three stamps, all T0 + 3; no stamp after the last
    assert out.flush() == 1
    assert chunks(folder) == [
        f"{stamp(T0)}abc\n{stamp(T0 + 1)}de\n{stamp(T0 + 3)}f\n{stamp(T0 + 3)}g\n{stamp(T0 + 3)}h\n"
    ]
    assert echo.getvalue() == b"abc\nde\nf\ng\nh\n"  # the agent's stdout: unstamped


def test_form_feeds_become_spaces_in_chunks_only() -> None:
    folder, clock, echo = MemoryFolder(), Clock(), io.BytesIO()
    out = streamer(folder, clock, echo)
    out.write(b"page\x0cbreak\n\x0c\n")
    out.note("a \x0c note")
    out.flush(final=True)
    assert chunks(folder) == [f"{stamp(T0)}page break\n{stamp(T0)} \n{stamp(T0)}{NOTE_PREFIX}a   note\n"]
    assert b"\x0c" not in b"".join(folder.objects.values())
    assert echo.getvalue().startswith(b"page\x0cbreak\n\x0c\n")


def test_notes_are_stamped_and_end_an_unterminated_line() -> None:
    folder, clock, echo = MemoryFolder(), Clock(), io.BytesIO()
    out = streamer(folder, clock, echo)
    out.note("first")
    out.write(b"no newline")
    clock.now = T0 + 5
    out.note("second")
    out.flush(final=True)
    assert chunks(folder) == [
        f"{stamp(T0)}{NOTE_PREFIX}first\n{stamp(T0)}no newline\n{stamp(T0 + 5)}{NOTE_PREFIX}second\n"
    ]
    assert echo.getvalue() == f"{NOTE_PREFIX}first\nno newline\n{NOTE_PREFIX}second\n".encode()


def test_chunk_guarantees_hold_with_stamps() -> None:
    """No empty chunk, a partial last line kept for the next chunk unless final, a failed upload
    retried in place with the same bytes (and stamps)."""
    folder, clock = MemoryFolder(), Clock()
    out = streamer(folder, clock)
    assert out.flush() == 0 and folder.puts == []
    out.write(b"a\nb")
    assert out.flush() == 1 and chunks(folder) == [f"{stamp(T0)}a\n"]  # "b" waits for its newline
    clock.now = T0 + 1
    out.write(b"c\n")
    folder.fail = True
    with pytest.raises(ConnectionError):
        out.flush()
    assert out.snapshot()[0] == 1  # nothing counted
    folder.fail = False
    clock.now = T0 + 2
    out.write(b"tail")
    assert out.flush(final=True) == 1
    assert chunks(folder) == [f"{stamp(T0)}a\n", f"{stamp(T0)}bc\n{stamp(T0 + 2)}tail"]


def test_a_line_cut_by_the_chunk_limit_continues_unstamped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "MAX_CHUNK", 50)
    folder, clock = MemoryFolder(), Clock()
    out = streamer(folder, clock)
    out.write(b"x" * 30 + b"\nshort\n")
    assert out.flush() == 2  # a full chunk, then what is left
    first, second = chunks(folder)
    assert len(first.encode()) == 50 and first == f"{stamp(T0)}" + "x" * 25
    assert runs.split_stamp(second.splitlines()[0]) == (None, "x" * 5)  # the cut line goes on unstamped
    assert runs.split_stamp(second.splitlines()[1]) == (stamp(T0)[:-1], "short")
    assert runs.strip_stamps(first + second) == "x" * 30 + "\nshort\n"


def test_stamp_lines() -> None:
    s = b"S "
    assert stamp_lines(b"a\nb\n", s, True) == b"S a\nS b\n"
    assert stamp_lines(b"a\nb", s, False) == b"a\nS b"
    assert stamp_lines(b"\n", s, True) == b"S \n"
    assert stamp_lines(b"\n", s, False) == b"\n"
    assert stamp_lines(b"", s, True) == b""


# -- the tail ---------------------------------------------------------------------------------------


def test_the_tail_keeps_the_newest_chunks_within_tail_max() -> None:
    tail = LogTail()
    assert tail.snapshot() == (0, 0, "")
    piece = "é" * 10_000 + "\n"  # 20,001 bytes of utf-8, 10,001 characters
    for seq in range(5):
        tail.add(seq, piece.encode())
    log_seq, tail_from, text = tail.snapshot()
    assert log_seq == 5 and tail_from == 2  # three chunks (and their separators) fit in 64 KiB, four don't
    assert text == (piece + "\f") * 3 and len(text.encode()) <= runs.TAIL_MAX
    tail.add(5, b"x" * (runs.TAIL_MAX + 1))  # a chunk larger than the tail: an empty tail
    assert tail.snapshot() == (6, 6, "")
    tail.add(6, b"y\n")
    assert tail.snapshot() == (7, 6, "y\n\f")
    exact = LogTail()
    exact.add(0, b"z" * (runs.TAIL_MAX - 1))  # with its form feed: exactly TAIL_MAX
    assert exact.snapshot()[1:] == (0, "z" * (runs.TAIL_MAX - 1) + "\f")


def test_beacon_lines_from_reads_the_streamers_tail_back() -> None:
    folder, clock = MemoryFolder(), Clock()
    out = streamer(folder, clock)
    written: list[list[str]] = []
    for seq in range(6):
        out.write(b"".join(f"chunk {seq} line {n}\n".encode() for n in range(3)) + b"z" * 20_000 + b"\n")
        assert out.flush() == 1
        written.append(chunks(folder)[seq].splitlines())
    log_seq, tail_from, tail = out.snapshot()
    assert (log_seq, tail_from) == (6, 3)
    status = runs.RunStatus(runs.RUNNING, "i-1")
    beacon = runs.Beacon.from_bytes(runs.Beacon("i-1", vars(status), log_seq, tail_from, tail).to_bytes())
    assert beacon.lines_from(tail_from - 1) is None  # before the tail: read the chunks
    for seq in range(tail_from, log_seq):
        assert beacon.lines_from(seq) == [line for lines in written[seq:] for line in lines]
    assert beacon.lines_from(log_seq) == [] and beacon.lines_from(log_seq + 3) == []
    assert beacon.lines_from(3)[0] == f"{stamp(T0)}chunk 3 line 0"  # type: ignore[index]


def test_an_empty_tail_reads_nothing_but_the_end() -> None:
    beacon = runs.Beacon("i-1", {"state": runs.RUNNING, "instance_id": "i-1"}, log_seq=4, tail_from=4)
    assert beacon.lines_from(3) is None and beacon.lines_from(4) == []


# -- the beacon writer --------------------------------------------------------------------------------


def test_beacon_bytes_do_not_move_with_time() -> None:
    folder, clock = MemoryFolder(), Clock()
    writer = StatusWriter(folder, "i-1", started_at=T0)  # type: ignore[arg-type]
    beacon = BeaconWriter(folder, "i-1", lambda: writer.status)  # type: ignore[arg-type]
    writer.beacon = beacon
    writer.update(state=runs.RUNNING)
    first = folder.objects[beacon.key]
    written = beacon.written
    clock.now += 100
    writer.beat()
    writer.beat()
    assert folder.objects[beacon.key] == first and beacon.written == written  # beats leave it be
    assert b"updated_at" not in first and runs.Beacon.from_bytes(first).run_status().state == runs.RUNNING
    assert float(folder.objects[runs.beat_name("i-1")]) > 0  # the beat object is the heartbeat
    assert runs.heartbeat_key("i-1") not in folder.objects
    writer.update(message="changed")
    assert folder.objects[beacon.key] != first


def test_without_a_live_index_the_heartbeat_file_is_written() -> None:
    folder = MemoryFolder()
    writer = StatusWriter(folder, "i-1", started_at=T0)  # type: ignore[arg-type]
    writer.update(state=runs.RUNNING)
    writer.beat()
    assert set(folder.objects) == {runs.status_key("i-1"), runs.heartbeat_key("i-1")}


def test_nothing_follows_the_final_beacon_but_the_end_marker() -> None:
    """A heartbeat thread beating all along: once the final beacon is being written, no non-final
    one follows it, and the end marker comes last."""
    folder = MemoryFolder()
    writer = StatusWriter(folder, "i-1", started_at=T0)  # type: ignore[arg-type]
    beacon = BeaconWriter(folder, "i-1", lambda: writer.status)  # type: ignore[arg-type]
    writer.beacon = beacon
    writer.update(state=runs.RUNNING)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            writer.beat()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    while sum(1 for key, _ in folder.puts if key == runs.beat_name("i-1")) < 20:  # it is beating
        stop.wait(0.001)
    with pytest.raises(RuntimeError):
        beacon.write_end(writer.status)  # not before the final beacon
    writer.update(state=runs.SUCCEEDED, exit_code=0)  # the final status writes no beacon itself
    final = writer.status
    beacon.publish_final(final)
    beacon.write_end(final)
    for _ in range(5):
        writer.beat()  # after the end: nothing
    assert beacon.publish() is False
    stop.set()
    thread.join(10)
    beacons = [(key, data) for key, data in folder.puts if key == beacon.key]
    states = [runs.Beacon.from_bytes(data).status["state"] for _, data in beacons]
    first_final = states.index(runs.SUCCEEDED)
    assert states[first_final:] == [runs.SUCCEEDED] and set(states[:first_final]) == {runs.RUNNING}
    assert folder.puts[-1] == (beacon.end_key, final.to_json().encode())
    assert folder.puts[-2][0] == beacon.key
    status_writes = [i for i, (key, _) in enumerate(folder.puts) if key == runs.status_key("i-1")]
    assert status_writes[-1] < len(folder.puts) - 2  # the final status.json before the final beacon
    with pytest.raises(ValueError):
        beacon.publish_final(runs.RunStatus(runs.RUNNING, "i-1"))


def test_a_failed_beacon_write_is_logged_or_raised() -> None:
    folder = MemoryFolder()
    writer = StatusWriter(folder, "i-1", started_at=T0)  # type: ignore[arg-type]
    beacon = BeaconWriter(folder, "i-1", lambda: writer.status)  # type: ignore[arg-type]
    writer.beacon = beacon
    folder.fail = True
    writer.update(state=runs.RUNNING)  # logged, not raised: the status write failed the same way
    assert writer.status.state == runs.RUNNING and beacon.publish() is False
    with pytest.raises(ConnectionError):
        writer.beat()  # the heartbeat chore logs it
    with pytest.raises(ConnectionError):
        beacon.publish_final(runs.RunStatus(runs.FAILED, "i-1"))  # the runner retries it
    folder.fail = False
    beacon.publish_final(runs.RunStatus(runs.FAILED, "i-1"))
    assert runs.Beacon.from_bytes(folder.objects[beacon.key]).status["state"] == runs.FAILED


def test_the_beacon_carries_the_logs_state() -> None:
    folder, clock = MemoryFolder(), Clock()
    out = streamer(folder, clock)
    status = runs.RunStatus(runs.RUNNING, "i-1")
    beacon = BeaconWriter(folder, "i-1", lambda: status, out.snapshot)  # type: ignore[arg-type]
    out.write(b"hello\n")
    out.flush()
    beacon.publish()
    got = runs.Beacon.from_bytes(folder.objects[beacon.key])
    assert (got.log_seq, got.tail_from) == (1, 0)
    assert got.lines_from(0) == [f"{stamp(T0)}hello"] and got.instance_id == "i-1"


# -- the checkpoint history -----------------------------------------------------------------------------


def test_every_upload_joins_the_status_history_bounded_and_without_an_extra_write() -> None:
    from airflow_cloudtrain.agent.runner import Agent

    folder = MemoryFolder()
    agent = Agent("s3://b/r", instance_id="i-1", folder=folder)  # type: ignore[arg-type]
    writer = agent.writer = StatusWriter(folder, "i-1", started_at=T0)  # type: ignore[arg-type]
    writer.beacon = BeaconWriter(folder, "i-1", lambda: writer.status)  # type: ignore[arg-type]
    total = runs.CHECKPOINT_HISTORY_MAX + 50
    for version in range(1, total + 1):  # the last 10 are snapshots without a step
        step = version * 10 if version <= total - 10 else None
        agent._uploaded(version, runs.Manifest(step=step, saved_at=T0 + version, instance_id="i-1"))
    status_puts = [data for key, data in folder.puts if key == runs.status_key("i-1")]
    assert len(status_puts) == total  # the one status write each upload made before the history
    status = runs.RunStatus.from_json(status_puts[-1].decode())
    history = status.checkpoint_history or []
    assert len(history) == runs.CHECKPOINT_HISTORY_MAX  # the newest, oldest first
    assert [h["version"] for h in history] == list(range(51, total + 1))
    assert (
        history[0]["step"] == 510
        and history[-11]["step"] == (total - 10) * 10
        and history[-1]["step"] is None
    )
    assert all(a["at"] <= b["at"] for a, b in zip(history, history[1:], strict=False))
    assert status.checkpoint is not None and status.checkpoint["uploaded_at"] == pytest.approx(
        history[-1]["at"], abs=1e-3
    )
    assert len(status_puts[-1]) < 16_000  # status.json stays a few kilobytes
    beacon = runs.Beacon.from_bytes(folder.objects[runs.beacon_name("i-1")])
    assert "checkpoint_history" not in beacon.status and beacon.run_status().checkpoint == status.checkpoint
    # a status.json written before the history existed still reads
    old = {k: v for k, v in vars(status).items() if k != "checkpoint_history"}
    assert runs.RunStatus.from_json(json.dumps(old)).checkpoint_history is None

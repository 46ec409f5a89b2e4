"""Ollama's log read from the systemd journal (``--ollama-journal``): the real ``journalctl`` following real
journal files that ``systemd-journal-remote`` writes (tests/support/journal.py), with llama-server's own
output (tests/data/llama_server_logs) as the messages."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collectors.ollama.journal import JournalTail, explain_exit, message_text
from collectors.ollama.log import LogEvent, parse_line
from tests.support.journal import JournalFiles, now_us, require_journal_tools, unit_entry
from tests.support.paths import DATA

CAPTURED = DATA / "llama_server_logs" / "prompt4k_batch512.log"
SLOT = "slot print_timing: id  0 | task 1 | "  # a runner line's own prefix
WAIT_S = 30.0  # for journalctl to show what was written: far above the ~0.1 s it takes on a quiet machine


@pytest.fixture
def tails() -> Iterator[list[JournalTail]]:
    """Every JournalTail a test makes is closed (journalctl stopped and reaped) at its end."""
    made: list[JournalTail] = []
    yield made
    for tail in made:
        tail.close()


def read_until(tail: JournalTail, done: Callable[[list[LogEvent]], bool], timeout_s: float = WAIT_S) -> list[LogEvent]:
    got: list[LogEvent] = []
    deadline = time.monotonic() + timeout_s
    while not done(got):
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s; got {len(got)} events, problem {tail.problem!r}"
        got += tail.read(time.time())
        time.sleep(0.05)
    return got


def following(tail: JournalTail) -> None:
    """Wait until journalctl follows: it has shown the unit's last old entry (skipped: not news)."""
    assert read_until(tail, lambda _: tail.entries >= 1) == [], "the old entry is not an event"


def test_reads_the_units_entries_with_their_journal_timestamps(tmp_path: Path, tails: list[JournalTail]) -> None:
    journal = JournalFiles(tmp_path)
    old = "slot print_timing: id  0 | task 9 | prompt processing, n_tokens = 7, progress = 0.50, t = 1 s / 7 tokens per second"
    journal.append([unit_entry(old, ts_us=now_us() - 60_000_000), unit_entry("other unit, earlier", "other.service")])
    tail = JournalTail("ollama", journal_dir=tmp_path)
    tails.append(tail)
    following(tail)

    lines = CAPTURED.read_text().splitlines()
    start_us = now_us()
    written = [(line, start_us + 1000 * i) for i, line in enumerate(lines)]
    entries = [unit_entry(line, ts_us=ts) for line, ts in written]
    # Another unit's lines, progress lines among them, written in between: never read.
    for i in range(0, len(entries), 20):
        entries.insert(i, unit_entry(lines[218], "other.service", ts_us=start_us - 5))
    half = len(written) // 2
    journal.append(entries[: half + 10])
    expected = [e for e in (parse_line(line, ts / 1e6) for line, ts in written) if e is not None]
    # 8 progress lines, the 3 timing lines, the task's launch, new prompt and release, and 7 load lines (the runner's
    # device, its model, output, KV and compute buffers: where it put the model), and 4 wait lines (its slot count, the
    # cache update's time, two context checkpoints written: analysis.runner_wait_lines), and its listening line (the end of
    # its start: no load line after it is its own)
    assert len(expected) == 26
    got = read_until(tail, lambda got: len(got) >= len([e for e in expected if e.read_unix_s * 1e6 < written[half][1]]))
    time.sleep(0.5)
    journal.append(entries[half + 10 :])  # a second writer run while journalctl follows
    got += read_until(tail, lambda got_now: len(got) + len(got_now) >= len(expected))
    time.sleep(0.5)
    got += tail.read(time.time())
    assert got == expected, "the unit's progress and timing lines, stamped with their journal timestamps"
    assert [e.read_unix_s for e in got] == sorted(e.read_unix_s for e in got) and got[0].read_unix_s >= start_us / 1e6
    assert [e.tokens for e in got if e.kind == "progress"] == [512, 1024, 1536, 2048, 2560, 3072, 3489, 3997]
    assert tail.unknown_lines == len(lines) - len(expected) and tail.garbled_lines == 0
    assert tail.problem is None and tail.starts == 1


def test_a_message_that_is_not_utf8(tmp_path: Path, tails: list[JournalTail]) -> None:
    """journalctl's JSON gives such a MESSAGE as an array of bytes: still read, the bad bytes replaced."""
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("Started ollama.service", ts_us=now_us() - 1_000_000)])
    tail = JournalTail("ollama", journal_dir=tmp_path)
    tails.append(tail)
    following(tail)
    line = b"slot print_timing: id  0 | task 3 | prompt processing, n_tokens =   2048, progress = 0.51, t = \xff\xfe s"
    ts = now_us()
    journal.append([unit_entry(line, ts_us=ts), unit_entry(b"\xc3\x28 not text at all", ts_us=ts + 1)])
    got = read_until(tail, lambda _: tail.entries >= 3)
    assert [(e.kind, e.tokens, e.task_id, e.read_unix_s) for e in got] == [("progress", 2048, 3, ts / 1e6)]
    assert tail.unknown_lines == 1 and tail.garbled_lines == 0 and tail.problem is None
    assert message_text(list(line)) == line.decode("utf-8", "replace")
    assert message_text("plain") == "plain" and message_text(None) is None and message_text([300, 1]) is None


def test_journalctl_output_that_is_not_an_entry(tmp_path: Path) -> None:
    """Garbled or over-long lines are counted and skipped; the lines around them still count."""
    tail = JournalTail("ollama", journal_dir=tmp_path, max_line_bytes=400)
    good = json.dumps({"__REALTIME_TIMESTAMP": "1700000000250000", "MESSAGE": "prompt eval time = 10.00 ms / 2048 tokens"})
    data = "\n".join(["{not json", "[1, 2]", "", json.dumps({"MESSAGE": "x" * 500}), good, '{"MESSAGE": 5}', '{"MESS'])
    events = tail.take_output(data.encode(), 1.0)
    assert [(e.kind, e.tokens, e.read_unix_s) for e in events] == [("prompt_eval", 2048, 1_700_000_000.25)]
    assert tail.garbled_lines == 3 and tail.unknown_lines == 1
    assert tail.take_output(b'AGE": "eval time = 2 ms / 4 tokens"}\n', 9.0)[0].read_unix_s == 9.0, "no timestamp: read time"
    # A line longer than max_line_bytes that arrives in pieces is dropped as it grows, never kept whole.
    assert tail.take_output(b"{" + b"y" * 300, 1.0) == [] and tail.take_output(b"z" * 300, 1.0) == []
    assert len(tail._partial) <= tail.max_line_bytes and tail.garbled_lines == 4
    assert [e.kind for e in tail.take_output(b"zz}\n" + good.encode() + b"\n", 1.0)] == ["prompt_eval"]
    assert tail.garbled_lines == 4, "the end of the dropped line is not counted again"


def test_entries_of_a_flood_are_read_over_several_calls(tmp_path: Path, tails: list[JournalTail]) -> None:
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("old", ts_us=now_us() - 1_000_000)])
    tail = JournalTail("ollama", journal_dir=tmp_path, max_read_bytes=512)
    tails.append(tail)
    following(tail)
    journal.append([unit_entry(SLOT + f"prompt processing, n_tokens = {i}, progress = 0.5") for i in range(1, 41)])
    time.sleep(1.0)  # journalctl has written them all into the pipe (64 KiB) by now
    got: list[LogEvent] = []
    per_call: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 40:
        assert time.monotonic() < deadline, f"got {len(got)}"
        new = tail.read(time.time())
        per_call.append(len(new))
        got += new
    assert [e.tokens for e in got] == list(range(1, 41))
    # Each entry is ~310 bytes of JSON (its cursor, timestamps, boot id, message): at most 512 bytes a call,
    # an unfinished entry carried over, is at most 2 entries a call.
    assert max(per_call) <= 2 and len([n for n in per_call if n]) >= 20, per_call


def attempts_over_time(tail: JournalTail, attempts: int) -> float:
    """Read until ``attempts`` tries to start journalctl were made; the seconds from the first try to the last."""
    first_s = None
    deadline = time.monotonic() + WAIT_S
    while tail.attempts < attempts or tail.pid is not None:
        assert time.monotonic() < deadline, tail.problem
        assert tail.read(time.time()) == []
        if first_s is None and tail.attempts:
            first_s = time.monotonic()
        time.sleep(0.02)
    assert first_s is not None
    return time.monotonic() - first_s


def test_journalctl_missing(tmp_path: Path) -> None:
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    tail = JournalTail("ollama", env={**os.environ, "PATH": str(empty_path)}, restart_min_s=0.2, restart_max_s=0.8)
    try:
        # Waits 0.2, 0.4, 0.8 s between the 4 tries (without the doubling: 0.6 s in all).
        assert attempts_over_time(tail, 4) >= 1.4
        assert tail.starts == 0 and tail.pid is None
        problem = tail.problem or ""
        assert "journalctl is not installed or not on PATH" in problem and "--ollama-log PATH" in problem, problem
        assert "trying again after 0.2 s, then less often, at least every 0.8 s" in problem
    finally:
        tail.close()


def test_a_journal_with_nothing_then_entries(tmp_path: Path, tails: list[JournalTail]) -> None:
    """journalctl --follow over no entries at all exits: said in words, started again with backoff, and read
    once entries are there."""
    require_journal_tools()
    tail = JournalTail("ollama", journal_dir=tmp_path, restart_min_s=0.2, restart_max_s=0.8)
    tails.append(tail)
    assert attempts_over_time(tail, 4) >= 1.4, "backs off"
    assert tail.starts == 4
    problem = tail.problem or ""
    assert "journalctl -u ollama exited with status 1" in problem and "no entries" in problem, problem
    assert "is Ollama installed as the systemd unit ollama?" in problem
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("Started ollama.service", ts_us=now_us() - 1_000_000)])
    following(tail)  # at its next start
    ts = now_us()
    journal.append([unit_entry(SLOT + "prompt processing, n_tokens = 64, progress = 0.25", ts_us=ts)])
    got = read_until(tail, lambda got: len(got) >= 1)
    assert [(e.tokens, e.read_unix_s, e.prompt_size_tokens) for e in got] == [(64, ts / 1e6, 256)]
    assert tail.problem is None


def test_journalctls_stderr_is_kept_to_its_bound(tmp_path: Path, tails: list[JournalTail]) -> None:
    require_journal_tools()
    tail = JournalTail("ollama", journal_dir=tmp_path, max_stderr_bytes=24)
    tails.append(tail)
    read_until(tail, lambda _: tail.starts == 1 and tail.pid is None)
    problem = tail.problem or ""
    # journalctl said "Data from the specified boot (+0) is not available: No such boot ID in journal" (80 bytes)
    assert len(tail._stderr) == 24 and "exited with status 1: " in problem and "ID in journal" in problem, problem
    assert "Data from" not in problem


def test_a_unit_without_entries(tmp_path: Path, tails: list[JournalTail]) -> None:
    JournalFiles(tmp_path).append([unit_entry(SLOT + "prompt processing, n_tokens = 1, progress = 1", "other.service")])
    tail = JournalTail("ollama", journal_dir=tmp_path, no_entries_after_s=1.0)
    tails.append(tail)
    read_until(tail, lambda _: tail.problem is not None, timeout_s=10)
    problem = tail.problem or ""
    assert f"the journal files in {tmp_path} show no entries for unit ollama" in problem, problem
    assert "systemctl status ollama" in problem and "systemd-journal (or adm) group" in problem
    assert tail.pid is not None and tail.starts == 1, "journalctl keeps following: the unit may start later"


def test_journalctl_that_dies_is_started_again_after_its_last_entry(tmp_path: Path, tails: list[JournalTail]) -> None:
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("old", ts_us=now_us() - 1_000_000)])
    tail = JournalTail("ollama", journal_dir=tmp_path, restart_min_s=0.5)
    tails.append(tail)
    following(tail)
    journal.append([unit_entry(SLOT + "prompt processing, n_tokens = 1, progress = 0.1")])
    assert [e.tokens for e in read_until(tail, lambda got: len(got) >= 1)] == [1]
    pid = tail.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    read_until(tail, lambda _: tail.pid is None, timeout_s=10)
    assert "exited with status -9" in (tail.problem or "") and "trying again after 0.5 s" in (tail.problem or "")
    assert not Path(f"/proc/{pid}").exists(), "reaped"
    journal.append([unit_entry(SLOT + f"prompt processing, n_tokens = {n}, progress = 0.5") for n in (2, 3)])  # while it is down
    got = read_until(tail, lambda got: len(got) >= 2)
    time.sleep(0.3)
    assert [e.tokens for e in got + tail.read(time.time())] == [2, 3], "what was written meanwhile, once, and nothing older"
    assert tail.starts == 2 and tail.problem is None


def test_close_stops_and_reaps_journalctl(tmp_path: Path) -> None:
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("old", ts_us=now_us() - 1_000_000)])
    tail = JournalTail("ollama", journal_dir=tmp_path)
    following(tail)
    pid = tail.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    tail.close()
    assert not Path(f"/proc/{pid}").exists(), "stopped and reaped: no zombie"
    journal.append([unit_entry(SLOT + "prompt processing, n_tokens = 1, progress = 0.1")])
    assert tail.read(time.time()) == [] and tail.pid is None
    tail.close()  # twice is fine


def test_what_an_exit_means() -> None:
    """journalctl's own words (systemd 252) when it exits, and what the collector says to do."""
    # as a user who may not read the journal files (here: `runuser -u nobody -- journalctl -D DIR ...`)
    denied = explain_exit("ollama", 1, "No journal files were opened due to insufficient permissions.")
    assert "systemd-journal (or adm) group" in denied and "sudo usermod -aG systemd-journal $USER" in denied
    empty = explain_exit("ollama", 1, "Data from the specified boot (+0) is not available: No such boot ID in journal")
    assert "no entries yet: is Ollama installed as the systemd unit ollama?" in empty
    assert explain_exit("ollama", -9, "") == "journalctl -u ollama exited with status -9"


def test_unit_names() -> None:
    for bad in ["", "-D/tmp", "ollama service", "a;b", "x" * 256]:
        with pytest.raises(ValueError, match="not a systemd unit name"):
            JournalTail(bad)
    assert JournalTail("ollama.service").command("journalctl")[:2] == ["journalctl", "--unit=ollama.service"]


def test_json_nested_past_the_parsers_depth_is_counted_and_reading_goes_on(tmp_path: Path) -> None:
    """A line of arrays nested deeper than json goes (RecursionError) is one garbled line; the next entry counts."""
    tail = JournalTail("ollama", journal_dir=tmp_path)
    deep = b"[" * 20_000 + b"]" * 20_000  # 40 KB, under max_line_bytes
    assert len(deep) < tail.max_line_bytes
    good = json.dumps({"__REALTIME_TIMESTAMP": "1700000000250000", "MESSAGE": "prompt eval time = 10.00 ms / 2048 tokens"})
    nested_message = b'{"MESSAGE": ' + deep + b"}"
    events = tail.take_output(deep + b"\n" + nested_message + b"\n" + good.encode() + b"\n", 1.0)
    assert [(e.kind, e.tokens) for e in events] == [("prompt_eval", 2048)]
    assert tail.garbled_lines == 2 and tail.entries == 1


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT_S:g} s for {what}"
        time.sleep(0.02)


def test_a_quiet_journal_is_known_unchanged_without_reading(tmp_path: Path, tails: list[JournalTail]) -> None:
    """The runner reader asks ``unchanged()`` each step before sending a read to a worker thread: while journalctl
    prints nothing it says so (no read, no thread); an entry, or journalctl's end, makes it say read again."""
    require_journal_tools()
    journal = JournalFiles(tmp_path)
    journal.append([unit_entry("Started ollama.service", ts_us=now_us() - 1_000_000)])
    tail = JournalTail("ollama", journal_dir=tmp_path)
    tails.append(tail)
    assert not tail.unchanged(), "not started yet: read"
    following(tail)
    assert tail.unchanged(), "following, nothing new"
    journal.append([unit_entry(SLOT + "prompt processing, n_tokens = 64, progress = 0.25", ts_us=now_us())])
    wait_for(lambda: not tail.unchanged(), "the new entry to show")
    assert [e.tokens for e in read_until(tail, lambda got: len(got) >= 1)] == [64]
    assert tail.unchanged(), "read: nothing new again"
    assert tail.pid is not None
    os.kill(tail.pid, signal.SIGKILL)
    wait_for(lambda: not tail.unchanged(), "journalctl's end to show")
    tail.read(time.time())
    assert tail.problem is not None and "journalctl" in tail.problem, tail.problem

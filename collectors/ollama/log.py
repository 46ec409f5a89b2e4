"""Ollama's log as a second source of prefill progress: the lines its llama-server runner writes.

llama-server's lines carry no timestamp and no request id, so each is stamped when it is read, and
joined to a request by the reader. Formats seen across llama.cpp versions::

    slot update_slots: id  0 | task 0 | prompt processing progress, n_tokens = 2048, batch.n_tokens = 2048, progress = 0.511682
    slot update_slots: id  0 | task 0 | prompt processing done, n_tokens = 4002, batch.n_tokens = 418
    slot print_timing: id  0 | task 0 | prompt processing, n_tokens =   2048, progress = 0.51, t =   3.10 s / 660.42 ...
    slot print_timing: id  0 | task 0 | prompt eval time =  5843.21 ms /  4002 tokens (  1.46 ms per token, 684.91 ...)
           eval time =   160.34 ms /    16 tokens ( 10.02 ms per token,  99.79 tokens per second)

The lines that make a direct generation's record (``collectors.ollama.direct``), from the runner and from
Ollama itself::

    slot launch_slot_: id  0 | task 5 | processing task, is_child = 0
    slot   operator(): id  0 | task 5 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 1611
    slot      release: id  0 | task 5 | stop processing: n_tokens = 1618, truncated = 0
    [GIN] 2026/06/12 - 22:48:16 | 200 |     36.33s |       127.0.0.1 | POST     "/api/chat"
    time=… level=INFO source=… msg="starting llama-server" cmd="… --model <blob> --port 39511 …"
    time=… level=INFO source=… msg="llama-server started in 2.31 seconds"

Anything else is counted as unknown and skipped: format drift never stops the collector.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from analysis.runner_load import LoadLine, parse_load_line

# "id  0 | task 12 |" names the slot and the task; both optional so a bare message still parses.
_SLOT = r"(?:.*?\bid\s+(?P<slot>\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*)?"
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_PROGRESS = re.compile(
    _SLOT + r".*?prompt processing(?: progress)?,\s*n_tokens\s*=\s*(?P<n>\d+)"
    r"(?:,\s*batch\.n_tokens\s*=\s*(?P<batch>\d+))?,\s*progress\s*=\s*(?P<frac>" + _NUM + r")"
)
_DONE = re.compile(_SLOT + r".*?prompt processing done,\s*n_tokens\s*=\s*(?P<n>\d+)(?:,\s*batch\.n_tokens\s*=\s*(?P<batch>\d+))?")
_TIMING = re.compile(
    _SLOT + r".*?(?P<kind>prompt eval|eval|total) time\s*=\s*(?P<ms>" + _NUM + r")\s*ms\s*/\s*(?P<n>\d+)\s*tokens"
)
_LAUNCH = re.compile(_SLOT + r".*?processing task\b")
_NEW_PROMPT = re.compile(_SLOT + r".*?new prompt,.*?task\.n_tokens\s*=\s*(?P<n>\d+)")
_RELEASE = re.compile(_SLOT + r".*?stop processing:\s*n_tokens\s*=\s*(?P<n>\d+)")
# Ollama's access line (gin): local time to the second, status, latency (a Go duration), client, method, path.
_ACCESS = re.compile(
    r".*?\[GIN\]\s*(?P<stamp>\d{4}/\d{2}/\d{2} - \d{2}:\d{2}:\d{2})\s*\|\s*(?P<status>\d{3})\s*\|\s*(?P<latency>\S+)\s*\|"
    r'\s*(?P<client>\S*)\s*\|\s*(?P<method>[A-Z]+)\s+"(?P<path>[^"\s]{1,256})"'
)
_RUNNER_START = re.compile(r".*?starting llama[ -]server\b.*?--port[ =](?P<port>\d{1,5})\b")
_RUNNER_STARTED = re.compile(r".*?(?:llama-server|llama runner) started in (?P<s>" + _NUM + r") seconds")
_GO_DURATION_PART = re.compile(r"(" + _NUM + r")(h|ms|µs|μs|us|ns|m|s)")
_GO_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ns": 1e-9}
MAX_ACCESS_LATENCY_S = 7 * 24 * 3600.0  # a week: anything longer is not a reading


def go_duration_s(text: str) -> float | None:
    """A Go duration as gin prints it ("36.330512ms", "1m2s", "512.3µs") in seconds; None if it is not one."""
    parts = _GO_DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * _GO_UNIT_S[u] for n, u in parts)
    return seconds if seconds <= MAX_ACCESS_LATENCY_S else None


@dataclass(frozen=True)
class AccessLine:
    """One of Ollama's access lines: the HTTP request ended at ``ended_unix_s`` (to the second, local time)."""

    ended_unix_s: float  # the line's own stamp: the whole second the request ended in
    status: int
    latency_s: float
    client: str
    method: str
    path: str


@dataclass(frozen=True)
class LogEvent:
    """One understood line. ``kind``: progress | done | prompt_eval | eval | total (the runner's per-task lines),
    launch | new_prompt | release (a task's start, its prompt's size, its end), access (Ollama's access line),
    runner_start | runner_started (a load: the runner's port, then its load time), runner_load (one of the runner's
    load lines: where it put the model, ``analysis.runner_load``)."""

    kind: str
    read_unix_s: float  # when the line was read (the line itself has no time)
    tokens: int  # n_tokens of the progress line, or the token count of a timing line
    slot_id: int | None = None
    task_id: int | None = None
    fraction: float | None = None  # progress lines: prompt read so far / prompt size, as the runner printed it
    duration_ms: float | None = None  # timing lines; runner_started: the load time
    access: AccessLine | None = None
    port: int | None = None  # runner_start: the runner's port
    load: LoadLine | None = None  # runner_load: the fact the line carries

    @property
    def prompt_size_tokens(self) -> int | None:
        """The prompt size implied by a progress line (n_tokens / progress), when the fraction is usable."""
        if self.kind != "progress" or not self.fraction or self.fraction <= 0 or self.fraction > 1:
            return None
        return round(self.tokens / self.fraction)


def _ids(m: re.Match[str]) -> tuple[int | None, int | None]:
    slot, task = m.group("slot"), m.group("task")
    return (int(slot) if slot is not None else None, int(task) if task is not None and int(task) >= 0 else None)


def _access(line: str, read_unix_s: float) -> LogEvent | None:
    m = _ACCESS.match(line)
    if not m:
        return None
    latency_s = go_duration_s(m.group("latency"))
    try:
        stamp = time.mktime(time.strptime(m.group("stamp"), "%Y/%m/%d - %H:%M:%S"))  # gin prints local time
    except (ValueError, OverflowError):
        return None
    if latency_s is None:
        return None
    line_ = AccessLine(stamp, int(m.group("status")), latency_s, m.group("client")[:64], m.group("method"), m.group("path"))
    return LogEvent("access", read_unix_s, 0, access=line_)


def _task_line(line: str, read_unix_s: float) -> LogEvent | None:
    """A task's start, its prompt's size or its end."""
    for kind, pattern in (("release", _RELEASE), ("new_prompt", _NEW_PROMPT), ("launch", _LAUNCH)):
        m = pattern.match(line)
        if m:
            slot, task = _ids(m)
            if task is None:
                return None  # "task -1": no task yet
            return LogEvent(kind, read_unix_s, int(m.groupdict().get("n") or 0), slot, task)
    return None


def _load_line(line: str, read_unix_s: float) -> LogEvent | None:
    m = _RUNNER_START.match(line)
    if m:
        return LogEvent("runner_start", read_unix_s, 0, port=int(m.group("port")))
    m = _RUNNER_STARTED.match(line)
    if m:
        return LogEvent("runner_started", read_unix_s, 0, duration_ms=float(m.group("s")) * 1000)
    return None


def parse_line(line: str, read_unix_s: float) -> LogEvent | None:
    """The event a log line carries, or None for a line that is not one this module understands."""
    if "[GIN]" in line:
        return _access(line, read_unix_s)
    if (load := parse_load_line(line)) is not None:  # its own anchored, length-capped patterns
        return LogEvent("runner_load", read_unix_s, 0, load=load)
    if "llama-server" in line or "llama server" in line or "llama runner" in line:
        return _load_line(line, read_unix_s)
    if "task" in line and ("processing" in line or "new prompt" in line):
        event = _task_line(line, read_unix_s)
        if event is not None:
            return event
    if "time" not in line and "prompt processing" not in line:
        return None  # the common case, cheaply
    m = _DONE.match(line)
    if m:
        slot, task = _ids(m)
        return LogEvent("done", read_unix_s, int(m.group("n")), slot, task)
    m = _PROGRESS.match(line)
    if m:
        slot, task = _ids(m)
        try:
            frac: float | None = float(m.group("frac"))
        except ValueError:
            frac = None
        return LogEvent("progress", read_unix_s, int(m.group("n")), slot, task, fraction=frac)
    m = _TIMING.match(line)
    if m:
        slot, task = _ids(m)
        kind = {"prompt eval": "prompt_eval", "eval": "eval", "total": "total"}[m.group("kind")]
        return LogEvent(kind, read_unix_s, int(m.group("n")), slot, task, duration_ms=float(m.group("ms")))
    return None


def parse_lines(lines: Iterable[str], read_unix_s: float) -> list[LogEvent]:
    """The events among ``lines``, all stamped ``read_unix_s``; the rest (len(lines) - len(result)) are unknown."""
    return [event for line in lines if (event := parse_line(line, read_unix_s)) is not None]


class LogSource(Protocol):
    """Where Ollama's log is read from: a file (``LogTail``) or the systemd journal (``ollama_journal.JournalTail``)."""

    unknown_lines: int  # lines (or entries) read that are not progress or timing lines
    problem: str | None  # why nothing can be read now, in words; None while reading works

    def read(self, now_unix_s: float) -> list[LogEvent]: ...

    def close(self) -> None: ...


class LogTail:
    """Follows a log file as ``tail -F`` does: starts at its end, reopens it after rotation or truncation.

    ``read(now)`` returns the events of the lines written since the last call; lines it does not understand
    are counted in ``unknown_lines``. A missing or unreadable file is not an error: ``problem`` says why.
    """

    MAX_READ_BYTES = 1 << 20  # per call: a flood of output is read over several ticks

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        self.path = path
        self.unknown_lines = 0
        self.known_lines = 0
        self.problem: str | None = None
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self._from_start = from_start

    def read(self, now_unix_s: float) -> list[LogEvent]:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc.strerror or exc}"
            return []
        if not os.access(self.path, os.R_OK):  # said now, not once the file grows (it may stay quiet for hours)
            self.problem = f"cannot read {self.path}: {os.strerror(errno.EACCES)}"
            return []
        if self._inode != st.st_ino or st.st_size < self._offset:  # first read, rotated, or truncated
            first = self._inode is None
            self._inode = st.st_ino
            self._offset = st.st_size if first and not self._from_start else 0
            self._partial = b""
        if st.st_size == self._offset:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(self.MAX_READ_BYTES)
        except OSError as exc:
            self.problem = f"cannot read {self.path}: {exc.strerror or exc}"
            return []
        self.problem = None
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished line waits for its end
        events = parse_lines((raw.decode("utf-8", "replace") for raw in lines), now_unix_s)
        self.known_lines += len(events)
        self.unknown_lines += len(lines) - len(events)
        return events

    def close(self) -> None:
        """Nothing to release: the file is opened only while it is read."""

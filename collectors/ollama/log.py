"""Ollama's log as a second source of prefill progress: the lines its llama-server runner writes.

llama-server's lines carry no timestamp and no request id, so each is stamped when it is read, and
joined to a request by the reader. Formats seen across llama.cpp versions::

    slot update_slots: id  0 | task 0 | prompt processing progress, n_tokens = 2048, batch.n_tokens = 2048, progress = 0.511682
    slot update_slots: id  0 | task 0 | prompt processing done, n_tokens = 4002, batch.n_tokens = 418
    slot print_timing: id  0 | task 0 | prompt processing, n_tokens =   2048, progress = 0.51, t =   3.10 s / 660.42 ...
    slot print_timing: id  0 | task 0 | prompt eval time =  5843.21 ms /  4002 tokens (  1.46 ms per token, 684.91 ...)
           eval time =   160.34 ms /    16 tokens ( 10.02 ms per token,  99.79 tokens per second)

Anything else is counted as unknown and skipped: format drift never stops the collector.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

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


@dataclass(frozen=True)
class LogEvent:
    """One understood line. ``kind``: progress | done | prompt_eval | eval | total."""

    kind: str
    read_unix_s: float  # when the line was read (the line itself has no time)
    tokens: int  # n_tokens of the progress line, or the token count of a timing line
    slot_id: int | None = None
    task_id: int | None = None
    fraction: float | None = None  # progress lines: prompt read so far / prompt size, as the runner printed it
    duration_ms: float | None = None  # timing lines

    @property
    def prompt_size_tokens(self) -> int | None:
        """The prompt size implied by a progress line (n_tokens / progress), when the fraction is usable."""
        if self.kind != "progress" or not self.fraction or self.fraction <= 0 or self.fraction > 1:
            return None
        return round(self.tokens / self.fraction)


def _ids(m: re.Match[str]) -> tuple[int | None, int | None]:
    slot, task = m.group("slot"), m.group("task")
    return (int(slot) if slot is not None else None, int(task) if task is not None and int(task) >= 0 else None)


def parse_line(line: str, read_unix_s: float) -> LogEvent | None:
    """The event a log line carries, or None for a line that is not one of llama-server's progress/timing lines."""
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

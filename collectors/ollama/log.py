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

A line counts only in its exact form, from its first character: anyone who can reach the runner's port can
have text of their choosing copied into the log (an invalid grammar is echoed verbatim), so a fragment inside
another line is never read. A runner line is ``slot <function, 12 wide>: id N | task N | <message>`` after
llama.cpp's optional log prefix (``0.09.894.504 I ``, when the runner runs with timestamps and prefixes), or
one of the older timing block's bare lines (``       eval time = …``); an access line is gin's, its path quoted
as gin quotes it (``%#v``); a load line is Ollama's own ``time=… level=INFO source=… msg="…"``. Lines longer
than ``MAX_LOG_LINE_CHARS`` are not looked at. No pattern here stacks wildcards: each is anchored, and the
fields of a runner message are split on their commas, so a line costs time linear in its length (stacked lazy
wildcards once cost cubic time: a 28 KB line of repeated fragments took 85 s, ``bench/hostile_log_stall.py``).
Numbers that are not finite or beyond any reading are refused, never carried on to overflow later. The
runner reader reads and parses in a worker thread, off the loop that relays the proxy.

Anything else is counted as unknown and skipped: format drift never stops the collector.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from analysis.log_grammar import INT, MAX_LINE_CHARS, NUM, runner_line, slog_line, strip_llama_prefix, to_float, to_int
from analysis.prompt_fit import FitLine, fit_of
from analysis.runner_load_lines import LoadLine, listening_port, load_of
from analysis.runner_wait_lines import WaitLine, wait_of
from collectors.ollama.go_duration import MAX_GO_DURATION_S, go_duration_s
from collectors.ollama.mlx_log import MlxLine, parse_mlx_line

MAX_LOG_LINE_CHARS = MAX_LINE_CHARS  # the one cap (analysis.log_grammar), under the name this module's readers use
MAX_DURATION_MS = 7 * 24 * 3600 * 1000.0  # a week: a longer timing or load time is not a reading
MAX_ACCESS_LATENCY_S = MAX_GO_DURATION_S  # the same for an access line's latency

# A timing line, in its own message or bare as a line of the older timing block (its format pads it with spaces).
_TIMING = re.compile(
    r" *(?P<kind>prompt eval|eval|total) time = +(?P<ms>" + NUM + r") ms / +(?P<n>" + INT + r") tokens(?: \(.*\))?"
)
# Ollama's access line (gin, colours off): "[GIN] %v | %3d | %13v | %15s | %-7s %#v"; gin's %#v quotes the path as
# Go quotes a string, so a quote inside it is escaped and the line ends at the path's closing quote.
_ACCESS = re.compile(
    r"\[GIN\] (?P<stamp>[0-9]{4}/[0-9]{2}/[0-9]{2} - [0-9]{2}:[0-9]{2}:[0-9]{2}) \| (?P<status>[0-9]{3}) \|"
    r" *(?P<latency>[^\s|]{1,32}) \|"
    r' *(?P<client>[^\s|]{0,64}) \| (?P<method>[A-Z]{1,16}) +"(?P<path>(?:[^"\\\x00-\x1f]|\\.){1,256})"'
)
# Ollama's two lines of a load (llm/llama_server.go), older builds' words too.
RUNNER_START_MSGS = ("starting llama-server", "starting llama server")
_RUNNER_STARTED_MSG = re.compile(r"(?:llama-server|llama runner) started in (?P<s>" + NUM + r") seconds")
_PORT_ARG = re.compile(r"(?:^| )--port[ =](?P<port>[0-9]{1,5})(?= |$)")
_FIELD_KEY = re.compile(r"[A-Za-z_][\w.]{0,31}", re.ASCII)
_MAX_FIELDS = 16  # key = value pairs in one runner message; real ones have at most 4


@dataclass(frozen=True)
class AccessLine:
    """One of Ollama's access lines: the HTTP request ended at ``ended_unix_s`` (to the second, local time)."""

    ended_unix_s: float  # the line's own stamp: the whole second the request ended in
    status: int
    latency_s: float
    client: str  # as Ollama printed it: who sent the request is not verified by anything in the log
    method: str
    path: str  # as gin quoted it, escapes kept
    read_unix_s: float | None = None  # when it was read: the request ended no later (None: not known)


class EventKind(StrEnum):
    """What an understood log line is (``LogEvent.kind``). The values are the words the readers have always used."""

    PROGRESS = "progress"
    DONE = "done"
    PROMPT_EVAL = "prompt_eval"
    EVAL = "eval"
    TOTAL = "total"
    LAUNCH = "launch"
    NEW_PROMPT = "new_prompt"
    RELEASE = "release"
    ACCESS = "access"
    RUNNER_START = "runner_start"
    RUNNER_LISTENING = "runner_listening"
    RUNNER_STARTED = "runner_started"
    RUNNER_LOAD = "runner_load"
    PROMPT_FIT = "prompt_fit"
    RUNNER_WAIT = "runner_wait"
    MLX = "mlx"


# What each kind of line is, in words: one line per member (tests/collectors/ollama/test_log_event_kinds.py).
EVENT_KINDS: dict[EventKind, str] = {
    EventKind.PROGRESS: "the runner's prompt-reading progress for a task (n_tokens, progress)",
    EventKind.DONE: "the runner finished reading a task's prompt",
    EventKind.PROMPT_EVAL: "the runner's prompt eval timing line",
    EventKind.EVAL: "the runner's eval (decode) timing line",
    EventKind.TOTAL: "the runner's total timing line",
    EventKind.LAUNCH: "the runner launched a task on a slot",
    EventKind.NEW_PROMPT: "the size of a task's prompt",
    EventKind.RELEASE: "the runner released a task's slot",
    EventKind.ACCESS: "Ollama's access line (gin): route, status, latency, client",
    EventKind.RUNNER_START: "Ollama starting a runner: its port, from the command line",
    EventKind.RUNNER_LISTENING: "the runner's own last line of its start, naming its port",
    EventKind.RUNNER_STARTED: "Ollama's word that a runner loaded, with its load time",
    EventKind.RUNNER_LOAD: "one of the runner's load lines: where it put the model (analysis.runner_load_lines)",
    EventKind.PROMPT_FIT: "a prompt Ollama cut, or a start line with the settings in force (analysis.prompt_fit)",
    EventKind.RUNNER_WAIT: "a prompt-cache save or load, a context checkpoint, a re-processing (analysis.runner_wait_lines)",
    EventKind.MLX: "one of the MLX runner's per-request lines (collectors.ollama.mlx_log)",
}
# The runner's timing block names its lines in words.
_TIMING_KINDS = {"prompt eval": EventKind.PROMPT_EVAL, "eval": EventKind.EVAL, "total": EventKind.TOTAL}


@dataclass(frozen=True)
class LogEvent:
    """One understood line, of a kind in ``EVENT_KINDS``.

    ``slot_id`` and ``task_id`` are the runner's own (what its ``/slots`` shows, to confirm a line against);
    ``port`` is the runner's port where the line names it (a load line)."""

    kind: EventKind
    read_unix_s: float  # when the line was read (the line itself has no time)
    tokens: int  # n_tokens of the progress line, or the token count of a timing line
    slot_id: int | None = None
    task_id: int | None = None
    fraction: float | None = None  # progress lines: prompt read so far / prompt size, as the runner printed it
    duration_ms: float | None = None  # timing lines; runner_started: the load time
    access: AccessLine | None = None
    port: int | None = None  # runner_start: the runner's port
    load: LoadLine | None = None  # runner_load: the fact the line carries
    fit: FitLine | None = None  # prompt_fit: a cut prompt or a start line (analysis.prompt_fit)
    wait: WaitLine | None = None  # runner_wait: the wait the line tells of
    mlx: MlxLine | None = None  # mlx: one of the MLX runner's per-request lines (collectors.ollama.mlx_log)

    @property
    def prompt_size_tokens(self) -> int | None:
        """The prompt size implied by a progress line (n_tokens / progress), when the fraction is usable."""
        if self.kind is not EventKind.PROGRESS or not self.fraction or self.fraction <= 0 or self.fraction > 1:
            return None
        return round(self.tokens / self.fraction)


_int = to_int
_float = to_float


def _fields(text: str) -> dict[str, str] | None:
    """``key = value, key = value`` (llama.cpp's runner messages) split on commas, not matched: a value holds
    no comma in these lines. None when a part is not ``key = value`` or a key repeats."""
    parts = text.split(",", _MAX_FIELDS)
    if len(parts) > _MAX_FIELDS:
        return None
    out: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not _FIELD_KEY.fullmatch(key) or key in out:
            return None
        out[key] = value.strip()
    return out


def _access(line: str, read_unix_s: float) -> LogEvent | None:
    m = _ACCESS.fullmatch(line)
    if not m:
        return None
    latency_s = go_duration_s(m.group("latency"))
    try:
        stamp = time.mktime(time.strptime(m.group("stamp"), "%Y/%m/%d - %H:%M:%S"))  # gin prints local time
    except (ValueError, OverflowError):
        return None
    if latency_s is None:
        return None
    line_ = AccessLine(
        stamp, int(m.group("status")), latency_s, m.group("client"), m.group("method"), m.group("path"), read_unix_s
    )
    return LogEvent(EventKind.ACCESS, read_unix_s, 0, access=line_)


def _ollama_line(line: str, read_unix_s: float) -> LogEvent | None:
    """One of Ollama's own lines (Go's slog): a cut prompt or a start line with the settings in force
    (``analysis.prompt_fit``), or one of the two a load writes."""
    slog = slog_line(line)
    if slog is None:
        return None
    if (fit := fit_of(slog)) is not None:
        return LogEvent(EventKind.PROMPT_FIT, read_unix_s, 0, fit=fit)
    if slog.level != "INFO":
        return None
    if slog.msg in RUNNER_START_MSGS:
        if slog.keys != ("cmd",):
            return None
        ports = {int(p.group("port")) for p in _PORT_ARG.finditer(slog.attrs["cmd"])}
        if len(ports) != 1:
            return None  # none, or two that disagree: not a command line to believe
        [port] = ports
        return LogEvent(EventKind.RUNNER_START, read_unix_s, 0, port=port) if 0 < port < 65536 else None
    started = _RUNNER_STARTED_MSG.fullmatch(slog.msg)
    if started and not slog.attrs:
        took_s = _float(started.group("s"), MAX_DURATION_MS / 1000)
        return LogEvent(EventKind.RUNNER_STARTED, read_unix_s, 0, duration_ms=took_s * 1000) if took_s is not None else None
    return None


def _timing(text: str, read_unix_s: float, slot: int | None, task: int | None) -> LogEvent | None:
    m = _TIMING.fullmatch(text)
    if not m:
        return None
    ms, n = _float(m.group("ms"), MAX_DURATION_MS), _int(m.group("n"))
    if ms is None or n is None:
        return None
    kind = _TIMING_KINDS[m.group("kind")]
    return LogEvent(kind, read_unix_s, n, slot, task, duration_ms=ms)


def _progress(rest: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    f = _fields(rest)
    n = _int(f.get("n_tokens")) if f else None
    if f is None or n is None or ("batch.n_tokens" in f and _int(f["batch.n_tokens"]) is None):
        return None
    frac = _float(f.get("progress"), 1e6)
    return LogEvent(EventKind.PROGRESS, read_unix_s, n, slot, task, fraction=frac) if frac is not None else None


def _done(rest: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    f = _fields(rest)
    n = _int(f.get("n_tokens")) if f else None
    return LogEvent(EventKind.DONE, read_unix_s, n, slot, task) if n is not None else None


def _launch(rest: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    if rest and _fields(rest) is None:  # "processing task, is_child = 0"; older builds print no fields
        return None
    return LogEvent(EventKind.LAUNCH, read_unix_s, 0, slot, task) if task is not None else None


def _new_prompt(rest: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    f = _fields(rest)
    n = _int(f.get("task.n_tokens")) if f else None
    return LogEvent(EventKind.NEW_PROMPT, read_unix_s, n, slot, task) if n is not None and task is not None else None


def _release(rest: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    f = _fields(rest)
    n = _int(f.get("n_tokens")) if f else None
    return LogEvent(EventKind.RELEASE, read_unix_s, n, slot, task) if n is not None and task is not None else None


# A slot message's head (the text before its first ", ") and what reads the rest. Newer builds print "prompt
# processing" where older ones printed "prompt processing progress".
_SLOT_HEADS: dict[str, Callable[[str, float, int, int | None], LogEvent | None]] = {
    "prompt processing progress": _progress,
    "prompt processing": _progress,
    "prompt processing done": _done,
    "processing task": _launch,
    "new prompt": _new_prompt,
}


def _slot_message(msg: str, read_unix_s: float, slot: int, task: int | None) -> LogEvent | None:
    """The message of a ``slot …: id N | task N |`` line: its head names it, its fields are split, not matched."""
    head, _, rest = msg.partition(", ")
    if (read := _SLOT_HEADS.get(head)) is not None:
        return read(rest, read_unix_s, slot, task)
    stop, colon, rest = msg.partition(": ")
    if stop == "stop processing" and colon:
        return _release(rest, read_unix_s, slot, task)
    return _timing(msg, read_unix_s, slot, task)


def _runner_line(text: str, read_unix_s: float) -> LogEvent | None:
    """A line llama-server wrote, after its optional log prefix: a load line (``analysis.runner_load_lines``), a wait
    (``analysis.runner_wait_lines``), a slot line, or a bare line of the older timing block."""
    line = runner_line(text)
    if line is None:
        return _timing(strip_llama_prefix(text), read_unix_s, None, None)  # the older timing block's own lines
    if (load := load_of(line)) is not None:
        return LogEvent(EventKind.RUNNER_LOAD, read_unix_s, 0, load=load)
    if (port := listening_port(line)) is not None:
        return LogEvent(EventKind.RUNNER_LISTENING, read_unix_s, 0, port=port)
    if (wait := wait_of(line)) is not None:
        return LogEvent(EventKind.RUNNER_WAIT, read_unix_s, 0, wait.slot_id, wait.task_id, wait=wait)
    if not line.is_slot:
        return None
    assert line.slot_id is not None
    return _slot_message(line.message, read_unix_s, line.slot_id, line.task_id)


def parse_line(line: str, read_unix_s: float) -> LogEvent | None:
    """The event a log line carries, or None for a line that is not one this module understands. Each line is split
    once by ``analysis.log_grammar``; what it says is read from the message that is left.

    Time is linear in the line's length, which is at most ``MAX_LOG_LINE_CHARS`` (a longer line is None at once)."""
    if len(line) > MAX_LOG_LINE_CHARS:
        return None
    line = line.rstrip("\r")
    if line.startswith("[GIN] "):
        return _access(line, read_unix_s)
    if line.startswith("time="):
        if (mlx := parse_mlx_line(line)) is not None:  # the MLX runner's own lines: its anchored, whole-line patterns
            return LogEvent(EventKind.MLX, read_unix_s, 0, mlx=mlx)
        return _ollama_line(line, read_unix_s)
    return _runner_line(line, read_unix_s)


def parse_lines(lines: Iterable[str], read_unix_s: float) -> list[LogEvent]:
    """The events among ``lines``, all stamped ``read_unix_s``; the rest (len(lines) - len(result)) are unknown."""
    return [event for line in lines if (event := parse_line(line, read_unix_s)) is not None]


class LogSource(Protocol):
    """Where Ollama's log is read from: a file (``LogTail``) or the systemd journal (``ollama_journal.JournalTail``)."""

    unknown_lines: int  # lines (or entries) read that are not progress or timing lines
    problem: str | None  # why nothing can be read now, in words; None while reading works

    @property
    def watched_path(self) -> Path | None:
        """The file whose changes the kernel can tell of (collectors.ollama.log_watch); None: look every step."""
        ...

    def read(self, now_unix_s: float) -> list[LogEvent]: ...

    def unchanged(self) -> bool:
        """True only when a ``read()`` now would surely find nothing (cheap to ask: no read, no thread)."""
        ...

    def close(self) -> None: ...


class LogTail:
    """Follows a log file as ``tail -F`` does: starts at its end, reopens it after rotation or truncation.

    ``read(now)`` returns the events of the lines written since the last call; lines it does not understand
    are counted in ``unknown_lines``. A missing or unreadable file is not an error: ``problem`` says why.
    A line longer than ``MAX_LOG_LINE_CHARS`` bytes is dropped and counted in ``long_lines``, its unfinished
    part too (as the journal reader does): memory stays bounded however long a line grows.
    """

    MAX_READ_BYTES = 1 << 20  # per call: a flood of output is read over several ticks

    def __init__(self, path: Path, *, from_start: bool = False) -> None:
        self.path = path
        self.watched_path: Path | None = path
        self.unknown_lines = 0
        self.known_lines = 0
        self.problem: str | None = None
        self._inode: int | None = None
        self._offset = 0
        self._partial = b""
        self._dropping = False  # inside a line longer than MAX_LOG_LINE_CHARS: skip to its end
        self.long_lines = 0  # lines dropped for their length (counted in unknown_lines too)
        self._from_start = from_start
        self._read_to: tuple[int, int, int] | None = None  # (inode, size, ctime) of a file read to its end

    def unchanged(self) -> bool:
        """True when the file is the one read last, read to its end then, and neither written nor its mode or owner
        changed since (its ctime moves on any of them): a ``read()`` would find nothing. One stat, no open, so the
        caller can skip a worker thread's round trip four times a second while Ollama is quiet."""
        if self._read_to is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False  # read() says why
        return (st.st_ino, st.st_size, st.st_ctime_ns) == self._read_to

    def read(self, now_unix_s: float) -> list[LogEvent]:
        self._read_to = None
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
            self._partial, self._dropping = b"", False
        if st.st_size == self._offset:
            if self.problem is None:
                self._read_to = (st.st_ino, st.st_size, st.st_ctime_ns)
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
        if self._dropping:  # inside an over-long line, already counted
            if lines:
                lines.pop(0)  # its end: not a line of its own
                self._dropping = False
            else:
                self._partial = b""  # more of it
        if len(self._partial) > MAX_LOG_LINE_CHARS:  # never kept whole: dropped now, and its rest when it comes
            self._partial, self._dropping = b"", True
            self._long(1)
        kept = [raw for raw in lines if len(raw) <= MAX_LOG_LINE_CHARS]
        self._long(len(lines) - len(kept))
        events = parse_lines((raw.decode("utf-8", "replace") for raw in kept), now_unix_s)
        self.known_lines += len(events)
        self.unknown_lines += len(kept) - len(events)
        return events

    def _long(self, n: int) -> None:
        self.long_lines += n
        self.unknown_lines += n

    def close(self) -> None:
        """Nothing to release: the file is opened only while it is read."""

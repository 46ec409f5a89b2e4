"""The one grammar of the lines Ollama's log holds: its runner's (llama.cpp's ``llama-server``) and Ollama's own.

Every reader of the log (``collectors.ollama.log``, ``analysis.runner_load_lines``, ``analysis.runner_wait_lines``,
``analysis.prompt_fit``, ``store import-log``) splits a line here and reads only the message that is left. The
forms, as the programs print them (docs/ollama-api.md §13):

* llama.cpp's optional log prefix (``common/log.cpp``; Ollama starts its runner with ``--no-log-prefix
  --no-log-timestamps``, so only a runner started by hand has it): ``M.SS.mmm.uuu `` (minutes, seconds,
  milliseconds, microseconds, only with the level) then one level letter of ``LLAMA_LEVELS`` and a space::

      0.09.894.504 I slot launch_slot_: id  0 | task 5 | processing task, is_child = 0

* llama-server's tagged line (``tools/server``: ``"slot %12.*s: id %2d | task %d | "`` and ``"srv  %12.*s: "``):
  a 4-character module tag padded to 5, the printing function's name cut to 12 and right-aligned in 12, a colon.
  A slot line then names its slot (``%2d``) and task (``-1``: none)::

      slot   operator(): id  0 | task 1112 | new prompt, n_ctx_slot = 20480, n_keep = 0, task.n_tokens = 272
      srv  get_availabl: prompt cache update took 1.08 ms

* a plain llama.cpp line: ``<function>: <message>`` (``load_tensors: offloaded 49/49 layers to GPU``).

* Ollama's own line, Go's slog text handler with its source: ``time=<RFC 3339, ms> level=<LEVEL>
  source=<file.go:line> msg=<value>`` then ``key=value`` attributes; a value is Go-quoted (``strconv.Quote``)
  when it holds a space, ``=``, ``"`` or what is not printable, bare otherwise::

      time=2026-12-04T18:31:01.404+00:00 level=INFO source=llama_server.go:431 msg="starting llama-server" cmd="…"

* gin's access line (``[GIN] %v | %3d | %13v | %15s | %-7s %#v``), read by ``collectors.ollama.log``.

A line is one of these from its first character or it is none of them: anyone who can reach Ollama's API can have
whole lines of their choosing printed into the log (the runner echoes an invalid grammar or JSON schema verbatim,
newlines kept), so the form decides nothing on its own; what a line says counts only once another channel
confirms it (each reader says which). No pattern stacks wildcards; every field and line is length-capped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

# The longest line any reader looks at: Ollama's "server config" line lists every OLLAMA_* variable (OLLAMA_ORIGINS
# is long), its "starting llama-server" line the runner's command line (under 1 KiB with long paths); the runner's
# lines are under 300 characters.
MAX_LINE_CHARS = 8192
MAX_ATTRS = 32  # key=value attributes of one slog line (Ollama's longest, "inference compute", has 12)

# Bounded digit runs: a longer number is not a reading (and int() of thousands of digits is refused by Python).
INT = r"[0-9]{1,18}"
NUM = r"[0-9]{1,15}(?:\.[0-9]{1,9})?"
_INT_RE = re.compile(INT)
_NUM_RE = re.compile(NUM)

LLAMA_LEVELS = "IWED"  # common/log.cpp: info, warn, error, debug (other levels print no letter and no time)
_LLAMA_PREFIX = re.compile(r"(?:[0-9]{1,9}\.[0-9]{2}\.[0-9]{3}\.[0-9]{3} )?[" + LLAMA_LEVELS + r"] ")
# llama-server's module tags, each printed 5 wide ("srv  ", "slot ").
TAGS = ("slot", "srv", "que", "res", "cmn", "spec")
_TAGGED = re.compile(r"(?P<tag>slot|srv |que |res |cmn |spec) (?P<func>[ A-Za-z0-9_()]{12}): ")
# A C function name as __func__ gives it; a lambda's is "operator()". Cut to 12 by the format.
_FUNC = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,11}|operator\(\)")
# "id %2d | task %d | ": one space before a one-digit slot id; task -1 when the slot holds none.
_SLOT_IDS = re.compile(r"id (?P<slot> [0-9]|[1-9][0-9]{1,3}) \| task (?P<task>-1|0|[1-9][0-9]{0,17}) \| ")
_PLAIN = re.compile(r"(?P<func>[A-Za-z_][A-Za-z0-9_]{0,63}): ")

SLOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR")
# Go's slog: time in RFC 3339 to the millisecond, its zone as Z or ±hh:mm.
_SLOG_HEAD = re.compile(
    r"time=(?P<time>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}(?:Z|[+-][0-9]{2}:[0-9]{2}))"
    r" level=(?P<level>TRACE|DEBUG|INFO|WARN|ERROR) source=(?P<source>[A-Za-z0-9_.-]{1,64}\.go:[0-9]{1,6}) msg="
)
_QUOTED = r'"(?:[^"\\\x00-\x1f]|\\.)*"'
_BARE = r'[^\s"=\x00-\x1f]+'
_VALUE = re.compile(_QUOTED + "|" + _BARE)
_ATTR = re.compile(r" (?P<key>[A-Za-z_][A-Za-z0-9_.]{0,63})=(?P<value>" + _QUOTED + "|" + _BARE + ")")
_GO_ESCAPE = re.compile(r'\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|[abfnrtv\\"])')
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}


def strip_llama_prefix(line: str) -> str:
    """The line without llama.cpp's log prefix (its time and level letter), when it has one."""
    m = _LLAMA_PREFIX.match(line)
    return line[m.end() :] if m else line


@dataclass(frozen=True)
class RunnerLine:
    """A line llama-server wrote, split: its module tag ("" for a plain llama.cpp line), the function that printed it,
    for a slot line its slot and task (None: ``task -1``), and its message."""

    tag: str
    func: str
    message: str
    slot_id: int | None = None
    task_id: int | None = None

    @property
    def is_slot(self) -> bool:
        return self.tag == "slot"


def runner_line(line: str) -> RunnerLine | None:
    """``line`` as one of llama-server's lines (after its optional prefix), or None. A tagged line's function name
    must be exactly the 12 characters the format prints; a slot line must name its slot and task."""
    if len(line) > MAX_LINE_CHARS:
        return None
    text = strip_llama_prefix(line.rstrip("\r\n"))
    m = _TAGGED.match(text)
    if m is not None:
        func = m.group("func").lstrip(" ")
        if not _FUNC.fullmatch(func):
            return None
        tag = m.group("tag").rstrip()
        rest = text[m.end() :]
        if tag != "slot":
            return RunnerLine(tag, func, rest)
        ids = _SLOT_IDS.match(rest)
        if ids is None:
            return None
        task = int(ids.group("task"))
        return RunnerLine(tag, func, rest[ids.end() :], int(ids.group("slot")), task if task >= 0 else None)
    m = _PLAIN.match(text)
    if m is None:
        return None
    return RunnerLine("", m.group("func"), text[m.end() :])


def go_unquote(text: str) -> str | None:
    """A Go-quoted string's content (``strconv.Quote``'s escapes), or None when ``text`` is not one."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return None
    body = text[1:-1]
    if "\\" not in body:
        return body if '"' not in body else None
    out: list[str] = []
    pos = 0
    for m in _GO_ESCAPE.finditer(body):
        chunk = body[pos : m.start()]
        if "\\" in chunk or '"' in chunk:
            return None  # an escape Go never writes, or a bare quote
        out.append(chunk)
        esc = m.group()[1:]
        if esc[0] in "xuU":
            code = int(esc[1:], 16)
            if code > 0x10FFFF:
                return None
            out.append(chr(code))
        elif esc[0] in "01234567":
            out.append(chr(int(esc, 8)))
        else:
            out.append(_SIMPLE_ESCAPES[esc])
        pos = m.end()
    tail = body[pos:]
    if "\\" in tail or '"' in tail:
        return None
    out.append(tail)
    return "".join(out)


def _value(text: str) -> str | None:
    return go_unquote(text) if text.startswith('"') else text


@dataclass(frozen=True)
class SlogLine:
    """One of Ollama's own lines: its time as printed, level, source, message and attributes (values unquoted, in
    the order printed; a key printed twice makes it not a line of Ollama's)."""

    time: str
    level: str
    source: str
    msg: str
    attrs: dict[str, str]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.attrs)


def slog_line(line: str) -> SlogLine | None:
    """``line`` as one of Ollama's slog lines, from its first character to its last, or None."""
    if len(line) > MAX_LINE_CHARS or not line.startswith("time="):
        return None
    line = line.rstrip("\r\n")
    head = _SLOG_HEAD.match(line)
    if head is None:
        return None
    msg_m = _VALUE.match(line, head.end())
    if msg_m is None:
        return None
    msg = _value(msg_m.group())
    if msg is None:
        return None
    attrs: dict[str, str] = {}
    pos = msg_m.end()
    while pos < len(line):
        m = _ATTR.match(line, pos)
        if m is None or len(attrs) >= MAX_ATTRS or m.group("key") in attrs:
            return None
        value = _value(m.group("value"))
        if value is None:
            return None
        attrs[m.group("key")] = value
        pos = m.end()
    return SlogLine(head.group("time"), head.group("level"), head.group("source"), msg, attrs)


def slog_time_unix_s(slog: SlogLine) -> float | None:
    """The slog line's own time as a Unix time (its zone given: Z or an offset)."""
    try:
        return datetime.fromisoformat(slog.time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def to_int(text: str | None) -> int | None:
    """A count as the programs print it: digits only, at most 18 (it fits 64 bits)."""
    return int(text) if text is not None and _INT_RE.fullmatch(text) else None


def to_float(text: str | None, limit: float) -> float | None:
    """A decimal as the programs print it, finite and at most ``limit``; None otherwise (never inf, never raises)."""
    if text is None or not _NUM_RE.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and value <= limit else None

"""Ollama's log as sim writes it: what ``ollama serve`` writes, on stdout and, with ``--log-file``, to a file.

A service (systemd, ``ollama serve > ollama.log 2>&1``) keeps one stream of lines; the collector's log and
journal readers (``collectors.ollama.log``, ``collectors.ollama.journal``) read that stream, so sim writes the
same lines, in the same formats:

* Ollama's access line per HTTP request, when it ends (gin)::

      [GIN] 2026/06/12 - 22:48:16 | 200 |     36.33s |       127.0.0.1 | POST     "/api/chat"

* Ollama's own lines (slog's text format) at each load::

      time=2026-06-12T22:48:14.120+02:00 level=INFO source=llama_server.go:431 msg="starting llama-server" cmd="…"
      time=2026-06-12T22:48:16.430+02:00 level=INFO source=llama_server.go:1362 msg="llama-server started in 2.31 seconds"

* with ``--engine llama-server``, every line the runner writes, as it writes them (Ollama starts it with
  ``--log-verbosity 4 --no-log-prefix --no-log-timestamps``, so they carry no time and no request id).
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TextIO

_lock = threading.Lock()
_file: TextIO | None = None
ROTATION_KEPT = 5  # the apps' server.log and the older ones beside it: server-1.log … server-4.log


def rotate(path: Path, kept: int = ROTATION_KEPT) -> None:
    """Rename ``path`` as Ollama's desktop apps do at each server start: ``server-N.log`` → ``server-(N+1).log`` from
    the oldest kept down, then ``server.log`` → ``server-1.log``; the oldest beyond ``kept`` is overwritten."""

    def numbered(n: int) -> Path:
        return path.with_name(f"{path.stem}-{n}{path.suffix}")

    for n in range(kept - 2, 0, -1):
        if numbered(n).exists():
            numbered(n).replace(numbered(n + 1))
    if path.exists():
        path.replace(numbered(1))


def open_file(path: Path) -> None:
    """Also append every line to ``path`` (created if missing), line by line, as a service's log file."""
    global _file
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock:
        _file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - open for the process's life


def close_file() -> None:
    global _file
    with _lock:
        if _file is not None:
            _file.close()
            _file = None


def line(text: str) -> None:
    """One line of the log, on stdout and in the log file."""
    with _lock:
        print(text, file=sys.stdout, flush=True)
        if _file is not None:
            _file.write(text + "\n")


def go_quote(value: str) -> str:
    """slog's text format: a value with spaces, quotes or '=' is quoted, Go-style."""
    if value and not any(c in value for c in ' "=\\') and value.isprintable():
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def slog(msg: str, *, source: str, level: str = "INFO", **attrs: object) -> None:
    """One of Ollama's own lines (Go's slog text handler)."""
    now = datetime.now().astimezone()
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}" + now.strftime("%z")
    stamp = stamp[:-2] + ":" + stamp[-2:]  # Go's RFC 3339 offset: +02:00
    parts = [f"time={stamp}", f"level={level}", f"source={source}", f"msg={go_quote(msg)}"]
    parts += [f"{key}={go_quote(str(value))}" for key, value in attrs.items()]
    line(" ".join(parts))


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def strconv_quote(value: str) -> str:
    """Go's ``strconv.Quote`` (what ``%#v`` prints for a string): in double quotes, a quote and a backslash escaped,
    what is not printable as \\n, \\xNN, \\uNNNN or \\UNNNNNNNN; a byte that was not UTF-8 (decoded with
    surrogateescape) as \\xNN."""
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def access(status: int, duration: str, client: str, method: str, path: str) -> None:
    """Ollama's access line for one HTTP request, written when it ends (local time, to the second). gin's default
    format: ``"[GIN] %v | %3d | %13v | %15s | %-7s %#v"``; the path (with ``?`` and the raw query when there is one)
    Go-quoted, so a path holding a quote or a newline stays one line whose end is known."""
    stamp = time.strftime("%Y/%m/%d - %H:%M:%S")
    line(f"[GIN] {stamp} | {status:3d} | {duration:>13} | {client:>15} | {method:<8} {strconv_quote(path)}")

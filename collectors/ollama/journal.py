"""Ollama's log read from the systemd journal: the second way to read it, beside a log file (``collectors.ollama.log``).

On Linux, Ollama installed by its install script runs as the systemd unit ``ollama``; its log, its runners'
lines included, goes to the journal (``journalctl -u ollama``). ``JournalTail`` runs
``journalctl --unit UNIT --follow --output json`` as a child process, reads its lines without blocking (its
stdout is a non-blocking pipe, read on each ``read()`` call) and gives the same ``LogEvent``s as ``LogTail``.

Each event carries the entry's own ``__REALTIME_TIMESTAMP`` (when journald received the line) instead of the
time it was read: that is the time the runner wrote it, give or take the pipe, not the time a 4 Hz poll found
it, and it stays right for entries that arrive late (a busy machine, a restarted journalctl catching up).

Nothing here raises into the collector: a missing journalctl, a journal with no entries for the unit, a
journalctl that exits (a user outside the ``systemd-journal``/``adm`` groups sees nothing) all set
``problem`` to what happened and what to do; journalctl is started again with backoff, after the last entry
it delivered (``--after-cursor``) so nothing written meanwhile is lost. Lines that are not JSON entries are
counted in ``garbled_lines``, messages that are not progress or timing lines in ``unknown_lines``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collectors.ollama.log import LogEvent, parse_lines

MAX_READ_BYTES = 1 << 20  # of journalctl's output per read() call: a flood is read over several ticks
MAX_LINE_BYTES = 64 << 10  # one JSON entry; a longer line is dropped and counted (a runner line is < 1 KiB)
MAX_STDERR_BYTES = 4 << 10  # the tail of journalctl's stderr kept to explain an exit
RESTART_MIN_S = 1.0  # first wait before journalctl is started again; doubles on each exit...
RESTART_MAX_S = 60.0  # ...up to this
RESTART_RESET_AFTER_S = 30.0  # a journalctl that ran this long before it exited starts again after RESTART_MIN_S
NO_ENTRIES_AFTER_S = 10.0  # no entry at all for the unit this long after a start: say so
CLOSE_TIMEOUT_S = 2.0  # on close, journalctl gets this long to exit after SIGTERM, then is killed
EXIT_GRACE_S = 0.1  # the same for a journalctl that closed its output (read() must not stall the collector)

# systemd unit names: letters, digits and ":-_.\@", at most 255 characters (systemd.unit(5)).
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,255}")
_GROUP_HINT = (
    "your user may not be allowed to read the system journal: add it to the systemd-journal (or adm) group "
    "(sudo usermod -aG systemd-journal $USER, then log in again) or run the collector as a user in it"
)


def valid_unit_name(text: str) -> bool:
    return bool(_UNIT_NAME.fullmatch(text)) and not text.startswith("-")


def explain_exit(unit: str, rc: int | None, said: str) -> str:
    """What journalctl's exit means, from its status and its last words on stderr, and what to do."""
    why = f"journalctl -u {unit} exited with status {rc}" + (f": {said}" if said else "")
    if re.search(r"permission|not seeing messages|insufficient|No journal files", said, re.IGNORECASE):
        return f"{why}; {_GROUP_HINT}"
    if "boot" in said and "not available" in said:  # --follow over a journal with no entries at all
        return f"{why}; the journal has no entries yet: is Ollama installed as the systemd unit {unit}?"
    return why


def message_text(value: Any) -> str | None:
    """MESSAGE as journalctl's JSON gives it: a string, or an array of bytes when it is not valid UTF-8
    (or holds control characters); None for anything else (null: a field too large to print)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b <= 255 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


class JournalTail:
    """Follows one systemd unit's entries in the journal; ``read(now)`` returns the events since the last call.

    ``journal_dir``: read the journal files in that folder (``journalctl -D``) instead of the system's, for
    tests and debugging. ``close()`` stops journalctl and reaps it.
    """

    def __init__(
        self,
        unit: str,
        *,
        journal_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        max_read_bytes: int = MAX_READ_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_stderr_bytes: int = MAX_STDERR_BYTES,
        restart_min_s: float = RESTART_MIN_S,
        restart_max_s: float = RESTART_MAX_S,
        no_entries_after_s: float = NO_ENTRIES_AFTER_S,
    ) -> None:
        if not valid_unit_name(unit):
            raise ValueError(f"{unit!r} is not a systemd unit name")
        self.unit = unit
        self.journal_dir = journal_dir
        self._env = dict(os.environ if env is None else env)
        self.max_read_bytes = max_read_bytes
        self.max_line_bytes = max_line_bytes
        self.max_stderr_bytes = max_stderr_bytes
        self.restart_min_s = restart_min_s
        self.restart_max_s = restart_max_s
        self.no_entries_after_s = no_entries_after_s
        self.problem: str | None = None
        self.watched_path: Path | None = None  # journalctl's pipe is read every step: no file to watch
        self.known_lines = 0
        self.unknown_lines = 0  # entries whose message is not a progress or timing line
        self.garbled_lines = 0  # output lines that are not a JSON entry (or longer than max_line_bytes)
        self.entries = 0  # entries of the unit read, the skipped backlog entry included
        self.attempts = 0  # tries to start journalctl
        self.starts = 0  # ...that started it
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_s = 0.0  # monotonic
        self._started_unix_s = 0.0
        self._first_entry = True  # the first entry after a start without a cursor may be the unit's last old one
        self._cursor: str | None = None  # of the last entry read: where a restarted journalctl resumes
        self._partial = b""
        self._dropping = False  # inside a line longer than max_line_bytes: skip to its end
        self._stderr = b""
        self._backoff_s = restart_min_s
        self._next_start_s = 0.0  # monotonic; 0: start on the first read
        self._closed = False

    # -- the child --------------------------------------------------------------------------------

    def command(self, journalctl: str) -> list[str]:
        cmd = [journalctl, f"--unit={self.unit}", "--follow", "--output=json", "--no-pager"]
        # json prints __CURSOR and __REALTIME_TIMESTAMP always; the rest of an entry (command line, pid, ...) is
        # not needed (--output-fields: systemd >= 236).
        cmd.append("--output-fields=MESSAGE")
        if self._cursor is not None:
            cmd += [f"--after-cursor={self._cursor}", "--lines=all"]  # resume: what was written meanwhile
        else:
            # One old entry, not none: it shows the unit has entries (see _check_no_entries) and is not news.
            cmd.append("--lines=1")
        if self.journal_dir is not None:
            cmd.append(f"--directory={self.journal_dir}")
        return cmd

    def _start(self, now_s: float) -> None:
        self.attempts += 1
        journalctl = shutil.which("journalctl", path=self._env.get("PATH", os.defpath))
        if journalctl is None:
            self._schedule_restart(now_s, ran_s=0.0)
            self.problem = (
                f"journalctl is not installed or not on PATH, so unit {self.unit}'s log cannot be read; install "
                f"systemd's journalctl, or give Ollama's log file with --ollama-log PATH instead "
                f"({self._retrying})"
            )
            return
        env = {**self._env, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": ""}
        try:
            proc = subprocess.Popen(
                self.command(journalctl),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                bufsize=0,
            )
        except OSError as exc:
            self._schedule_restart(now_s, ran_s=0.0)
            self.problem = f"cannot start {journalctl}: {exc.strerror or exc} ({self._retrying})"
            return
        assert proc.stdout is not None and proc.stderr is not None
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(proc.stderr.fileno(), False)
        self._proc = proc
        self.starts += 1
        self._started_s = now_s
        self._started_unix_s = time.time()  # journal timestamps are this machine's wall clock
        self._first_entry = self._cursor is None
        self._partial, self._dropping, self._stderr = b"", False, b""

    def _schedule_restart(self, now_s: float, *, ran_s: float) -> None:
        """Set when journalctl is started next: the wait doubles on each failure, up to restart_max_s."""
        if ran_s >= RESTART_RESET_AFTER_S:
            self._backoff_s = self.restart_min_s
        self._next_start_s = now_s + self._backoff_s
        self._backoff_s = min(self.restart_max_s, self._backoff_s * 2)

    @property
    def _retrying(self) -> str:
        # The same words on each retry, so the collector's log says it once, not once per retry.
        return f"trying again after {self.restart_min_s:g} s, then less often, at least every {self.restart_max_s:g} s"

    def _reap(self, proc: subprocess.Popen[bytes], now_s: float) -> None:
        """journalctl ended: say why, in words, and schedule the next start."""
        self._read_stderr(proc)
        rc = _end(proc, grace_s=EXIT_GRACE_S)  # it closed its output: it is exiting, and the collector's loop waits
        self._schedule_restart(now_s, ran_s=now_s - self._started_s)
        self.problem = f"{explain_exit(self.unit, rc, self._stderr_text())} ({self._retrying})"

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        try:
            while chunk := os.read(proc.stderr.fileno(), 1 << 14):
                self._stderr = (self._stderr + chunk)[-self.max_stderr_bytes :]
        except OSError:  # BlockingIOError: nothing more for now
            pass

    def _stderr_text(self) -> str:
        lines = [line.strip() for line in self._stderr.decode("utf-8", "replace").splitlines() if line.strip()]
        return " / ".join(lines[-3:])

    # -- reading ----------------------------------------------------------------------------------

    def unchanged(self) -> bool:
        """True while journalctl runs, has shown its first entry and printed nothing since the last read: one
        zero-timeout ``select`` on its pipes, so a quiet journal costs no worker thread's round trip each step (it
        cost four a second). A pipe at its end reads as ready, so journalctl's exit is read, and said, at once."""
        proc = self._proc
        if self._closed or proc is None or not self.entries:  # not started, restarting, or the no-entry check due
            return False
        assert proc.stdout is not None and proc.stderr is not None
        try:
            ready, _, _ = select.select([proc.stdout.fileno(), proc.stderr.fileno()], [], [], 0)
        except (OSError, ValueError):  # a pipe closed under us: read() says what happened
            return False
        return not ready

    def read(self, now_unix_s: float) -> list[LogEvent]:
        """The events of the entries journalctl printed since the last call (never blocks, never raises OSError)."""
        if self._closed:
            return []
        now_s = time.monotonic()
        if self._proc is None:
            if now_s < self._next_start_s:
                return []
            self._start(now_s)
            if self._proc is None:
                return []
        proc = self._proc
        assert proc.stdout is not None
        self._read_stderr(proc)
        data = b""
        eof = False
        try:
            while len(data) < self.max_read_bytes:
                chunk = os.read(proc.stdout.fileno(), self.max_read_bytes - len(data))
                if not chunk:
                    eof = True
                    break
                data += chunk
        except BlockingIOError:
            pass
        except OSError:  # the pipe broke: journalctl is gone as far as we can tell
            eof = True
        events = self.take_output(data, now_unix_s)
        if eof:
            self._proc = None
            self._reap(proc, now_s)
        else:
            self._check_no_entries(now_s)
        return events

    def take_output(self, data: bytes, now_unix_s: float) -> list[LogEvent]:
        """The events of journalctl's output bytes ``data`` (any split: an unfinished line waits for the next call)."""
        events: list[LogEvent] = []
        if not data:
            return events
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()  # an unfinished line waits for its end
        for raw in parts:
            if self._dropping:  # the end of an over-long line
                self._dropping = False
                continue
            if raw.strip():
                events.extend(self._entry(raw, now_unix_s))
        if len(self._partial) > self.max_line_bytes:
            if not self._dropping:
                self.garbled_lines += 1
            self._partial, self._dropping = b"", True
        return events

    def _entry(self, raw: bytes, now_unix_s: float) -> list[LogEvent]:
        if len(raw) > self.max_line_bytes:
            self.garbled_lines += 1
            return []
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):  # nested deeper than the parser goes: journalctl never writes that
            entry = None
        if not isinstance(entry, dict):
            self.garbled_lines += 1
            return []
        self.entries += 1
        cursor = entry.get("__CURSOR")
        if isinstance(cursor, str):
            self._cursor = cursor
        ts_unix_s = _timestamp_unix_s(entry.get("__REALTIME_TIMESTAMP"))
        self.problem = None  # journalctl works and the unit has entries
        first, self._first_entry = self._first_entry, False
        if first and ts_unix_s is not None and ts_unix_s < self._started_unix_s:
            return []  # the unit's last entry from before we started (--lines=1): proof it has entries, not news
        text = message_text(entry.get("MESSAGE"))
        if text is None:
            self.unknown_lines += 1
            return []
        # Split on newlines only, as a log file is: str.splitlines() also splits on \u2028, \x1c and the like,
        # which a client can have echoed mid-line, and would make a fragment after one start a line of its own.
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
        # An entry without a usable timestamp keeps the time it was read, as a log file's line does.
        events = parse_lines(lines, ts_unix_s if ts_unix_s is not None else now_unix_s)
        self.known_lines += len(events)
        self.unknown_lines += len(lines) - len(events)
        return events

    def _check_no_entries(self, now_s: float) -> None:
        if self.entries or now_s - self._started_s < self.no_entries_after_s:
            return
        said = self._stderr_text()
        where = f"the journal files in {self.journal_dir}" if self.journal_dir is not None else "the journal"
        self.problem = (
            f"{where} show no entries for unit {self.unit} (journalctl -u {self.unit}"
            f"{' -D ' + str(self.journal_dir) if self.journal_dir is not None else ''} prints nothing): is Ollama "
            f"installed as the systemd unit {self.unit} (systemctl status {self.unit})? If it is, {_GROUP_HINT}"
            + (f". journalctl said: {said}" if said else "")
        )

    # -- the end ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop journalctl and reap it; later reads return nothing. Safe to call more than once."""
        self._closed = True
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, grace_s=CLOSE_TIMEOUT_S)

    @property
    def pid(self) -> int | None:
        """journalctl's process id while it runs (tests, debugging)."""
        return self._proc.pid if self._proc is not None else None


def _timestamp_unix_s(value: Any) -> float | None:
    """``__REALTIME_TIMESTAMP``: microseconds since the epoch, as a decimal string."""
    try:
        us = int(value)
    except (TypeError, ValueError):
        return None
    return us / 1e6 if us > 0 else None


def _end(proc: subprocess.Popen[bytes], *, grace_s: float) -> int:
    """Terminate (then, after grace_s, kill) a child, reap it, close its pipes; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return proc.returncode

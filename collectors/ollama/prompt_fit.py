"""Prompts that did not fit, and the settings Ollama runs with, from its log (``analysis.prompt_fit``).

``FitTap`` wraps the log source the runner reader reads (a file or the journal) and hands ``FitBook`` the lines it
needs: Ollama's ``truncating input prompt`` lines and its start lines. ``FitBook.annotate`` gives each finished
request (proxied or direct) the context it ran with and who set it, and, when one of those lines tells of it (the
line's kept count equal to the reply's ``prompt_eval_count``, read while the request ran), the prompt's size as
sent and as kept; a line read after its request was written re-writes that request (``late``).

Ollama writes its start lines once, when it starts: ``read_start_lines`` reads the last set from the end of a log
file when the collector starts (a log that goes back further than ``START_SCAN_BYTES`` is read that far).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import psutil

from analysis.model_names import same_model
from analysis.prompt_fit import (
    SIGNATURE_SLACK_TOKENS,
    CtxSource,
    FitLine,
    LineKind,
    ServerSettings,
    is_cut_for,
    num_ctx_in_force,
    parse_fit_line,
    truncation_limit,
)
from analysis.records import LoadedModel, RequestRecord
from collectors.ollama.log import LogEvent, LogSource
from store.tables import OllamaSettingRow

START_SCAN_BYTES = 4 << 20  # the end of the log read for Ollama's start lines when the collector starts
KEEP_LINES_S = 600.0  # a cut-prompt line waits this long for its request
KEEP_LINES = 256
KEEP_RECORDS = 64  # finished requests a late line may still be joined to
KEEP_RECORDS_S = 60.0
LINE_SLACK_S = 2.0  # a line is read up to one log poll (and a write) after Ollama wrote it
START_STAMP_SLACK_S = 2.0  # a slog stamp (ms) against a process start time (the OS's, to 10 ms)
START_SET_S = 30.0  # Ollama writes its start lines within its first seconds (GPU discovery can take a few)
OLLAMA_PROCESS_ASK_S = 5.0  # the Ollama process is looked up at most this often (a flood of forged lines: once)
TOKENIZE_TIMEOUT_S = 10.0  # a runner's /tokenize of a long prompt, on a busy machine


def ollama_serve_started_unix_s() -> float | None:
    """When the one ``ollama serve`` process this user can see started; None when none or several are seen (another
    user's process hidden by hidepid, or sim standing in for Ollama)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time"]):
        info = proc.info
        argv = info.get("cmdline") or []
        is_ollama = info.get("name") == "ollama" or (bool(argv) and os.path.basename(argv[0]) == "ollama")
        if is_ollama and argv[1:2] == ["serve"] and info.get("create_time") is not None:
            found.append(float(info["create_time"]))
    return found[0] if len(found) == 1 else None


_NONE_TAKEN = -1.0  # no set of start lines taken yet


class FitBook:
    """What Ollama's log said about cut prompts and its settings; joins it to finished requests.

    Anyone can have lines printed into the log, so a start line counts only as Ollama's own: a set (its ``server
    config`` line, then the ``inference compute`` and ``vram-based default context`` lines within
    ``START_SET_S``) is taken once per Ollama process, known by its process start (``ollama_started``); where no
    Ollama process can be seen, only the first set. Any other start line is dropped and counted."""

    def __init__(self, ollama_started: Callable[[], float | None] = ollama_serve_started_unix_s) -> None:
        self.settings = ServerSettings()
        self.settings_changed = False
        self.settings_dropped = 0  # start lines not taken: a second set for the same Ollama process, or out of a set
        self._ollama_started = ollama_started
        self._asked: tuple[float, float | None] | None = None  # (when asked, the answer): asked at most every 5 s
        self._taken_for = _NONE_TAKEN  # the Ollama process start the settings are of (None: not seen)
        self._set_open_until = 0.0  # read time until which the taken set's other start lines belong to it
        self._lines: deque[tuple[float, FitLine]] = deque(maxlen=KEEP_LINES)  # unclaimed cut-prompt lines
        self._recent: deque[tuple[float, RequestRecord]] = deque(maxlen=KEEP_RECORDS)
        self._late: list[RequestRecord] = []

    def start_with(self, settings: ServerSettings, read_unix_s: float) -> None:
        """The set read from the log's end when the collector starts (``read_start_lines``): this Ollama's."""
        self.settings, self.settings_changed = settings, True
        self._taken_for = self._ollama_start(read_unix_s) or 0.0

    def _ollama_start(self, now_unix_s: float) -> float | None:
        if self._asked is None or now_unix_s - self._asked[0] > OLLAMA_PROCESS_ASK_S or now_unix_s < self._asked[0]:
            self._asked = (now_unix_s, self._ollama_started())
        return self._asked[1]

    def _take_set(self, read_unix_s: float) -> bool:
        """Whether a ``server config`` line read now starts the settings of an Ollama process not yet taken."""
        started = self._ollama_start(read_unix_s)
        if self._taken_for == _NONE_TAKEN or (started is not None and started != self._taken_for):
            self._taken_for = started or 0.0
            return True
        return False

    def feed(self, events: Sequence[LogEvent]) -> None:
        for event in events:
            line = event.fit
            if line is None:
                continue
            if line.kind is LineKind.TRUNCATED:
                self._lines.append((event.read_unix_s, line))
            elif line.kind is LineKind.SERVER_CONFIG and self._take_set(event.read_unix_s):
                self.settings = self.settings.fold(line, event.read_unix_s)
                self.settings_changed = True
                self._set_open_until = event.read_unix_s + START_SET_S
            elif line.kind is not LineKind.SERVER_CONFIG and event.read_unix_s <= self._set_open_until:
                self.settings = self.settings.fold(line, event.read_unix_s)
                self.settings_changed = True
            else:
                self.settings_dropped += 1
        if self._lines and self._recent:
            self._join_late()

    def annotate(self, rec: RequestRecord, loaded: Sequence[LoadedModel], now_unix_s: float) -> RequestRecord:
        """``rec`` with the context it ran with (and who set it) and, when a line of Ollama's told of it, its cut."""
        ctx = _loaded_ctx(rec.model, loaded)
        value: int | None
        source: CtxSource | None
        if rec.direct and ctx is not None:  # its client's options are not known: the model it ran on says
            value, source = ctx, CtxSource.LOADED
        else:
            value, source = num_ctx_in_force(rec.endpoint, rec.num_ctx, ctx, self.settings if self.settings.env else None)
        if value is not None and rec.num_ctx_in_force is None:
            rec = dataclasses.replace(rec, num_ctx_in_force=value, num_ctx_source=str(source))
        claimed = self._claim(rec)
        if claimed is not None:
            rec = _with_line(rec, claimed)
        elif rec.prompt_sent_source is None:
            self._recent.append((now_unix_s, rec))
        return rec

    def late(self) -> list[RequestRecord]:
        """Requests already written whose cut was told by a line read since: to write again."""
        out, self._late = self._late, []
        return out

    def rows(self, ts_unix_s: float) -> list[OllamaSettingRow]:
        """The settings in force for the store, each with the line that said it."""
        self.settings_changed = False
        s = self.settings
        at = s.read_unix_s if s.read_unix_s is not None else ts_unix_s
        rows = [OllamaSettingRow(at, k, v, "Ollama's start line (server config)") for k, v in sorted(s.env.items())]
        if s.vram_default_num_ctx is not None:
            value = f"{s.vram_default_num_ctx} (total VRAM {s.total_vram})"
            rows.append(
                OllamaSettingRow(at, "vram-based default context", value, "Ollama's start line (vram-based default context)")
            )
        for i, gpu in enumerate(s.compute):
            desc = " ".join(f"{k}={gpu[k]}" for k in ("library", "name", "description", "total", "available") if k in gpu)
            rows.append(OllamaSettingRow(at, f"inference compute {i}", desc[:512], "Ollama's start line (inference compute)"))
        return rows

    def _claim(self, rec: RequestRecord) -> FitLine | None:
        """The cut-prompt line about ``rec``: read while it ran (or soon after), and its numbers Ollama's cut of this
        request (``is_cut_for``: its context, its reply's prompt count). Any other is someone else's, or forged."""
        kept = rec.metrics.prompt_eval_count if rec.metrics is not None else None
        if kept is None or rec.status_code not in (None, 200):
            return None
        end_s = rec.wall_s(rec.final_chunk_ns) if rec.final_chunk_ns is not None else None
        for i, (read_s, line) in enumerate(self._lines):
            if not is_cut_for(line, rec.num_ctx_in_force, kept) or read_s < rec.started_at_unix_s - LINE_SLACK_S:
                continue
            if end_s is not None and read_s > end_s + KEEP_RECORDS_S:
                continue
            del self._lines[i]
            return line
        return None

    def _join_late(self) -> None:
        now = time.time()
        while self._recent and self._recent[0][0] < now - KEEP_RECORDS_S:
            self._recent.popleft()
        while self._lines and self._lines[0][0] < now - KEEP_LINES_S:
            self._lines.popleft()
        keep: list[tuple[float, RequestRecord]] = []
        for at, rec in self._recent:
            line = self._claim(rec)
            if line is not None:
                self._late.append(_with_line(rec, line))
            else:
                keep.append((at, rec))
        self._recent = deque(keep, maxlen=KEEP_RECORDS)


def _loaded_ctx(model: str, loaded: Sequence[LoadedModel]) -> int | None:
    for m in loaded:
        if same_model(m.name, model) and m.context_length:
            return m.context_length
    return None


def _with_line(rec: RequestRecord, line: FitLine) -> RequestRecord:
    return dataclasses.replace(rec, prompt_sent_tokens=line.prompt, prompt_sent_source="log", prompt_kept_tokens=line.new)


def wants_count(rec: RequestRecord) -> bool:
    """A proxied reply that looks cut (its prompt_eval_count at the cut length for the context it ran with), no line of
    Ollama's told of it, and its text was kept (--record-text): worth counting its prompt with the runner's /tokenize."""
    kept = rec.metrics.prompt_eval_count if rec.metrics is not None else None
    ctx = rec.num_ctx_in_force
    if rec.direct or not rec.prompt_text or rec.prompt_sent_source is not None or kept is None or ctx is None:
        return False
    return abs(kept - truncation_limit(ctx)) <= SIGNATURE_SLACK_TOKENS or ctx - SIGNATURE_SLACK_TOKENS <= kept <= ctx


async def count_tokens(session: aiohttp.ClientSession, port: int, text: str, timeout_s: float = TOKENIZE_TIMEOUT_S) -> int | None:
    """The prompt's tokens as the runner (llama-server's /tokenize, BOS added) counts them; None when it cannot say."""
    try:
        async with session.post(
            f"http://127.0.0.1:{port}/tokenize",
            json={"content": text, "add_special": True},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as r:
            if r.status != 200:
                return None
            body = await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    tokens = body.get("tokens") if isinstance(body, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


def with_count(rec: RequestRecord, sent: int) -> RequestRecord:
    """``rec`` with its prompt's size as the runner counted it (the text as sent, without Ollama's template)."""
    return dataclasses.replace(rec, prompt_sent_tokens=sent, prompt_sent_source="tokenize")


class FitTap:
    """A log source that hands the lines ``FitBook`` needs to it, and every event on to its reader unchanged."""

    def __init__(self, source: LogSource, book: FitBook) -> None:
        self.source = source
        self.book = book

    @property
    def unknown_lines(self) -> int:
        return self.source.unknown_lines

    @unknown_lines.setter
    def unknown_lines(self, value: int) -> None:
        self.source.unknown_lines = value

    @property
    def problem(self) -> str | None:
        return self.source.problem

    @problem.setter
    def problem(self, value: str | None) -> None:
        self.source.problem = value

    @property
    def watched_path(self) -> Path | None:
        return self.source.watched_path

    def unchanged(self) -> bool:
        return self.source.unchanged()

    def read(self, now_unix_s: float) -> list[LogEvent]:
        events = self.source.read(now_unix_s)
        self.book.feed(events)
        return events

    def close(self) -> None:
        self.source.close()


def read_start_lines(
    path: Path, now_unix_s: float, max_bytes: int = START_SCAN_BYTES, *, ollama_started_unix_s: float | None = None
) -> ServerSettings | None:
    """The settings of Ollama's start in the log file's last ``max_bytes`` (None: none there, or unreadable): the first
    set written since the Ollama process started (``ollama_started_unix_s``, its ``server config`` stamp no earlier),
    or, where the process is not known, the last set there."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return None
    settings: ServerSettings | None = None
    for raw in data.split(b"\n"):
        if b"msg=" not in raw:
            continue
        line = parse_fit_line(raw.decode("utf-8", "replace"))
        if line is None or line.kind is LineKind.TRUNCATED:
            continue
        if line.kind is LineKind.SERVER_CONFIG:
            if ollama_started_unix_s is not None and settings is not None:
                break  # the first set of this Ollama process was read: a later one is not its start
            stamp = line.logged_unix_s
            if ollama_started_unix_s is not None and (stamp is None or stamp < ollama_started_unix_s - START_STAMP_SLACK_S):
                continue  # an earlier Ollama process's
            settings = ServerSettings().fold(line, now_unix_s)
        elif settings is not None:
            settings = settings.fold(line, now_unix_s)
    return settings


def read_ollama_start_lines(path: Path, now_unix_s: float) -> ServerSettings | None:
    """``read_start_lines`` for the Ollama process running now, where one can be seen."""
    return read_start_lines(path, now_unix_s, ollama_started_unix_s=ollama_serve_started_unix_s())

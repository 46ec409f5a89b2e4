"""Ollama poller: ``/api/version`` at start and after Ollama comes back; ``/api/ps`` every interval while what
it says can change (``busy``: ``ps_at_interval``) or when a runner process appears or goes (``processes_changed``:
the process table, no HTTP), else every ``IDLE_PS_INTERVAL_S``; ``/api/tags`` every ``TAGS_INTERVAL_S`` (with a poll);
``/api/show`` once per digest (loaded models first, then installed ones, ``SHOWS_PER_POLL`` at most per poll).

Each request is a line in Ollama's own log (its access log, in the journal the user reads when something goes
wrong): polling both every second wrote ~7,300 lines an hour while idle; the figures now, idle and with one
generation running all the time, are in bench/README.md (``bench/ollama_log_lines.py``).

When Ollama is down the poller records it, backs off (interval → ×2 … up to 30 s) and
recovers by itself. Nothing escapes ``run()``: a poll that fails in any way is a "down"
reading, never an exception.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from analysis.model_names import same_model
from analysis.records import InstalledModel, LoadedModel, OllamaStatus
from collectors.beat import until_next_beat_s
from store.ops import Op, PutInstalledModels, PutLoadedModels, PutModelInfo, PutOllamaStatus

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
REQUEST_TIMEOUT_S = 5.0
SHOW_RETRY_S = 60.0  # a failed /api/show is retried this much later, not every interval
# The installed models change rarely: /api/tags this often (and at start, after Ollama comes back, and when /api/ps
# lists a model the last /api/tags did not: a pull or a create since), not every interval.
TAGS_INTERVAL_S = 300.0
# Ollama's own /metrics (docs/ollama-api.md §13): read for its queue gauge while it answers 200 with Prometheus
# text; else asked again this seldom. Its names are Ollama's (ollama_*); ours are phasewatch_*.
METRICS_RETRY_S = 600.0  # serving it takes a restart of Ollama with OLLAMA_METRICS, after which it is asked at once
MAX_METRICS_BYTES = 1024 * 1024
QUEUE_GAUGE = "ollama_requests_queued"
# The most requests one model's gauge can say wait (OLLAMA_MAX_QUEUE's default is 512): a sample past it, or not a
# whole number, is no count (a hostile Ollama put a 309-digit one on Live); refused and counted, as /api/tags'
# unreadable entries are.
MAX_QUEUED_REQUESTS = 1_000_000
SHOWS_PER_POLL = 4  # /api/show requests per poll at most: 80 installed models are asked about over 20 polls
IDLE_PS_INTERVAL_S = 30.0  # /api/ps this often while nothing runs and no runner process appears or goes
# /api/ps after requests finished, at most this often: back-to-back requests each moved expires_at, and one poll
# per request was a line a second in Ollama's log; the last finish is still read within this much.
PS_AFTER_FINISH_S = 10.0
# What Ollama answers is held and stored within these, whatever it sends (a hostile or broken upstream):
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # one answer's body; /api/tags of 5,000 models is about 2.5 MB
MAX_MODELS = 5_000  # models read from one /api/ps or /api/tags answer (the rest skipped)
MAX_NAME_CHARS = 512  # a model's name or tag (Ollama's longest are registry paths, well under 300)
MAX_FIELD_CHARS = 128  # digests, details (family, quantization, parameter size), capabilities, architecture
MAX_LIST_ITEMS = 1_024  # a per-layer list in model_info (models have a few hundred layers at most)
MAX_CAPABILITIES = 32
SHOWS_HELD = 256  # /api/show answers held in memory for /metrics' decode ceiling (the latest asked; all are stored)
MAX_SIZE_BYTES = 2**63 - 1  # SQLite's largest integer: a size past it is not a size (unknown)
# The /api/show fields Phasewatch uses (analysis.model_facts, the Why page): the rest is never kept.
SHOW_GENERAL_KEYS = ("general.architecture", "general.parameter_count", "general.file_type")
SHOW_ARCH_KEYS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "context_length",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "feed_forward_length",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
)
SHOW_DETAIL_KEYS = ("family", "families", "format", "parameter_size", "quantization_level", "parent_model")


class PollerSink(Protocol):
    """Where readings go, as store operations (``store.writer.BackgroundWriter.submit``)."""

    def submit(self, op: Op[Any]) -> None: ...


class PollError(Exception):
    """One poll failed; the text says how, for OllamaStatus.error."""


def parse_time(value: object) -> float | None:
    """RFC 3339 (Go's, nanoseconds allowed) → Unix seconds; None for absent, zero or unparseable."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _int_or_none(value: object) -> int | None:
    """An integer SQLite can store (|value| < 2^63); anything else is unknown."""
    if not isinstance(value, int) or isinstance(value, bool) or not -MAX_SIZE_BYTES <= value <= MAX_SIZE_BYTES:
        return None
    return value


def _str_or_none(value: object, max_chars: int = MAX_FIELD_CHARS) -> str | None:
    """A non-empty string, cut to ``max_chars``."""
    return value[:max_chars] if isinstance(value, str) and value else None


def _name_or_none(value: object) -> str | None:
    return _str_or_none(value, MAX_NAME_CHARS)


def _kept_value(value: object) -> object:
    """A model_info value as Phasewatch uses it: a finite number, a flag, a short string, a list of numbers or flags
    (one per layer, capped)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return _int_or_none(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:MAX_FIELD_CHARS]
    if isinstance(value, list):
        return [v for v in value[:MAX_LIST_ITEMS] if isinstance(v, int | float) and _kept_value(v) is not None]  # bool is an int
    return None


def _short_strings(value: object) -> tuple[str, ...]:
    """A list of strings (capabilities, families), capped in count and length; anything else: none."""
    if not isinstance(value, list):
        return ()
    return tuple(v[:MAX_FIELD_CHARS] for v in value[:MAX_CAPABILITIES] if isinstance(v, str))


def slim_show(show: dict[str, Any]) -> dict[str, Any]:
    """An /api/show answer cut to the fields Phasewatch uses (``analysis.model_facts``, capabilities for the Why
    page), each capped: what is held in memory and stored, whatever Ollama sent."""
    raw_info = show.get("model_info", show.get("modelinfo"))
    info = raw_info if isinstance(raw_info, dict) else {}
    arch = _str_or_none(info.get("general.architecture"))
    keys = [*SHOW_GENERAL_KEYS, *(f"{arch}.{k}" for k in SHOW_ARCH_KEYS)] if arch else list(SHOW_GENERAL_KEYS)
    kept_info = {k: v for k in keys if k in info and (v := _kept_value(info[k])) is not None}
    raw_details = show.get("details")
    details: dict[str, Any] = {}
    if isinstance(raw_details, dict):
        for k in SHOW_DETAIL_KEYS:
            v = raw_details.get(k)
            if isinstance(v, list):
                details[k] = list(_short_strings(v))
            elif (text := _str_or_none(v)) is not None:
                details[k] = text
    slim: dict[str, Any] = {"model_info": kept_info, "details": details}
    if isinstance(show.get("capabilities"), list):
        slim["capabilities"] = list(_short_strings(show["capabilities"]))
    return slim


def parse_ps(body: object, ts_unix_s: float) -> list[LoadedModel]:
    """``GET /api/ps`` → one LoadedModel per loaded model; PollError on a shape that is not /api/ps."""
    if not isinstance(body, dict) or not isinstance(body.get("models"), list | None):
        raise PollError('/api/ps did not return {"models": [...]}')
    models: list[LoadedModel] = []
    for item in (body.get("models") or [])[:MAX_MODELS]:
        if not isinstance(item, dict):
            raise PollError("/api/ps listed a model that is not a JSON object")
        raw_details = item.get("details")
        details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
        name = _name_or_none(item.get("name")) or _name_or_none(item.get("model")) or ""
        models.append(
            LoadedModel(
                ts_unix_s=ts_unix_s,
                name=name,
                model=_name_or_none(item.get("model")) or name,
                digest=_str_or_none(item.get("digest")) or "",
                size_bytes=_size_or_zero(item.get("size")),
                size_vram_bytes=_size_or_zero(item.get("size_vram")),  # omitted when 0: all in system RAM
                context_length=_size_or_none(item.get("context_length")),
                expires_at_unix_s=parse_time(item.get("expires_at")),
                parameter_size=_str_or_none(details.get("parameter_size")),
                quantization_level=_str_or_none(details.get("quantization_level")),
                family=_str_or_none(details.get("family")),
            )
        )
    return models


def _size_or_none(value: object) -> int | None:
    size = _int_or_none(value)
    return size if size is not None and size > 0 else None  # a model is never 0 bytes: unknown


def _size_or_zero(value: object) -> int:
    """/api/ps sizes: omitted means 0 there; negative or past SQLite's integers (2^63) is no size either."""
    size = _int_or_none(value)
    return size if size is not None and size > 0 else 0


def parse_tags(body: object, ts_unix_s: float) -> tuple[list[InstalledModel], int]:
    """``GET /api/tags`` → the installed models and how many entries were skipped (not an object, no name,
    a name listed twice); PollError on a shape that is not /api/tags."""
    if not isinstance(body, dict) or "models" not in body or not isinstance(body["models"], list | None):
        raise PollError('/api/tags did not return {"models": [...]}')
    models: dict[str, InstalledModel] = {}
    listed = body.get("models") or []
    skipped = max(0, len(listed) - MAX_MODELS)
    for item in listed[:MAX_MODELS]:
        name = (_name_or_none(item.get("name")) or _name_or_none(item.get("model"))) if isinstance(item, dict) else None
        if not isinstance(item, dict) or name is None or name in models:
            skipped += 1
            continue
        raw_details = item.get("details")
        details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
        models[name] = InstalledModel(
            ts_unix_s=ts_unix_s,
            name=name,
            model=_name_or_none(item.get("model")) or name,
            digest=_str_or_none(item.get("digest")) or "",
            size_bytes=_size_or_none(item.get("size")),
            parameter_size=_str_or_none(details.get("parameter_size")),
            quantization_level=_str_or_none(details.get("quantization_level")),
            family=_str_or_none(details.get("family")),
            modified_at_unix_s=parse_time(item.get("modified_at")),
            capabilities=_short_strings(item.get("capabilities")),
        )
    return list(models.values()), skipped


def parse_queue_gauge(text: str) -> tuple[dict[str, int], int] | None:
    """``ollama_requests_queued`` by its ``model`` label (``""`` when it has none) from Prometheus text, parsed by
    prometheus_client's own parser, and how many samples were refused (not a whole number from 0 to
    ``MAX_QUEUED_REQUESTS``, or a model's total past it); None when the text is not Prometheus's or has no such
    gauge."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, TypeError, KeyError):  # not Prometheus text (the parser's own errors)
        return None
    found: dict[str, int] = {}
    refused = 0
    for family in families:
        if family.name != QUEUE_GAUGE:
            continue
        for sample in family.samples[:MAX_MODELS]:
            if sample.name != QUEUE_GAUGE:
                continue
            model = sample.labels.get("model", "")[:MAX_NAME_CHARS]
            value = sample.value  # the parser's int or float
            whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())  # NaN, inf: not
            if not (whole and value >= 0 and found.get(model, 0) + value <= MAX_QUEUED_REQUESTS):
                refused += 1
                continue
            found[model] = found.get(model, 0) + int(value)
    return (found, refused) if any(f.name == QUEUE_GAUGE for f in families) else None


def ps_at_interval(*, finished: bool, unmatched: bool, running_models: Iterable[str], slots_models: Iterable[str]) -> bool:
    """Whether ``/api/ps`` is worth asking every interval (1 Hz) now, each ask a line in Ollama's log.

    What it says changes when a request finishes (its model's ``expires_at`` moves: ``finished``), when a runner
    appears whose model it has not named yet (``unmatched``), and when a model loads or goes (a runner process
    appears or exits: the poller's ``processes_changed``, no HTTP). While a generation runs that a runner's
    ``/slots`` shows (``slots_models``: the models of runners read), nothing /api/ps says can change before it
    ends; a running request no runner shows (``running_models`` beyond them: a runner that cannot be read, or
    none, as with Ollama in a container or on another machine) keeps the 1 Hz pace, as /api/ps is then all there
    is."""
    if finished or unmatched:
        return True
    shown = list(slots_models)
    return any(not any(same_model(model, s) for s in shown) for model in running_models)


@dataclass
class PollerState:
    """The latest view of Ollama, for /metrics and the heartbeat."""

    status: OllamaStatus | None = None
    models: list[LoadedModel] = field(default_factory=list)
    consecutive_failures: int = 0
    installed: list[InstalledModel] | None = None  # the last /api/tags read (None: none read yet)
    tags_skipped: int = 0  # entries of the last /api/tags that could not be read
    tags_error: str | None = None  # why the last /api/tags failed (None: it answered)
    # Ollama's /metrics queue gauge: model → requests waiting ("" when the gauge names no model); None: not served
    queued: dict[str, int] | None = None
    queued_refused: int = 0  # samples of the last /metrics' queue gauge refused (see MAX_QUEUED_REQUESTS)


class OllamaPoller:
    """Polls one Ollama server and hands what it reads to ``sink``."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        sink: PollerSink,
        *,
        interval_s: float = 1.0,
        max_backoff_s: float = MAX_BACKOFF_S,
        tags_interval_s: float = TAGS_INTERVAL_S,
        idle_interval_s: float = IDLE_PS_INTERVAL_S,
        busy: Callable[[], bool] = lambda: False,
        processes_changed: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._sink = sink
        self.interval_s = interval_s
        self.max_backoff_s = max(max_backoff_s, interval_s)
        self._clock = clock
        self.state = PollerState()
        self._shown: set[str] = set()  # digests whose /api/show is stored
        # model name → its /api/show (slimmed), for /metrics' decode ceiling; the SHOWS_HELD latest
        self.shows: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._show_retry_at: dict[str, float] = {}
        self.tags_interval_s = tags_interval_s
        self.shows_per_poll = SHOWS_PER_POLL
        self._tags_due_at = 0.0  # time.monotonic() of the next /api/tags: at once
        self._tags_asked_for: set[str] = set()  # /api/ps names that made /api/tags due (bounded by MAX_MODELS)
        self.idle_interval_s = max(idle_interval_s, interval_s)
        self._busy = busy  # something runs (a request in flight, a runner's slot processing): /api/ps every interval
        self._processes_changed = processes_changed  # a runner process appeared or went since the last call
        self._version: str | None = None  # the last /api/version read; asked again only after Ollama was down
        self._shows_pending = False  # /api/show answers still to read (capped per poll): poll at the busy pace meanwhile
        self._metrics_due_at = 0.0  # time.monotonic() of the next /metrics try while it is not served

    async def _get_json(self, method: str, path: str, json_body: Any = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with self._session.request(method, self.base_url + path, json=json_body, timeout=timeout) as resp:
                if resp.status != 200:
                    text = (await resp.text(errors="replace"))[:300]
                    raise PollError(f"{path} answered HTTP {resp.status}: {text.strip()}")
                chunks, size = [], 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise PollError(f"{path} answered more than {MAX_ANSWER_BYTES // 2**20} MiB; not read")
                    chunks.append(chunk)
                return json.loads(b"".join(chunks))
        except PollError:
            raise
        except TimeoutError:
            raise PollError(f"{path} did not answer within {REQUEST_TIMEOUT_S:g} s") from None
        except aiohttp.ClientConnectorError as exc:
            raise PollError(f"cannot connect to {self.base_url}: {exc.os_error.strerror or exc}") from None
        except aiohttp.ClientError as exc:
            raise PollError(f"{path} failed: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:  # not JSON
            raise PollError(f"{path} did not return JSON: {exc}") from None
        except RecursionError:  # nested deeper than the parser goes: not an answer of Ollama's
            raise PollError(f"{path} answered JSON nested too deep to read") from None

    async def poll_once(self) -> bool:
        """One poll; True when Ollama answered. Never raises (except cancellation)."""
        ts = self._clock()
        was_up = self.state.status is not None and self.state.status.up
        try:
            version = self._version if was_up else None
            if version is None:  # at start and after Ollama was down (it may have been upgraded meanwhile)
                version_body = await self._get_json("GET", "/api/version")
                version = version_body.get("version") if isinstance(version_body, dict) else None
                if not isinstance(version, str):
                    raise PollError('/api/version did not return {"version": ...}: is this Ollama?')
                version = version[:MAX_FIELD_CHARS]
            models = parse_ps(await self._get_json("GET", "/api/ps"), ts)
        except PollError as exc:
            self._record_down(ts, str(exc))
            return False
        except Exception as exc:  # a bug here must not stop the poller
            log.exception("Ollama poll failed unexpectedly")
            self._record_down(ts, f"poll failed: {type(exc).__name__}: {exc}")
            return False

        self._version = version
        status = OllamaStatus(ts_unix_s=ts, up=True, base_url=self.base_url, version=version)
        if not was_up:
            log.info("Ollama %s is up (version %s)", self.base_url, version)
            self._tags_due_at = 0.0  # back up: read what is installed at once (models may have changed meanwhile)
            self._metrics_due_at = 0.0  # and whether it serves /metrics now (a restart may have turned it on)
        self._tags_when_new(models)
        self.state.status = status
        self.state.models = models
        self.state.consecutive_failures = 0
        self._sink.submit(PutOllamaStatus(status))
        self._sink.submit(PutLoadedModels(ts, models))
        await self._poll_tags(ts)
        await self._poll_metrics()
        await self._show_new_models(
            [(m.name, m.digest) for m in models] + [(m.name, m.digest) for m in self.state.installed or []]
        )
        return True

    def _tags_when_new(self, models: list[LoadedModel]) -> None:
        """/api/tags at this poll when /api/ps lists a model the last /api/tags did not (once per name)."""
        installed = self.state.installed
        if installed is None:
            return
        for m in models:
            if m.name in self._tags_asked_for or any(same_model(m.name, i.name) for i in installed):
                continue
            if len(self._tags_asked_for) < MAX_MODELS:
                self._tags_asked_for.add(m.name)
                self._tags_due_at = 0.0

    async def _poll_metrics(self) -> None:
        """Ollama's queue gauge from its /metrics, each poll while it answers 200 with Prometheus text; otherwise
        (not served: the setting is off, or an Ollama without it) tried again after ``METRICS_RETRY_S``."""
        if self.state.queued is None and time.monotonic() < self._metrics_due_at:
            return
        read = await self._read_metrics()
        self.state.queued, refused = read if read is not None else (None, 0)
        if refused and not self.state.queued_refused:  # once per stretch of refusals, not every poll
            log.warning(
                "Ollama's /metrics: %d %s sample(s) refused (not a count up to %d)", refused, QUEUE_GAUGE, MAX_QUEUED_REQUESTS
            )
        self.state.queued_refused = refused
        if read is None:
            self._metrics_due_at = time.monotonic() + METRICS_RETRY_S

    async def _read_metrics(self) -> tuple[dict[str, int], int] | None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        try:
            async with self._session.get(self.base_url + "/metrics", timeout=timeout) as resp:
                if resp.status != 200 or not resp.content_type.startswith("text/plain"):
                    return None
                body = await resp.content.read(MAX_METRICS_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError):
            return None
        if len(body) > MAX_METRICS_BYTES:
            return None
        return parse_queue_gauge(body.decode("utf-8", errors="replace"))

    async def _poll_tags(self, ts: float) -> None:
        """``/api/tags`` when due. A failure keeps the last list stored and is retried at the next due time:
        Ollama answered /api/version and /api/ps, so it is up."""
        now = time.monotonic()
        if now < self._tags_due_at:
            return
        self._tags_due_at = now + self.tags_interval_s
        try:
            installed, skipped = parse_tags(await self._get_json("GET", "/api/tags"), ts)
        except PollError as exc:
            log.warning("could not read /api/tags: %s", exc)
            self.state.tags_error = str(exc)
            return
        if skipped:
            log.warning("/api/tags listed %d entries that could not be read (skipped)", skipped)
        self.state.installed, self.state.tags_skipped, self.state.tags_error = installed, skipped, None
        self._sink.submit(PutInstalledModels(installed))

    def _record_down(self, ts: float, error: str) -> None:
        if self.state.status is None or self.state.status.up:
            log.warning("Ollama %s is down: %s", self.base_url, error)
        self.state.status = OllamaStatus(ts_unix_s=ts, up=False, base_url=self.base_url, error=error)
        self.state.models = []
        self.state.consecutive_failures += 1
        self._sink.submit(PutOllamaStatus(self.state.status))

    async def _show_new_models(self, models: list[tuple[str, str]]) -> None:
        """``/api/show`` of each (name, digest) not yet stored, in order, ``shows_per_poll`` at most."""
        now = time.monotonic()
        asked = 0
        self._shows_pending = False
        for name, digest in models:
            if asked >= self.shows_per_poll:
                self._shows_pending = True
                return  # the rest next poll
            if not digest or digest in self._shown or self._show_retry_at.get(digest, 0.0) > now:
                continue
            asked += 1
            try:
                show = await self._get_json("POST", "/api/show", {"model": name})
                if not isinstance(show, dict):
                    raise PollError("/api/show did not return a JSON object")
            except PollError as exc:
                log.warning("could not read /api/show for %s: %s", name, exc)
                self._show_retry_at[digest] = now + SHOW_RETRY_S
                continue
            show = slim_show(show)
            self._sink.submit(PutModelInfo(digest, name, show))
            self.shows[name] = show
            self.shows.move_to_end(name)
            while len(self.shows) > SHOWS_HELD:
                self.shows.popitem(last=False)
            self._shown.add(digest)
            self._show_retry_at.pop(digest, None)

    def due(self, since_last_s: float) -> bool:
        """Whether to poll now, ``since_last_s`` after the last poll: always while Ollama is down or not yet read
        (paced by ``next_delay_s``); while it is up, when something runs, a runner process appeared or went, models'
        /api/show answers are still to read (once per digest, a few per poll), or ``idle_interval_s`` has passed
        (half an interval early: ticks drift)."""
        if self.state.status is None or not self.state.status.up:
            return True
        try:
            changed = self._processes_changed()  # asked on every tick: it compares with the last call
            idle_due = since_last_s + self.interval_s / 2 >= self.idle_interval_s
            return changed or self._shows_pending or self._busy() or idle_due
        except Exception:  # a bug there must not stop the poller: poll, as before pacing
            log.exception("could not tell whether to poll Ollama now")
            return True

    def next_delay_s(self) -> float:
        """The interval while Ollama answers; doubling from it up to ``max_backoff_s`` while it does not."""
        failures = self.state.consecutive_failures
        if failures == 0:
            return self.interval_s
        return min(self.interval_s * 2 ** min(failures - 1, 30), self.max_backoff_s)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        last_poll = -math.inf
        while not stop.is_set():
            started = time.monotonic()
            if self.due(started - last_poll):
                last_poll = started
                await self.poll_once()
            # On the collector's beat (collectors.beat) while Ollama answers: one wake-up with the sampler's tick.
            period_s = self.next_delay_s()
            delay = (
                until_next_beat_s(asyncio.get_running_loop().time(), period_s)
                if self.state.consecutive_failures == 0
                else period_s - (time.monotonic() - started)
            )
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

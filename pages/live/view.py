"""The Live page's view-models, store → plain data (no Streamlit): ``build_cards`` for the cards and the "now"
strip (every second), ``build_live`` for the GPU timeline, loaded models and host (timed by
``bench/pages_refresh.py``). ``pages/live/ui.py`` draws them.

Every read opens the store read-only for one use and gives None when there is no store yet, so the page can
show its empty state instead of an error.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from analysis.model_names import same_model
from analysis.records import GpuSample, HostSample, LoadedModel, Outcome, ProgressSample, RequestRecord
from analysis.runner_load_words import SOURCE_ASSUMED, PlacementInUse, describe_layers
from analysis.runner_wait_tasks import TaskWaits
from pages.live.cards import Card, DecodeCeiling, LoadContext, NowStrip, finished_cards, in_flight_cards, now_strip
from pages.live.queue import ModelQueue, SlotCount, queue_cards
from pages.live.slowed import finished_phases, slowed_cards
from pages.live.timeline import (
    InFlightView,
    assign_lanes,
    bands_of,
    in_flight_view,
    loaded_names,
    unexplained_gpu_activity,
)
from pages.shared import charts, fmt
from pages.shared.basis import ModelBasis, cached_basis, placement_of
from pages.shared.derive import Band, Interval
from pages.shared.slot_count import num_parallel_setting
from store import queries, sample_queries
from store.tables import RequestSummary

_open = queries.open_reader  # None while there is no store yet

BANDS_LIMIT = 2000  # requests read for the GPU timeline: their busy time explains the GPU's (from the oldest read on)
# Requests whose phases are drawn as bands, the newest: 2,000 requests' bars (~6,000, 1 MB of figure) took the
# browser seconds to lay out on every visit (issue 48), and on a wide window each is thinner than a pixel anyway.
BANDS_DRAWN_MAX = 500


@dataclass
class LiveSnapshot:
    in_flight: list[RequestRecord]
    gpu_by_index: dict[int, list[GpuSample]]
    host: list[HostSample]
    loaded: list[LoadedModel]
    bands: list[Band]
    busy_intervals: list[Interval]
    requests_in_window: int
    gpu_state: str | None
    gpu_message: str | None
    vram_used_bytes: int | None = None  # the latest GPU samples' memory in use (with ``context``)
    direct_in_window: int = 0  # of requests_in_window: sent to Ollama directly, recorded from its runner
    placements: dict[str, PlacementInUse] = field(default_factory=dict)  # loaded model → where it sits (with ``context``)
    # Where the read requests stop explaining the GPU: the oldest read one's start when the window held more than
    # BANDS_LIMIT (older busy time is not judged: a verdict never rests on requests not read); None: all were read.
    explained_from_unix_s: float | None = None


def explained_from(rows: Sequence[RequestSummary], limit: int) -> float | None:
    """The start of the oldest of ``rows`` when the read stopped at ``limit`` (older requests were left unread), else
    None: the rows are every request of the window, and explain all of its GPU time."""
    return min(r.started_at_unix_s for r in rows) if rows and len(rows) >= limit else None


def load_live(
    db: Path, now_unix_s: float, window_s: float, *, flight: bool = True, timeline: bool = True, context: bool = True
) -> LiveSnapshot | None:
    """What the Live page reads, by part: ``flight`` the in-flight requests; ``timeline`` GPU samples and the
    requests drawn as bands (in flight included); ``context`` host samples. Loaded models come with every part."""
    start = now_unix_s - window_s
    in_flight: list[RequestRecord] = []
    gpu_by_index: dict[int, list[GpuSample]] = {}
    host: list[HostSample] = []
    rows: list[RequestSummary] = []
    with _open(db) as conn:
        if conn is None:
            return None
        if flight or timeline:
            in_flight = queries.in_flight_requests(conn, now_unix_s)
        if timeline:
            for s in sample_queries.gpu_samples(conn, start, now_unix_s + 1):
                gpu_by_index.setdefault(s.index, []).append(s)
            # Requests that started up to 10 min before the window may still reach into it.
            rows = queries.recent_requests(conn, start - 600, limit=BANDS_LIMIT, until_unix_s=now_unix_s)
        vram_used: int | None = None
        if context:
            host = sample_queries.host_samples(conn, start, now_unix_s + 1)
            latest: dict[int, GpuSample] = {s.index: s for s in sample_queries.gpu_samples(conn, now_unix_s - 10, now_unix_s + 1)}
            used = [s.mem_used_bytes for s in latest.values() if s.mem_used_bytes is not None]
            vram_used = sum(used) if used else None
        loaded = queries.latest_loaded_models(conn)
        heartbeat = queries.latest_heartbeat(conn)
        placements = _placements(conn, loaded, context)
    bands, busy, shown, direct = _finished_bands(rows, start)
    for rec in in_flight if timeline else []:
        busy.append(Interval(rec.started_at_unix_s, now_unix_s))
        bands.append(Band(rec.id, rec.model, "in flight", rec.started_at_unix_s, now_unix_s))
    return LiveSnapshot(
        in_flight=in_flight,
        gpu_by_index=gpu_by_index,
        host=host,
        loaded=loaded,
        bands=bands,
        busy_intervals=busy,
        requests_in_window=shown + sum(1 for r in in_flight if r.started_at_unix_s >= start),
        gpu_state=heartbeat.gpu_state if heartbeat else None,
        gpu_message=heartbeat.gpu_message if heartbeat else None,
        vram_used_bytes=vram_used,
        direct_in_window=direct + sum(1 for r in in_flight if r.started_at_unix_s >= start and r.direct),
        placements=placements,
        explained_from_unix_s=explained_from(rows, BANDS_LIMIT),
    )


def _placements(conn: sqlite3.Connection, loaded: list[LoadedModel], context: bool) -> dict[str, PlacementInUse]:
    """Where each loaded model sits as Why takes it: its runner's own load lines, else /api/ps (read with the
    loaded models' table, the ``context`` part)."""
    return {m.name: placement_of(conn, m.name)[2] for m in loaded} if context else {}


def _finished_bands(rows: list[RequestSummary], start: float) -> tuple[list[Band], list[Interval], int, int]:
    """The phase bands and busy intervals of the requests that reach into the window (those in flight are drawn
    from their fresher records), and how many of them started in it, of which how many came directly."""
    bands: list[Band] = []
    busy: list[Interval] = []
    shown = direct = 0
    for row in rows:
        if row.outcome is Outcome.IN_FLIGHT:
            continue
        end = row.ended_at_unix_s or row.updated_at_unix_s or row.started_at_unix_s
        if end < start:
            continue
        shown += row.started_at_unix_s >= start
        direct += row.started_at_unix_s >= start and row.direct
        busy.append(Interval(row.started_at_unix_s, end))
        bands.extend(bands_of(row))
    return bands, busy, shown, direct


@dataclass
class CardsSnapshot:
    """What the Live page's cards and "now" strip read: running requests with their progress readings, the
    requests of the last minute, loaded models, the latest GPU sample, and each decoding model's basis (where it
    sits, the GPU, its facts: the Why page's, pages.shared.basis)."""

    in_flight: list[RequestRecord]
    progress: dict[str, list[ProgressSample]]
    recent: list[RequestSummary]
    loaded: list[LoadedModel]
    gpu: GpuSample | None
    bases: dict[str, ModelBasis]
    record_text: bool
    requests_in_window: int
    chars_measured: dict[str, bool] = field(default_factory=dict)  # model → its tokens per character are measured
    last_load_s: dict[str, float] = field(default_factory=dict)  # model being loaded → how long its last load took
    # What tells a wait for a load apart (read only while a running request's model is not loaded):
    loaded_since: dict[str, float] = field(default_factory=dict)  # loaded model → first /api/ps listing it lately
    model_size_bytes: dict[str, int] = field(default_factory=dict)  # installed model → its file's size
    vram_free_bytes: tuple[tuple[float, int], ...] = ()  # (time, free memory of all GPUs), the last minute
    slots: dict[str, SlotCount] = field(default_factory=dict)  # running model → its runner's slots, where known
    ollama_queued: dict[str, int] | None = None  # Ollama's own /metrics queue gauge by model; None: not served
    waits: dict[str, TaskWaits] = field(default_factory=dict)  # the runner's own waits before the recent prompts


def load_cards(db: Path, now_unix_s: float, window_s: float, recent_s: float = 60.0) -> CardsSnapshot | None:
    with _open(db) as conn:
        if conn is None:
            return None
        in_flight = queries.in_flight_requests(conn, now_unix_s)
        loaded = queries.latest_loaded_models(conn)
        gpus = sample_queries.gpu_samples(conn, now_unix_s - 60, now_unix_s + 5)
        heartbeat = queries.latest_heartbeat(conn)
        waits = _load_waits(conn, in_flight, loaded, now_unix_s)
        recent = _recent(conn, now_unix_s, recent_s)
        return CardsSnapshot(
            in_flight=in_flight,
            progress=queries.progress_samples(conn, [r.id for r in in_flight]) if in_flight else {},
            recent=recent,
            loaded=loaded,
            gpu=gpus[-1] if gpus else None,
            bases=_bases(db, conn, in_flight, now_unix_s),
            record_text=bool(heartbeat and heartbeat.record_text),
            requests_in_window=queries.requests_started_count(conn, now_unix_s - window_s, now_unix_s),
            chars_measured=_chars_measured(conn, in_flight),
            last_load_s=waits.last_load_s,
            loaded_since=waits.loaded_since,
            model_size_bytes=waits.model_size_bytes,
            vram_free_bytes=_free_vram(gpus) if waits.models else (),
            slots=_slots(conn, in_flight, sorted({r.model for r in recent})),
            ollama_queued=_ollama_queued(heartbeat.ollama_queued if heartbeat else None),
            waits=queries.request_waits(conn, [r.id for r in recent if r.outcome is not Outcome.IN_FLIGHT]),
        )


def _ollama_queued(text: str | None) -> dict[str, int] | None:
    """The heartbeat's copy of Ollama's queue gauge (JSON written by the collector); None when not served."""
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict):
        return None
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool)}


def _slots(conn: sqlite3.Connection, in_flight: list[RequestRecord], models: Sequence[str] = ()) -> dict[str, SlotCount]:
    """Each running model's (and each of ``models``') slot count: the command line of the runner that serves it
    (-np), else OLLAMA_NUM_PARALLEL from Ollama's start line."""
    found: dict[str, SlotCount] = {}
    setting = num_parallel_setting(queries.ollama_settings(conn)) if in_flight or models else None
    for model in {r.model for r in in_flight} | set(models):
        runner = queries.runner_for(conn, model, None)
        if runner is not None and runner.parallel:
            found[model] = SlotCount(runner.parallel, "the runner's -np")
        elif setting is not None:
            found[model] = SlotCount(setting, "OLLAMA_NUM_PARALLEL, from Ollama's start line")
    return found


def _recent(conn: sqlite3.Connection, now_unix_s: float, recent_s: float) -> list[RequestSummary]:
    """Requests that overlap the last ``recent_s`` (read from those started up to 10 min before it)."""
    rows = queries.recent_requests(conn, now_unix_s - recent_s - 600, limit=500, until_unix_s=now_unix_s)
    return [r for r in rows if (r.ended_at_unix_s or now_unix_s) >= now_unix_s - recent_s]


def _bases(db: Path, conn: sqlite3.Connection, in_flight: list[RequestRecord], now_unix_s: float) -> dict[str, ModelBasis]:
    """The basis of each model writing a reply now (its decode ceiling)."""
    return {model: cached_basis(db, conn, model, now_unix_s) for model in {r.model for r in in_flight if r.token_chunk_ns}}


def _chars_measured(conn: sqlite3.Connection, in_flight: list[RequestRecord]) -> dict[str, bool]:
    """Per model reading a prompt now: whether the collector's estimate has measured its tokens per character, or
    assumes its default."""
    return {
        model: any(h.prompt_chars and h.prompt_tokens for h in queries.prompt_history(conn, model))
        for model in {r.model for r in in_flight if not r.token_chunk_ns}
    }


@dataclass(frozen=True)
class _LoadWaits:
    """What tells a wait for a load apart, read only while a running request's model is not loaded."""

    models: frozenset[str] = frozenset()  # models of running requests that /api/ps does not list
    last_load_s: dict[str, float] = field(default_factory=dict)
    loaded_since: dict[str, float] = field(default_factory=dict)
    model_size_bytes: dict[str, int] = field(default_factory=dict)


def _load_waits(
    conn: sqlite3.Connection, in_flight: list[RequestRecord], loaded: list[LoadedModel], now_unix_s: float
) -> _LoadWaits:
    names = {n for m in loaded for n in (m.name, m.model)}
    not_loaded = frozenset(r.model for r in in_flight if not any(same_model(r.model, n) for n in names))
    if not not_loaded:
        return _LoadWaits()
    # Some running request waits for a model: its last load, when others loaded, sizes (free memory: the caller).
    since = min(r.started_at_unix_s for r in in_flight)
    return _LoadWaits(
        models=not_loaded,
        last_load_s={model: t for model in not_loaded if (t := queries.last_load_s(conn, model)) is not None},
        loaded_since=queries.loaded_since(conn, max(since, now_unix_s - 600)),
        model_size_bytes={k: m.size_bytes for m in queries.installed_models(conn) if m.size_bytes for k in (m.name, m.model)},
    )


def _free_vram(samples: list[GpuSample]) -> tuple[tuple[float, int], ...]:
    """(time, free memory summed over the GPUs read at that time), oldest first; readings without memory skipped."""
    by_ts: dict[float, int] = {}
    for s in samples:
        if s.mem_total_bytes is not None and s.mem_used_bytes is not None:
            by_ts[s.ts_unix_s] = by_ts.get(s.ts_unix_s, 0) + max(s.mem_total_bytes - s.mem_used_bytes, 0)
    return tuple(sorted(by_ts.items()))


@dataclass
class LiveModel:
    now_unix_s: float
    window_start_unix_s: float
    in_flight: list[InFlightView]
    gpu_figures: list[tuple[int, go.Figure]]  # (GPU index, figure)
    bands_figure: go.Figure | None  # phases only, when there is no GPU to draw them under
    unexplained: list[Interval]
    models_table: pd.DataFrame
    models_figure: go.Figure | None
    host_figure: go.Figure | None
    gpu_state: str | None  # the collector's word, a GpuKind value: "nvml", "amd-sysfs", "macmon", "simulated", "none", ...
    gpu_message: str | None
    requests_in_window: int
    notes: list[str] = field(default_factory=list)
    vram_used_bytes: int | None = None  # the latest GPU sample's memory in use (all GPUs)
    direct_in_window: int = 0  # generations sent to Ollama directly (recorded from its runner) in the window
    bands_drawn: int = 0  # requests whose phases the timeline draws (the newest, BANDS_DRAWN_MAX at most)
    bands_left_out: int = 0  # older requests read for the timeline whose phases are not drawn
    # GPU time before this is not checked against the requests (more in the window than the page reads); None: all is.
    unexplained_checked_from_unix_s: float | None = None


def newest_bands(bands: Sequence[Band], max_requests: int) -> list[Band]:
    """The bands of the ``max_requests`` requests that started last (every phase of each)."""
    starts: dict[str, float] = {}
    for b in bands:
        starts[b.request_id] = min(b.start_unix_s, starts.get(b.request_id, b.start_unix_s))
    kept = set(sorted(starts, key=lambda rid: starts[rid])[-max_requests:]) if max_requests > 0 else set()
    return [b for b in bands if b.request_id in kept]


def timeline_refresh_s(window_s: float) -> float:
    """How often the GPU timeline redraws: every second on a 1-minute window, every 2 s up to 5 minutes, then
    less often (on a 24-hour axis one pixel is more than a minute; redrawing each second costs for nothing, and
    each redraw mounts the figure anew in the browser). The cards above follow each generation every second."""
    if window_s <= 60:
        return 1.0
    if window_s <= 900:
        return 2.0
    if window_s <= 3600:
        return 5.0
    return 30.0


def build_live(
    db: Path, now_unix_s: float, window_s: float, *, flight: bool = True, timeline: bool = True, context: bool = True
) -> LiveModel | None:
    """What the Live page shows for one refresh of the chosen parts; None when there is no store yet.

    ``flight`` (every second): generations in flight. ``timeline`` (``timeline_refresh_s``): GPU timelines
    with request bands and bypass warnings. ``context`` (every 5 s): loaded models and host.
    """
    snap = load_live(db, now_unix_s, window_s, flight=flight, timeline=timeline, context=context)
    if snap is None:
        return None
    start = now_unix_s - window_s
    names = loaded_names(snap.loaded)
    in_flight = [in_flight_view(r, now_unix_s, names) for r in snap.in_flight]
    drawn = newest_bands(snap.bands, BANDS_DRAWN_MAX)
    bands = assign_lanes(drawn)
    # Per GPU: a bypassing client shows up on the GPU it runs on.
    checked_from = snap.explained_from_unix_s
    unexplained_by_gpu = {
        i: unexplained_gpu_activity(_judged(samples, checked_from), snap.busy_intervals)
        for i, samples in snap.gpu_by_index.items()
    }
    unexplained = sorted((u for found in unexplained_by_gpu.values() for u in found), key=lambda u: u.start_unix_s)
    gpu_figures = [
        (index, charts.gpu_timeline_figure(samples, bands, start, now_unix_s, unexplained=unexplained_by_gpu[index]))
        for index, samples in sorted(snap.gpu_by_index.items())
    ]
    bands_figure = None
    if not gpu_figures and bands:
        bands_figure = charts.phase_bands_figure(bands, start, now_unix_s, "Request phases (no GPU samples)")
    models_table = pd.DataFrame(
        [
            {
                "model": fmt.label(m.name),  # cut: a name from Ollama can be any length
                "size": fmt.gb(m.size_bytes),
                "in VRAM": fmt.gb(m.size_vram_bytes),
                "in system memory": fmt.gb(max(m.size_bytes - m.size_vram_bytes, 0)),
                "on GPU %": _on_gpu_pct(m, snap.placements.get(m.name)),
                "placement from": _placement_from(snap.placements.get(m.name)),
                "context length": m.context_length,
                "unloads in": _unloads_in(m.expires_at_unix_s, now_unix_s),
                "quantization": fmt.label(m.quantization_level) if m.quantization_level else m.quantization_level,
            }
            for m in snap.loaded
        ]
    )
    return LiveModel(
        now_unix_s=now_unix_s,
        window_start_unix_s=start,
        in_flight=in_flight,
        gpu_figures=gpu_figures,
        bands_figure=bands_figure,
        unexplained=unexplained,
        models_table=models_table,
        models_figure=_models_figure(tuple((m.name, m.size_bytes, m.size_vram_bytes) for m in snap.loaded))
        if snap.loaded and context
        else None,
        host_figure=charts.host_figure(snap.host, start, now_unix_s) if snap.host else None,
        gpu_state=snap.gpu_state,
        gpu_message=snap.gpu_message,
        requests_in_window=snap.requests_in_window,
        vram_used_bytes=snap.vram_used_bytes,
        direct_in_window=snap.direct_in_window,
        bands_drawn=len({b.request_id for b in drawn}),
        bands_left_out=len({b.request_id for b in snap.bands}) - len({b.request_id for b in drawn}),
        unexplained_checked_from_unix_s=checked_from,
    )


def _judged(samples: list[GpuSample], checked_from_unix_s: float | None) -> list[GpuSample]:
    """The GPU samples the read requests can explain: those from ``checked_from_unix_s`` on (all when None)."""
    return samples if checked_from_unix_s is None else [s for s in samples if s.ts_unix_s >= checked_from_unix_s]


def _on_gpu_pct(m: LoadedModel, p: PlacementInUse | None) -> int | None:
    """The share of the model on the GPU: the runner's own figure where it said one, else /api/ps's."""
    if p is not None and p.source != SOURCE_ASSUMED:
        return round(100 * p.gpu_fraction)
    return round(100 * m.size_vram_bytes / m.size_bytes) if m.size_bytes else None


def _placement_from(p: PlacementInUse | None) -> str:
    """Which source the share is from, and /api/ps's own share where it disagrees by more than 10%."""
    if p is None or p.source == SOURCE_ASSUMED:
        return "Ollama's /api/ps"
    if not p.from_runner:
        return "Ollama's /api/ps (no runner load lines read)"
    said = f"the runner's load lines ({describe_layers(p.runner)})"
    return said + (f"; /api/ps says {p.ps_fraction:.0%}" if p.disagreement and p.ps_fraction is not None else "")


@functools.lru_cache(maxsize=8)
def _models_figure(models: tuple[tuple[str, int, int], ...]) -> go.Figure:
    """Built again only when what it draws changed (names and sizes), not on every poll."""
    return charts.loaded_models_figure([LoadedModel(0.0, n, n, "", size, vram, None, None) for n, size, vram in models])


def _unloads_in(expires_at_unix_s: float | None, now_unix_s: float) -> str:
    if expires_at_unix_s is None:
        return "—"
    left = expires_at_unix_s - now_unix_s
    if left > 365 * 24 * 3600:
        return "never (kept loaded)"
    if left <= 0:
        return "busy or unloading"  # /api/ps keeps a stale expiry while a request runs
    return fmt.seconds(left)


@dataclass(frozen=True)
class CardsModel:
    cards: list[Card]  # running first (oldest first), then the finished ones still shown
    strip: NowStrip
    record_text: bool
    requests_in_window: int
    now_unix_s: float
    chars_measured: dict[str, bool] = field(default_factory=dict)
    last_load_s: dict[str, float] = field(default_factory=dict)
    queues: list[ModelQueue] = field(default_factory=list)  # per running model: how many run, how many wait

    @property
    def running(self) -> int:
        return sum(1 for c in self.cards if c.phase != "finished")


def decode_ceiling_fn(snap: CardsSnapshot) -> DecodeCeiling:
    """The decode ceiling for a model at a context length, from its basis: where the runner put it (else /api/ps),
    the GPU, the model's facts, as the Why chart draws it (None: unknown)."""

    def ceiling(model: str, context_tokens: int) -> float | None:
        basis = snap.bases.get(model)
        return basis.decode_ceiling_tok_s(context_tokens) if basis is not None else None

    return ceiling


def build_cards(db: Path, now_unix_s: float, window_s: float) -> CardsModel | None:
    snap = load_cards(db, now_unix_s, window_s)
    if snap is None:
        return None
    loaded = {name: m.context_length for m in snap.loaded for name in (m.name, m.model)}
    served = tuple(
        (r.model, r.started_at_unix_s + r.ttft_s, r.ended_at_unix_s)
        for r in snap.recent
        if r.outcome is not Outcome.IN_FLIGHT and r.ttft_s is not None and r.ended_at_unix_s is not None
    )
    loads = LoadContext(snap.loaded_since, snap.model_size_bytes, snap.vram_free_bytes, served)
    running = in_flight_cards(snap.in_flight, snap.progress, loaded, now_unix_s, decode_ceiling_fn(snap), loads)
    running, queues = queue_cards(running, snap.slots, snap.ollama_queued)
    running = slowed_cards(running, snap.slots, now_unix_s)
    done = finished_cards(snap.recent, now_unix_s, waits=snap.waits, splits=finished_phases(snap.recent, snap.slots, now_unix_s))
    strip = replace(now_strip(running, snap.recent, now_unix_s), waiting=sum(q.waiting for q in queues))
    return CardsModel(
        running + done,
        strip,
        snap.record_text,
        snap.requests_in_window,
        now_unix_s,
        snap.chars_measured,
        snap.last_load_s,
        queues,
    )

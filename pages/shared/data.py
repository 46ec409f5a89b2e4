"""The pages' view of the store: short read-only queries (``store.queries``) shaped for each page.

Every function opens the store read-only for one use and returns None when there is
no store yet, so a page can show its empty state instead of an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.model_names import same_model
from analysis.records import (
    CollectorInfo,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    ProgressSample,
    RequestRecord,
)
from pages.shared.derive import Band, Interval
from store import queries
from store.queries import StoredRequest
from store.schema import db_path as _db_path
from store.tables import RequestSummary

ENDPOINTS = ("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions")
BANDS_LIMIT = 2000  # requests drawn under the GPU timeline


def db_path(data_dir: Path) -> Path:
    return _db_path(data_dir)


# Every function below reads through store.queries.open_reader: None while there is no store yet.
_open = queries.open_reader


@dataclass(frozen=True)
class Status:
    ollama: OllamaStatus | None = None
    heartbeat: CollectorInfo | None = None
    gpus: list[GpuSample] = field(default_factory=list)  # latest sample of each GPU
    store_exists: bool = False
    ollama_down_since_unix_s: float | None = None  # the first failed poll after the last answer (None: up, or unknown)


def load_status(db: Path, now_unix_s: float | None = None) -> Status:
    """Ollama's last poll, the collector's heartbeat and the GPUs it saw in the last minute."""
    import time

    now = time.time() if now_unix_s is None else now_unix_s
    with _open(db) as conn:
        if conn is None:
            return Status()
        latest: dict[int, GpuSample] = {}
        for s in queries.gpu_samples(conn, now - 60, now + 5):
            latest[s.index] = s
        ollama = queries.latest_ollama_status(conn)
        return Status(
            ollama=ollama,
            heartbeat=queries.latest_heartbeat(conn),
            gpus=[latest[i] for i in sorted(latest)],
            store_exists=True,
            ollama_down_since_unix_s=queries.ollama_down_since(conn) if ollama is not None and not ollama.up else None,
        )


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


def bands_of(row: RequestSummary) -> list[Band]:
    """Phase bands of one finished request from its stored wall-clock boundaries."""
    rid, model = row.id, row.model
    load_start = row.load_start_unix_s
    prefill_start = row.prefill_start_unix_s
    decode_start = row.decode_start_unix_s
    decode_end = row.decode_end_unix_s
    out: list[Band] = []
    if load_start is not None and row.load_s is not None:  # a load request has a load and nothing after it
        load_end = load_start + row.load_s
        if load_end > load_start:
            out.append(Band(rid, model, "load", load_start, load_end))
        if prefill_start is not None and prefill_start > load_end:
            out.append(Band(rid, model, "queue", load_end, prefill_start))
    if prefill_start is not None and decode_start is not None and decode_start > prefill_start:
        out.append(Band(rid, model, "prefill", prefill_start, decode_start))
    if decode_start is not None and decode_end is not None and decode_end > decode_start:
        out.append(Band(rid, model, "decode", decode_start, decode_end))
    return out


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
            for s in queries.gpu_samples(conn, start, now_unix_s + 1):
                gpu_by_index.setdefault(s.index, []).append(s)
            # Requests that started up to 10 min before the window may still reach into it.
            rows = queries.recent_requests(conn, start - 600, limit=BANDS_LIMIT, until_unix_s=now_unix_s)
        vram_used: int | None = None
        if context:
            host = queries.host_samples(conn, start, now_unix_s + 1)
            latest: dict[int, GpuSample] = {s.index: s for s in queries.gpu_samples(conn, now_unix_s - 10, now_unix_s + 1)}
            used = [s.mem_used_bytes for s in latest.values() if s.mem_used_bytes is not None]
            vram_used = sum(used) if used else None
        loaded = queries.latest_loaded_models(conn)
        heartbeat = queries.latest_heartbeat(conn)
    bands: list[Band] = []
    busy: list[Interval] = []
    shown = direct = 0
    for row in rows:
        if row.outcome is Outcome.IN_FLIGHT:
            continue  # drawn below from the in-flight records, which are fresher
        end = row.ended_at_unix_s or row.updated_at_unix_s or row.started_at_unix_s
        if end < start:
            continue
        shown += row.started_at_unix_s >= start
        direct += row.started_at_unix_s >= start and row.direct
        busy.append(Interval(row.started_at_unix_s, end))
        bands.extend(bands_of(row))
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
    )


@dataclass(frozen=True)
class HistoryOptions:
    models: list[str]
    endpoints: list[str]
    outcomes: list[str]


def load_history(
    db: Path,
    start_unix_s: float,
    end_unix_s: float,
    model: str | None,
    endpoint: str | None,
    outcome: str | None,
    limit: int | None,
) -> tuple[list[RequestSummary], HistoryOptions] | None:
    """Requests started in the window that match the filters (None = any), newest first."""
    with _open(db) as conn:
        if conn is None:
            return None
        rows = queries.recent_requests(
            conn,
            start_unix_s,
            model=model,
            endpoint=endpoint,
            outcome=outcome,
            limit=limit if limit is not None else 10_000_000,
            until_unix_s=end_unix_s,
        )
        options = HistoryOptions(
            models=queries.request_models(conn, start_unix_s),
            endpoints=list(ENDPOINTS),
            outcomes=[o.value for o in Outcome],
        )
    return rows, options


def load_request(db: Path, request_id: str) -> StoredRequest | None:
    """One request with its stored phases (None: unknown, or no store yet)."""
    with _open(db) as conn:
        if conn is None:
            return None
        return queries.request_detail(conn, request_id)


@dataclass
class RequestContext:
    """What the explainer needs beside the record: the GPU during the request, the model's facts, where it sat."""

    gpu_samples: list[GpuSample]
    show: dict[str, Any] | None  # Ollama's /api/show answer
    loaded: LoadedModel | None


def load_request_context(db: Path, rec: RequestRecord, end_unix_s: float) -> RequestContext:
    with _open(db) as conn:
        if conn is None:
            return RequestContext([], None, None)
        samples = queries.gpu_samples(conn, rec.started_at_unix_s - 1, end_unix_s + 1)
        info = queries.model_info(conn, rec.model)
        loaded = queries.loaded_model(conn, rec.model)
    return RequestContext(samples, None if info is None else info.show, loaded)


@dataclass
class CardsSnapshot:
    """What the Live page's cards and "now" strip read: running requests with their progress readings, the
    requests of the last minute, loaded models, the latest GPU sample, and each running model's /api/show."""

    in_flight: list[RequestRecord]
    progress: dict[str, list[ProgressSample]]
    recent: list[RequestSummary]
    loaded: list[LoadedModel]
    gpu: GpuSample | None
    shows: dict[str, dict[str, Any]]
    record_text: bool
    requests_in_window: int
    chars_measured: dict[str, bool] = field(default_factory=dict)  # model → its tokens per character are measured
    last_load_s: dict[str, float] = field(default_factory=dict)  # model being loaded → how long its last load took
    # What tells a wait for a load apart (read only while a running request's model is not loaded):
    loaded_since: dict[str, float] = field(default_factory=dict)  # loaded model → first /api/ps listing it lately
    model_size_bytes: dict[str, int] = field(default_factory=dict)  # installed model → its file's size
    vram_free_bytes: tuple[tuple[float, int], ...] = ()  # (time, free memory of all GPUs), the last minute


def load_cards(db: Path, now_unix_s: float, window_s: float, recent_s: float = 60.0) -> CardsSnapshot | None:
    with _open(db) as conn:
        if conn is None:
            return None
        in_flight = queries.in_flight_requests(conn, now_unix_s)
        progress = queries.progress_samples(conn, [r.id for r in in_flight]) if in_flight else {}
        # Requests that may overlap the last minute (started up to 10 min before it).
        recent = [
            r
            for r in queries.recent_requests(conn, now_unix_s - recent_s - 600, limit=500, until_unix_s=now_unix_s)
            if (r.ended_at_unix_s or now_unix_s) >= now_unix_s - recent_s
        ]
        loaded = queries.latest_loaded_models(conn)
        gpus = queries.gpu_samples(conn, now_unix_s - 60, now_unix_s + 5)
        shows: dict[str, dict[str, Any]] = {}
        for model in {r.model for r in in_flight if r.token_chunk_ns}:
            info = queries.model_info(conn, model)
            if info is not None:
                shows[model] = info.show
        heartbeat = queries.latest_heartbeat(conn)
        in_window = queries.requests_started_count(conn, now_unix_s - window_s, now_unix_s)
        # Whether the collector's estimate has measured tokens per character for the model, or assumes its default.
        chars_measured = {
            model: any(h.prompt_chars and h.prompt_tokens for h in queries.prompt_history(conn, model))
            for model in {r.model for r in in_flight if not r.token_chunk_ns}
        }
        names = {n for m in loaded for n in (m.name, m.model)}
        not_loaded = {r.model for r in in_flight if not any(same_model(r.model, n) for n in names)}
        last_load = {model: t for model in not_loaded if (t := queries.last_load_s(conn, model)) is not None}
        loaded_since: dict[str, float] = {}
        sizes: dict[str, int] = {}
        if not_loaded:  # some running request waits for a model: when others loaded, sizes, free memory
            since = min(r.started_at_unix_s for r in in_flight)
            loaded_since = queries.loaded_since(conn, max(since, now_unix_s - 600))
            sizes = {k: m.size_bytes for m in queries.installed_models(conn) if m.size_bytes for k in (m.name, m.model)}
    return CardsSnapshot(
        in_flight=in_flight,
        progress=progress,
        recent=recent,
        loaded=loaded,
        gpu=gpus[-1] if gpus else None,
        shows=shows,
        record_text=bool(heartbeat and heartbeat.record_text),
        requests_in_window=in_window,
        chars_measured=chars_measured,
        last_load_s=last_load,
        loaded_since=loaded_since,
        model_size_bytes=sizes,
        vram_free_bytes=_free_vram(gpus) if not_loaded else (),
    )


def _free_vram(samples: list[GpuSample]) -> tuple[tuple[float, int], ...]:
    """(time, free memory summed over the GPUs read at that time), oldest first; readings without memory skipped."""
    by_ts: dict[float, int] = {}
    for s in samples:
        if s.mem_total_bytes is not None and s.mem_used_bytes is not None:
            by_ts[s.ts_unix_s] = by_ts.get(s.ts_unix_s, 0) + max(s.mem_total_bytes - s.mem_used_bytes, 0)
    return tuple(sorted(by_ts.items()))

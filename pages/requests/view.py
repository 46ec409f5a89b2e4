"""The Requests page's view-models, store → tables and figures (no Streamlit, timed by
``bench/pages_refresh.py``): ``build_history`` for the filtered history, ``build_detail`` for one request.
``pages/requests/page.py`` draws them; the rates chart is in ``pages/requests/figures.py``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from analysis.client_program import process_label, program_label
from analysis.diagnose import Diagnosis
from analysis.explain import explain_request
from analysis.phases import Flag, Phases, PhaseSource
from analysis.records import GpuSample, Outcome, RequestKind, RequestRecord
from analysis.runner_wait_tasks import TaskWaits
from analysis.runner_wait_words import waits_label
from analysis.wait_split import BATCH, QUEUE, RUNNER, UNEXPLAINED, WaitSplit, direct_arrival_s, split_for
from pages.requests.figures import rates_figure
from pages.shared import charts, fmt
from pages.shared.basis import ModelBasis, cached_basis
from pages.shared.charts import Span
from pages.shared.slot_count import slot_count
from store import queries, sample_queries
from store.export import ExportWindow, csv_text
from store.queries import StoredRequest
from store.tables import RequestSummary

SHOWN_ROWS = 2000  # the table shows the latest rows; the CSV has every match
LINK_ID_SHOWN_CHARS = 40  # a request id is 32 hex characters; what a ?request= link carries is cut to this when shown

# Columns of the history table, in order, with the names a user reads.
HISTORY_COLUMNS = {
    "time": "time",
    "model": "model",
    "endpoint": "endpoint",
    "kind": "kind",
    "stream": "streamed",
    "outcome": "outcome",
    "seen": "seen from",
    "client": "client",
    "program": "program",
    "process": "process",
    "ttft_s": "first token (s)",
    "server_ttft_s": "first token, server side (s)",
    "ttfa_s": "first answer token (s)",
    "client_s": "total seen by client (s)",
    "load_s": "load (s)",
    "queue_s": "queue (s)",
    "prefill_s": "prefill (s)",
    "decode_s": "decode (s)",
    "prompt_tokens": "prompt tokens",
    "cached_tokens": "cached tokens",
    "output_tokens": "output tokens",
    "thinking_tokens": "thinking tokens",
    "prefill_tok_s": "prefill tok/s",
    "decode_tok_s": "decode tok/s",
    "flags": "flags",
    "id": "id",
}


_open = queries.open_reader  # None while there is no store yet
ENDPOINTS = ("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")


@dataclass(frozen=True)
class HistoryOptions:
    models: list[str]
    endpoints: list[str]
    outcomes: list[str]
    programs: list[str]  # User-Agent products seen in the window (store.queries.MAX_PROGRAMS_LISTED at most)


def load_history(
    db: Path,
    start_unix_s: float,
    end_unix_s: float,
    model: str | None,
    endpoint: str | None,
    outcome: str | None,
    limit: int | None,
    program: str | None = None,
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
            program=program,
        )
        options = HistoryOptions(
            models=queries.request_models(conn, start_unix_s),
            endpoints=list(ENDPOINTS),
            outcomes=[o.value for o in Outcome],
            programs=queries.request_programs(conn, start_unix_s),
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
    """What the explainer needs beside the record: the GPU during the request, and the model's basis (where it
    sits, the GPU, its facts, the calibrated decode model: the one Why explains from)."""

    gpu_samples: list[GpuSample]
    basis: ModelBasis | None


def load_request_context(db: Path, rec: RequestRecord, end_unix_s: float) -> RequestContext:
    with _open(db) as conn:
        if conn is None:
            return RequestContext([], None)
        samples = sample_queries.gpu_samples(conn, rec.started_at_unix_s - 1, end_unix_s + 1)
        # The GPU it ran on (the samples up to its end); the basis is kept a few seconds for the next detail drawn.
        basis = cached_basis(db, conn, rec.model, end_unix_s)
    return RequestContext(samples, basis)


@dataclass
class HistoryModel:
    rows: list[RequestSummary]  # as the store returns them, newest first
    frame: pd.DataFrame  # the same rows with user-facing column names
    truncated: bool  # more requests match than SHOWN_ROWS
    options: HistoryOptions

    @cached_property
    def _rates(self) -> tuple[go.Figure | None, str | None]:
        # Built when first asked for: the page shows the table before it draws the chart (first content sooner).
        return rates_figure(self.rows) if self.rows else (None, None)

    @property
    def figure(self) -> go.Figure | None:
        """The rates chart of the rows (None: no rows)."""
        return self._rates[0]

    @property
    def figure_note(self) -> str | None:
        """What the rates chart draws apart."""
        return self._rates[1]


def build_history(
    db: Path,
    start_unix_s: float,
    end_unix_s: float,
    model: str | None = None,
    endpoint: str | None = None,
    outcome: str | None = None,
    program: str | None = None,
) -> HistoryModel | None:
    """The filtered history (None = any value); None when there is no store yet."""
    result = load_history(db, start_unix_s, end_unix_s, model, endpoint, outcome, limit=SHOWN_ROWS + 1, program=program)
    if result is None:
        return None
    rows, options = result
    truncated = len(rows) > SHOWN_ROWS
    rows = rows[:SHOWN_ROWS]
    return HistoryModel(rows=rows, frame=history_frame(rows), truncated=truncated, options=options)


def history_frame(rows: Sequence[RequestSummary]) -> pd.DataFrame:
    frame = pd.DataFrame([vars(r) for r in rows])  # shallow: asdict's deep copies cost ~0.2 s for 2,000 rows
    if frame.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS.values()))
    frame["time"] = pd.to_datetime(frame["started_at_unix_s"], unit="s", utc=True).dt.tz_convert(_local_tz()).dt.tz_localize(None)
    frame["client"] = frame["client_addr"]
    frame["program"] = [program_label(r.client_program, r.client_program_version) for r in rows]
    frame["process"] = [process_label(r.client_process, r.client_pid, r.client_user) for r in rows]
    frame["seen"] = [seen_from(r) for r in rows]
    frame["outcome"] = frame["outcome"].map(str)
    frame["kind"] = frame["kind"].map(str)
    frame["flags"] = frame["flags"].map(lambda codes: ", ".join(codes) if isinstance(codes, tuple | list) else "")
    frame = frame[list(HISTORY_COLUMNS)].rename(columns=HISTORY_COLUMNS)
    return frame


# On the page (not in the CSV, whose numbers stay numbers): durations in ms below 1 s, integers, "—" when unknown.
DURATION_COLUMNS = (
    "first token (s)",
    "first token, server side (s)",
    "first answer token (s)",
    "total seen by client (s)",
    "load (s)",
    "queue (s)",
    "prefill (s)",
    "decode (s)",
)
COUNT_COLUMNS = ("prompt tokens", "cached tokens", "output tokens", "thinking tokens")
RATE_COLUMNS = ("prefill tok/s", "decode tok/s")


def display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The history table as the page shows it: each cell in the units convention, durations named without "(s)"."""
    out = frame.copy()

    def known(v: object) -> bool:
        return v is not None and not (isinstance(v, float) and math.isnan(v))

    for col in ("endpoint", "client", "program", "process"):  # a direct record's route and client; a program unknown
        out[col] = [v if known(v) else fmt.UNKNOWN for v in out[col]]
    for col in DURATION_COLUMNS:
        out[col] = [fmt.seconds(float(v)) if known(v) else fmt.UNKNOWN for v in out[col]]
    for col in COUNT_COLUMNS:
        out[col] = [fmt.count(float(v)) if known(v) else fmt.UNKNOWN for v in out[col]]
    for col in RATE_COLUMNS:
        out[col] = [f"{float(v):,.1f}" if known(v) else fmt.UNKNOWN for v in out[col]]
    for col in (
        "model",
        "endpoint",
        "client",
        "program",
        "process",
    ):  # from clients: cut (the detail below offers the whole name)
        out[col] = [fmt.label(v) if isinstance(v, str) else v for v in out[col]]
    return out.rename(columns={c: c.removesuffix(" (s)") for c in DURATION_COLUMNS})


def _local_tz() -> object:
    from datetime import datetime

    return datetime.now().astimezone().tzinfo


def csv_bytes(
    db: Path,
    start_unix_s: float,
    end_unix_s: float,
    model: str | None,
    endpoint: str | None,
    outcome: str | None,
    program: str | None = None,
) -> bytes:
    """Every matching request of the window as CSV: ``python -m store export``'s file (its columns, UTC times with
    their zone), one export for the page and the command line, never prompt or reply text."""
    window = ExportWindow(start_unix_s, end_unix_s, model, endpoint, outcome, program)
    with _open(db) as conn:
        return csv_text(conn, window).encode()


@dataclass
class DetailModel:
    record: RequestRecord
    phases: Phases
    waterfall: go.Figure
    gaps: go.Figure | None
    rates: pd.DataFrame
    sources: pd.DataFrame
    thinking: pd.DataFrame
    headlines: list[Headline]
    sentences: list[str]
    diagnoses: list[Diagnosis]
    flags: list[str]
    placement: str | None = None  # where the model sits, from what source (both figures when /api/ps disagrees)


def _before_prefill_label(waits: TaskWaits | None) -> str:
    """The waterfall's name for the time before prefill: the runner's own work when it named it (the first part and
    how many more; the diagnosis lists them all), else "queue"."""
    named = waits_label(waits, short=True) if waits is not None else None
    return f"runner: {named}" if named else "queue"


WAIT_LABELS = {QUEUE: "queue", BATCH: "waiting for another request's batches", UNEXPLAINED: "wait (unexplained)"}


def _wait_points(
    rec: RequestRecord, ph: Phases, waits: TaskWaits | None, split: WaitSplit | None
) -> list[tuple[str, int | None, int | None]]:
    """The bars between load and prefill: one, named after the runner's lines, without a split; with one, a bar per
    part in time order (the runner's part named after its lines)."""
    if split is None or not split.pieces:
        return [(_before_prefill_label(waits), ph.load_end_ns, ph.prefill_start_ns)]

    def ns(t_s: float) -> int:
        return rec.received_ns + round((t_s - rec.started_at_unix_s) * 1e9)

    runner = _before_prefill_label(waits)
    return [(runner if kind == RUNNER else WAIT_LABELS[kind], ns(t0), ns(t1)) for kind, t0, t1 in split.pieces]


def neighbour_spans(rec: RequestRecord, split: WaitSplit | None) -> list[Span]:
    """Each other request's prefill that weighed on this one, drawn beside it (ms since this one was received)."""
    if split is None:
        return []
    out = []
    for h in split.hits:
        if h.other.prefill is None or h.lost_s <= 0:
            continue
        a, b = ((t - rec.started_at_unix_s) * 1000 for t in h.other.prefill)
        size = f"{fmt.count(h.other.prompt_tokens)}-token " if h.other.prompt_tokens else ""
        # Its size only: the model is this one's (the same runner), and a client's text never goes into a label.
        out.append(Span(f"another request's prefill: {size}prompt", max(a, 0.0), b))
    return out


def time_origin(rec: RequestRecord) -> str:
    """What the detail's time axis counts from, in words: the proxy's receipt, or for a request the proxy never saw
    the first moment its record knows (``collectors.ollama.direct`` places it there: the load the log timed just
    before its task, else the task's start)."""
    if not rec.direct:
        return "the proxy received the request"
    if rec.runner_source == PhaseSource.ACCESS:
        return "Ollama received the request (its access line)"
    if rec.metrics is not None and rec.metrics.load_duration_ns:
        return "the runner's model began to load"
    return "the runner started the task"


_Point = tuple[str, int | None, int | None]  # a span's label, start and end on the record's clock (ns)


def waterfall_spans(
    rec: RequestRecord, ph: Phases, waits: TaskWaits | None = None, split: WaitSplit | None = None
) -> tuple[list[Span], list[Span], float | None]:
    """Ollama's phases (only those its durations give) and the client's view, in ms since the proxy received
    the request. A thinking model's decode is split at its first answer token. ``waits``: what the runner said it
    did before reading the prompt (``analysis.runner_wait_lines``); the time before prefill is named after it. ``split``
    (``analysis.wait_split``): the time before prefill drawn in its parts (queue, another request's batches, the
    runner's own work, unexplained) instead of one bar."""

    def rel(ns: int) -> float:
        return (ns - rec.received_ns) / 1e6

    answer_ns = rec.first_answer_ns if rec.thinking_chunks else None
    ollama = [
        Span(label, rel(a), rel(b))
        for label, a, b in _ollama_points(rec, ph, answer_ns, waits, split)
        if a is not None and b is not None and b > a
    ]
    if rec.direct:
        return ollama, [], None  # no proxy saw it: there is no client's view
    client: list[Span] = []
    for label, a_ns, b_ns in _client_points(rec, answer_ns):
        if a_ns is None or b_ns is None:
            continue
        start_ms = 0.0 if label == "waiting for first byte" else rel(a_ns)
        end_ms = rel(b_ns)
        if end_ms - start_ms > 0.05:
            client.append(Span(label, start_ms, end_ms))
    ttft_ms = rel(rec.first_token_ns) if rec.first_token_ns is not None and rec.stream else None
    return ollama, client, ttft_ms


def _ollama_points(
    rec: RequestRecord, ph: Phases, answer_ns: int | None, waits: TaskWaits | None, split: WaitSplit | None
) -> list[_Point]:
    """The phases placed by durations: Ollama's, or for a direct record the runner's (its log, else /slots readings)."""
    points: list[_Point] = []
    timed = {PhaseSource.OLLAMA, PhaseSource.LOG, PhaseSource.SLOTS} if rec.direct else {PhaseSource.OLLAMA}
    if ph.load_source in timed:
        points.append(("load", ph.load_start_ns, ph.load_end_ns))
        if ph.queue_source in timed:
            points += _wait_points(rec, ph, waits, split)
    if ph.prefill_source in timed:
        points.append(("prefill", ph.prefill_start_ns, ph.decode_start_ns))
    if ph.decode_source in timed:
        if answer_ns is not None and ph.decode_start_ns is not None and ph.decode_start_ns < answer_ns:
            points += [("thinking", ph.decode_start_ns, answer_ns), ("answer", answer_ns, ph.decode_end_ns)]
        else:
            points.append(("decode", ph.decode_start_ns, ph.decode_end_ns))
    return points


def _client_points(rec: RequestRecord, answer_ns: int | None) -> list[_Point]:
    """What the client saw, as the proxy timed it; a thinking model's stream split at its first answer token."""
    streaming: list[_Point] = [("streaming tokens", rec.first_token_ns, rec.final_chunk_ns)]
    if answer_ns is not None:
        streaming = [("streaming thinking", rec.first_token_ns, answer_ns), ("streaming answer", answer_ns, rec.final_chunk_ns)]
    return [
        ("waiting for first byte", rec.received_ns, rec.first_byte_ns),
        ("first byte to first token", rec.first_byte_ns, rec.first_token_ns),
        *streaming,
        ("after last token", rec.final_chunk_ns, rec.closed_ns),
    ]


MODEL_NOT_KNOWN = "model not known"  # a direct request recorded from Ollama's access line alone: the line names none

# How the detail names each source of a value.
SOURCE_NAMES: dict[str, str] = {
    PhaseSource.OLLAMA: "Ollama's durations and counts",
    PhaseSource.USAGE: "the reply's usage counts",
    PhaseSource.STREAM: "the stream's timing (proxy)",
    PhaseSource.COUNTED: "chunks counted by the proxy",
    PhaseSource.SLOTS: "the runner's /slots",
    PhaseSource.LOG: "Ollama's log",
    PhaseSource.ESTIMATE: "an estimate",
}


def sources_frame(ph: Phases) -> pd.DataFrame:
    """Each phase's value and where it came from; "—" where it is not known (never 0)."""

    def row(label: str, value: str, source: PhaseSource | None) -> dict[str, str]:
        return {
            "phase": label,
            "value": value if source is not None else "—",
            "from": SOURCE_NAMES.get(source, "—") if source is not None else "not known",
        }

    def count(n: int | None) -> str:
        return fmt.count(n)

    rows = [
        row("load", fmt.seconds(ph.load_s), ph.load_source),
        row("queue", fmt.seconds(ph.queue_s), ph.queue_source),
        row("prefill", fmt.seconds(ph.prefill_s), ph.prefill_source),
        row("decode", fmt.seconds(ph.decode_s), ph.decode_source),
        row("prompt tokens", count(ph.prompt_tokens), ph.prompt_tokens_source),
        row("output tokens", count(ph.output_tokens), ph.output_tokens_source),
    ]
    if ph.thinking_source is not None:
        rows.append(row("thinking tokens", count(ph.thinking_tokens), ph.thinking_source))
    return pd.DataFrame(rows, columns=["phase", "value", "from"])


@dataclass(frozen=True)
class Headline:
    """One number of the detail's top row: its label, value, and what it means."""

    label: str
    value: str
    help: str | None = None


def headlines(rec: RequestRecord, ph: Phases, split: WaitSplit | None = None) -> list[Headline]:
    """The detail's top row: the waits and phases that matter for this kind of request. ``split``: the wait before
    prefill in its parts (analysis.wait_split); then "Queue" is only the time every slot held another task."""
    out: list[Headline] = []
    if rec.kind in (RequestKind.LOAD, RequestKind.UNLOAD):
        out.append(Headline("Kind", str(rec.kind), "An empty prompt: Ollama only loads (or unloads) the model."))
    elif rec.kind is RequestKind.EMBED:
        out.append(Headline("Inputs", fmt.count(rec.batch_size), "Texts in the embed request."))
    elif rec.stream:
        out.append(Headline("First token", fmt.seconds(ph.ttft_s), "As the client saw it: request → first streamed token."))
    else:
        out.append(
            Headline(
                "First token (server side)",
                fmt.seconds(ph.server_ttft_s),
                "Not streamed: the client saw nothing before the whole reply. This is Ollama's queue + load + "
                "prefill from its durations, not a wait the client saw.",
            )
        )
    if ph.thinking_tokens:
        out.append(
            Headline(
                "First answer token",
                fmt.seconds(ph.ttfa_s),
                "After the model's thinking: the first token of the answer the person waits for.",
            )
        )
    out.append(Headline("Total (client)", fmt.seconds(ph.client_s)))
    out.append(Headline("Load", fmt.seconds(ph.load_s), _source_help(ph.load_source)))
    if rec.kind is RequestKind.GENERATE:
        out += _wait_headlines(ph, split)
    if rec.kind in (RequestKind.GENERATE, RequestKind.EMBED):
        out.append(Headline("Prefill", fmt.seconds(ph.prefill_s), _source_help(ph.prefill_source)))
    if rec.kind is RequestKind.GENERATE:
        out.append(Headline("Decode", fmt.seconds(ph.decode_s), _source_help(ph.decode_source)))
    return out


def _wait_headlines(ph: Phases, split: WaitSplit | None) -> list[Headline]:
    """The wait before prefill: Ollama's one figure, or with the split its queue for a slot and, where other
    requests' prompts held it back, that wait beside it."""
    if split is None or split.queue_s is None or not split.pieces:
        return [Headline("Queue", fmt.seconds(ph.queue_s), _source_help(ph.queue_source))]
    help_text = (
        f"Every slot of the runner held another request's task for this long, of the {fmt.seconds(split.wait_s)} "
        "before its prompt was read (the rest is drawn in the waterfall: other requests' batches, the runner's own "
        "work, what nothing explains)."
    )
    out = [Headline("Queue", fmt.seconds(split.queue_s), help_text)]
    if split.batch_wait_s > 0:
        out.append(
            Headline(
                "Behind others",
                fmt.seconds(split.batch_wait_s),
                "A slot was free, but another request's prompt was being read on the same runner: its task waited "
                "for those batches to end.",
            )
        )
    return out


def _source_help(source: PhaseSource | None) -> str:
    return "Not known for this request." if source is None else f"From {SOURCE_NAMES.get(source, str(source))}."


def thinking_frame(ph: Phases) -> pd.DataFrame:
    """A thinking model's decode, split: thinking tokens cost decode time like any other."""
    if not ph.thinking_tokens:
        return pd.DataFrame(columns=["part", "tokens", "time", "tok/s"])
    parts = (
        ("thinking", ph.thinking_tokens, ph.thinking_s, ph.thinking_tok_s),
        ("answer", ph.answer_tokens, ph.answer_s, ph.answer_tok_s),
    )
    rows = [{"part": p, "tokens": n, "time": fmt.seconds(t), "tok/s": fmt.rate(r)} for p, n, t, r in parts]
    return pd.DataFrame(rows, columns=["part", "tokens", "time", "tok/s"])


def rates_frame(rec: RequestRecord, ph: Phases) -> pd.DataFrame:
    """Our rates beside Ollama's, and why they differ."""
    rows: list[dict[str, object]] = []
    if rec.kind is RequestKind.EMBED and ph.prompt_tokens:
        why = (
            "Embeddings are prefill only: the prompt is evaluated, nothing is decoded. Prefill here is Ollama's "
            "total minus its load (it sends no prompt_eval_duration)."
        )
        rows.append(
            {"phase": "embedding (prompt)", "ours (tok/s)": ph.prefill_tok_s, "Ollama's (tok/s)": None, "why they differ": why}
        )
    elif ph.prompt_tokens:
        if ph.cached_tokens:
            computed = ph.prompt_tokens - ph.cached_tokens
            why = (
                f"Ollama divides all {fmt.count(ph.prompt_tokens)} prompt tokens by the time of the "
                f"{fmt.count(computed)} computed; we count only those."
            )
        elif ph.cached_tokens is None:
            why = "This Ollama does not report cached prompt tokens: if part of the prompt was cached, both numbers overstate."
        else:
            why = "Nothing came from the cache, so both count the same tokens."
        rows.append(
            {
                "phase": "prefill (prompt)",
                "ours (tok/s)": ph.prefill_tok_s,
                "Ollama's (tok/s)": ph.ollama_prefill_tok_s,
                "why they differ": why,
            }
        )
    if ph.output_tokens:
        if ph.output_tokens == 1:
            why = "One token: no interval to time, so there is no real decode rate."
        else:
            why = (
                f"eval_duration runs from the first to the last token: {fmt.count(ph.output_tokens - 1)} intervals for "
                f"{fmt.count(ph.output_tokens)} tokens. Ollama divides by {fmt.count(ph.output_tokens)}, so it reads "
                f"{100 / (ph.output_tokens - 1):.1f}% high."
            )
        rows.append(
            {
                "phase": "decode (output)",
                "ours (tok/s)": ph.decode_tok_s,
                "Ollama's (tok/s)": ph.ollama_decode_tok_s,
                "why they differ": why,
            }
        )
    chunks = rec.token_chunk_ns
    if len(chunks) >= 2 and chunks[-1] > chunks[0]:
        seen = (len(chunks) - 1) / ((chunks[-1] - chunks[0]) / 1e9)
        why = "Chunks arriving at the proxy, first to last: includes network and batching jitter."
        rows.append({"phase": "as the client saw it", "ours (tok/s)": seen, "Ollama's (tok/s)": None, "why they differ": why})
    frame = pd.DataFrame(rows, columns=["phase", "ours (tok/s)", "Ollama's (tok/s)", "why they differ"])
    # Text, so an unknown rate reads "—" (never "None") and the numbers keep their thousands separators.
    for col in ("ours (tok/s)", "Ollama's (tok/s)"):
        frame[col] = [fmt.rate(v) if v is not None and v == v else fmt.UNKNOWN for v in frame[col]]
    return frame


def runner_waits_of(db: Path, rec: RequestRecord, ph: Phases | None = None) -> tuple[TaskWaits | None, WaitSplit | None]:
    """The runner's own waits before this request's prompt, and its time among queue, the runner's own wait and
    other requests' prefills (analysis.wait_split) from the requests around it on the same runner."""
    conn = queries.open_readonly(db)
    end_ns = rec.final_chunk_ns or rec.closed_ns or rec.received_ns
    try:
        waits = queries.request_waits(conn, [rec.id]).get(rec.id)
        slots = slot_count(conn, rec.model, waits)
        # Its neighbours: every request alive between its arrival and its end (a slot holder started before it); a
        # direct request arrived before its task began, by what Ollama's access line says.
        arrived = direct_arrival_s(rec, ph) if ph is not None else None
        since = min(rec.started_at_unix_s, arrived) if arrived is not None else rec.started_at_unix_s
        around = queries.requests_in_window(conn, since, rec.wall_s(end_ns) + 1.0, limit=SPLIT_NEIGHBOURS)
    finally:
        conn.close()
    named = waits is not None and bool(waits.before_prefill())
    if ph is None:
        return waits, None
    pairs = [(s.record, s.phases) for s in around]
    return waits, split_for(rec, ph, pairs, n_slots=slots, runner_named=named)


SPLIT_NEIGHBOURS = 200  # requests read around one request to split its wait (analysis.wait_split keeps the nearest)


def explain(
    db: Path, rec: RequestRecord, ph: Phases, waits: tuple[TaskWaits | None, WaitSplit | None] = (None, None)
) -> tuple[list[str], list[Diagnosis], str | None]:
    """Sentences and diagnoses from the model's basis (the same as the Why page's), and where the model sits with
    the source of that figure."""
    end_ns = rec.closed_ns or rec.final_chunk_ns or (rec.token_chunk_ns[-1] if rec.token_chunk_ns else rec.received_ns)
    ctx = load_request_context(db, rec, rec.wall_s(end_ns))
    basis = ctx.basis
    if basis is None:
        return explain_request(rec, ph), [], None
    diagnoses = basis.diagnose(rec, ph, gpu_samples=ctx.gpu_samples, waits=waits[0], split=waits[1])
    sentences = explain_request(rec, ph, ceilings=basis.request_ceilings(ph), diagnoses=diagnoses)
    return sentences, diagnoses, basis.placement_sentence()


def build_detail(db: Path, request_id: str) -> DetailModel | None:
    stored = load_request(db, request_id)
    if stored is None:
        return None
    rec, ph = stored.record, stored.phases  # the phases stored at write time, not split again
    waits = runner_waits_of(db, rec, ph)
    ollama, client, ttft_ms = waterfall_spans(rec, ph, waits[0], waits[1])
    title = f"Where the time went: {fmt.label(rec.model)}"
    others = neighbour_spans(rec, waits[1])
    waterfall = charts.phase_waterfall_figure(ollama, client, ttft_ms, title, others=others, origin=time_origin(rec))
    gaps = charts.token_gaps_figure(rec.token_chunk_ns, rec.received_ns) if len(rec.token_chunk_ns) >= 2 else None
    sentences, diagnoses, placement = explain(db, rec, ph, waits)
    direct = direct_sentence(rec)
    sentences = [direct, *sentences] if direct else sentences
    return DetailModel(
        record=rec,
        phases=ph,
        waterfall=waterfall,
        gaps=gaps,
        rates=rates_frame(rec, ph),
        sources=sources_frame(ph),
        thinking=thinking_frame(ph),
        headlines=headlines(rec, ph, waits[1]),
        sentences=sentences,
        placement=placement,
        # A cut prompt and an ignored num_ctx are worded once, by their flags (with the fix).
        diagnoses=[d for d in diagnoses if d.sentence not in sentences and d.code not in PROMPT_FIT_FLAGS],
        # Cache hits are worded once, by the diagnosis (when they move the rate enough to matter).
        flags=[ph.flag_text[c] for c in ph.flags if c not in (Flag.CACHE_UNKNOWN, Flag.CACHE_HIT)],
    )


PROMPT_FIT_FLAGS = (Flag.PROMPT_TRUNCATED, Flag.NUM_CTX_IGNORED)


def seen_from(row: RequestSummary | RequestRecord) -> str:
    """ "proxy", or for a generation a client sent Ollama directly, where its figures come from."""
    if not row.direct:
        return "proxy"
    if row.runner_source == PhaseSource.ACCESS:
        return "direct · Ollama's access line (no runner task)"
    return "direct · Ollama's log (exact)" if row.runner_source == "log" else "direct · /slots readings (bounded)"


def direct_sentence(row: RequestSummary | RequestRecord) -> str | None:
    """For a direct record: what it was recorded from, each value's bound, and what only the proxy would add."""
    if not row.direct:
        return None
    if row.runner_source == PhaseSource.ACCESS:
        return (
            "Sent to Ollama directly (not through the proxy) and answered with an error before any runner task of it"
            " was seen: recorded from Ollama's access line alone (its status, route, client address and how long it"
            " took; its end to the second). Not known: its model and any phase. The line is Ollama's text, unverified:"
            " anyone who can reach the runner can make it write such a line."
        )
    if row.kind is RequestKind.EMBED:
        return _direct_embed_sentence(row)
    bounds = []
    if row.runner_source == PhaseSource.LOG:
        bounds.append("prefill and decode as the runner timed them, to 0.01 ms")
    elif row.prefill_bound_s is not None:
        bounds.append(f"prefill ± {fmt.seconds(row.prefill_bound_s)}")
    if row.decode_bound_s is not None and row.runner_source != PhaseSource.LOG:
        bounds.append(f"decode ± {fmt.seconds(row.decode_bound_s)}")
    if row.output_tokens_bound:
        bounds.append(f"output tokens ± {row.output_tokens_bound}")
    if row.ends_bound_s is not None:
        bounds.append(f"start and end ± {fmt.seconds(row.ends_bound_s)}")
    source = "the runner's own timings in Ollama's log" if row.runner_source == "log" else "readings of the runner's /slots"
    unknown = [name for name, value in (("route", row.endpoint), ("client address", row.client_addr)) if value is None]
    text = f"Sent to Ollama directly (not through the proxy); recorded from {source}"
    text += f" ({', '.join(bounds)})." if bounds else "."
    if unknown:
        text += f" Not known: {' and '.join(unknown)} (no access line fitted it alone)."
    if row.client_unverified:
        text += (
            " Its route and client address are from Ollama's access line, unverified: anyone who can reach the runner"
            " can make it write such a line."
        )
    return text + " Through the proxy it would also show the client's time to first token and every gap between tokens."


def _direct_embed_sentence(row: RequestSummary | RequestRecord) -> str:
    """A direct embed call: gathered from its inputs' runner tasks by Ollama's access line, or one input alone."""
    if row.endpoint is None:
        return (
            "Sent to Ollama directly (not through the proxy): one input of an embed call, recorded from its runner"
            " task (its prompt read, nothing decoded). No access line fitted it alone, so its call's size, route,"
            " client address and time are not known; its prompt tokens are the runner's count."
        )
    return (
        "An embed call sent to Ollama directly (not through the proxy): each input was its own runner task (its prompt"
        " read, nothing decoded), gathered into this one record by Ollama's access line of the call; prompt tokens"
        " are the runner's count, summed; its time is the call's latency as that line gives it, ending when its last"
        " input was released. Its route and client address are from that line, unverified: anyone who can reach the"
        " runner can make it write such a line."
    )


def history_caption(rows: Sequence[RequestSummary], window: str, truncated: bool, shown_max: int) -> str:
    """The history's caption: how many requests, the embed calls among them counted apart (a direct one of many
    inputs is one call, not a request per input)."""
    embeds = sum(1 for r in rows if r.kind is RequestKind.EMBED)
    of_which = f" ({fmt.count(embeds)} of them embed call{'s' if embeds != 1 else ''})" if embeds else ""
    if truncated:
        return (
            f"The latest {fmt.count(shown_max)} requests{of_which}, newest first; more match: narrow the window or filters, or"
            " download them all."
        )
    n = len(rows)
    return f"{fmt.count(n)} request{'s' if n != 1 else ''}{of_which} in the last {window}, newest first."


def detail_heading(rec: RequestRecord) -> str:
    """The detail's first line: model, route, kind, client, when, outcome (an error's status) and where it was seen."""
    client = fmt.label(rec.client_addr) if rec.client_addr is not None else "a client not known"
    if rec.client_unverified:
        client += " (unverified)"  # from Ollama's access line (direct_sentence says why)
    program = [
        fmt.label(text)
        for text in (
            program_label(rec.client_program, rec.client_program_version),
            process_label(rec.client_process, rec.client_pid, rec.client_user),
        )
        if text is not None
    ]
    if program:
        client += f" ({', '.join(program)})"
    where = f"from {client} · {fmt.when(rec.started_at_unix_s)}"
    route = fmt.label(rec.endpoint) if rec.endpoint is not None else "route not known"
    model = fmt.label(rec.model) if rec.model else MODEL_NOT_KNOWN
    status = f" {rec.status_code}" if rec.status_code is not None and rec.status_code >= 400 else ""
    return f"{model} · {route} · {rec.kind} · {where} · {rec.outcome.value}{status} · {seen_from(rec)}"


def request_label(row: RequestSummary) -> str:
    """Selectbox label of one request (text only: the widget never renders Markdown)."""
    took = fmt.seconds(row.client_s) if row.client_s is not None else row.outcome.value
    route = fmt.label(row.endpoint) if row.endpoint is not None else "direct" if row.direct else "route not known"
    model = fmt.label(row.model) if row.model else MODEL_NOT_KNOWN
    return f"{fmt.when(row.started_at_unix_s)} · {model} · {route} · {took} · {row.id[:8]}"


@dataclass(frozen=True)
class LinkedRequest:
    """The request a ``?request=`` link names, looked up whatever the time window and filters."""

    id: str
    label: str | None  # None: the store holds no request with this id
    in_rows: bool  # already among the rows the table shows

    @property
    def shown_id(self) -> str:
        """The id as the page may say it back (cut: a link is anyone's text)."""
        cut = self.id[:LINK_ID_SHOWN_CHARS]
        return cut + ("…" if len(self.id) > LINK_ID_SHOWN_CHARS else "")


def linked_request(db: Path, linked: str | None, shown_ids: Sequence[str]) -> LinkedRequest | None:
    """What a ``?request=`` link opens (None: no link). A request outside the window is loaded by its id."""
    if not linked:
        return None
    if linked in shown_ids:
        return LinkedRequest(linked, "", True)
    stored = load_request(db, linked)
    if stored is None:
        return LinkedRequest(linked, None, False)
    rec = stored.record
    route = fmt.label(rec.endpoint) if rec.endpoint is not None else "direct" if rec.direct else "route not known"
    label = f"{fmt.when(rec.started_at_unix_s)} · {fmt.label(rec.model)} · {route} · {rec.outcome.value} · {rec.id[:8]} (linked)"
    return LinkedRequest(linked, label, False)

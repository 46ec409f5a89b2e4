"""The Requests page's work: ``build_history`` and ``build_detail`` (store → tables and figures,
no Streamlit, timed by ``bench/pages_refresh.py``), then ``show_history``/``show_detail``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from analysis.diagnose import Diagnosis, diagnose_request
from analysis.explain import explain_request
from analysis.hardware import match_gpu
from analysis.model_facts import ModelFactsError, model_facts_from_show
from analysis.phases import Phases
from analysis.records import RequestRecord
from pages import charts, data, fmt
from pages.charts import Span
from store.export import CSV_LINE_END, csv_cell
from store.tables import RequestSummary

SHOWN_ROWS = 2000  # the table shows the latest rows; the CSV has every match

# Columns of the history table, in order, with the names a user reads.
HISTORY_COLUMNS = {
    "time": "time",
    "model": "model",
    "endpoint": "endpoint",
    "outcome": "outcome",
    "client": "client",
    "ttft_s": "first token (s)",
    "client_s": "total seen by client (s)",
    "load_s": "load (s)",
    "queue_s": "queue (s)",
    "prefill_s": "prefill (s)",
    "decode_s": "decode (s)",
    "prompt_tokens": "prompt tokens",
    "cached_tokens": "cached tokens",
    "output_tokens": "output tokens",
    "prefill_tok_s": "prefill tok/s",
    "decode_tok_s": "decode tok/s",
    "flags": "flags",
    "id": "id",
}


@dataclass
class HistoryModel:
    rows: list[RequestSummary]  # as the store returns them, newest first
    frame: pd.DataFrame  # the same rows with user-facing column names
    truncated: bool  # more requests match than SHOWN_ROWS
    options: data.HistoryOptions
    figure: go.Figure | None


def build_history(
    db: Path, start_unix_s: float, end_unix_s: float, model: str | None = None, endpoint: str | None = None,
    outcome: str | None = None,
) -> HistoryModel | None:  # fmt: skip
    """The filtered history (None = any value); None when there is no store yet."""
    result = data.load_history(db, start_unix_s, end_unix_s, model, endpoint, outcome, limit=SHOWN_ROWS + 1)
    if result is None:
        return None
    rows, options = result
    truncated = len(rows) > SHOWN_ROWS
    rows = rows[:SHOWN_ROWS]
    figure = None
    if rows:
        figure = charts.history_figure(
            [r.started_at_unix_s for r in rows], [r.decode_tok_s for r in rows], [r.prefill_tok_s for r in rows],
            [r.model for r in rows],
        )  # fmt: skip
    return HistoryModel(rows=rows, frame=history_frame(rows), truncated=truncated, options=options, figure=figure)


def history_frame(rows: Sequence[RequestSummary]) -> pd.DataFrame:
    frame = pd.DataFrame([vars(r) for r in rows])  # shallow: asdict's deep copies cost ~0.2 s for 2,000 rows
    if frame.empty:
        return pd.DataFrame(columns=list(HISTORY_COLUMNS.values()))
    frame["time"] = pd.to_datetime(frame["started_at_unix_s"], unit="s", utc=True).dt.tz_convert(_local_tz()).dt.tz_localize(None)
    frame["client"] = frame["client_addr"]
    frame["outcome"] = frame["outcome"].map(str)
    frame["flags"] = frame["flags"].map(lambda codes: ", ".join(codes) if isinstance(codes, tuple | list) else "")
    frame = frame[list(HISTORY_COLUMNS)].rename(columns=HISTORY_COLUMNS)
    return frame


def _local_tz() -> object:
    from datetime import datetime

    return datetime.now().astimezone().tzinfo


def csv_bytes(db: Path, start_unix_s: float, end_unix_s: float, model: str | None, endpoint: str | None,
              outcome: str | None) -> bytes:  # fmt: skip
    """Every matching request as CSV (timings and counts only, never prompt or reply text)."""
    result = data.load_history(db, start_unix_s, end_unix_s, model, endpoint, outcome, limit=None)
    rows = result[0] if result else []
    frame = history_frame(rows).map(csv_cell)  # escapes text cells only: numbers stay numbers
    return frame.to_csv(index=False, lineterminator=CSV_LINE_END).encode()


@dataclass
class DetailModel:
    record: RequestRecord
    phases: Phases
    waterfall: go.Figure
    gaps: go.Figure | None
    rates: pd.DataFrame
    sentences: list[str]
    diagnoses: list[Diagnosis]
    flags: list[str]


def waterfall_spans(rec: RequestRecord, ph: Phases) -> tuple[list[Span], list[Span], float | None]:
    """Ollama's phases and the client's view, in ms since the proxy received the request."""

    def rel(ns: int) -> float:
        return (ns - rec.received_ns) / 1e6

    ollama: list[Span] = []
    if ph.load_start_ns is not None and ph.load_end_ns is not None and ph.prefill_start_ns is not None:
        points = [
            ("load", ph.load_start_ns, ph.load_end_ns),
            ("queue", ph.load_end_ns, ph.prefill_start_ns),
            ("prefill", ph.prefill_start_ns, ph.decode_start_ns),
            ("decode", ph.decode_start_ns, ph.decode_end_ns),
        ]
        for label, a, b in points:
            if a is not None and b is not None and b > a:
                ollama.append(Span(label, rel(a), rel(b)))
    client: list[Span] = []
    marks = [
        ("waiting for first byte", rec.received_ns, rec.first_byte_ns),
        ("first byte to first token", rec.first_byte_ns, rec.first_token_ns),
        ("streaming tokens", rec.first_token_ns, rec.final_chunk_ns),
        ("after last token", rec.final_chunk_ns, rec.closed_ns),
    ]
    for label, a_ns, b_ns in marks:
        if a_ns is None or b_ns is None:
            continue
        start_ms = 0.0 if label == "waiting for first byte" else rel(a_ns)
        end_ms = rel(b_ns)
        if end_ms - start_ms > 0.05:
            client.append(Span(label, start_ms, end_ms))
    ttft_ms = rel(rec.first_token_ns) if rec.first_token_ns is not None else None
    return ollama, client, ttft_ms


def rates_frame(rec: RequestRecord, ph: Phases) -> pd.DataFrame:
    """Our rates beside Ollama's, and why they differ."""
    rows: list[dict[str, object]] = []
    if ph.prompt_tokens:
        if ph.cached_tokens:
            why = (
                f"{ph.cached_tokens:,} of {ph.prompt_tokens:,} prompt tokens came from the cache. Ollama divides all of them "
                f"by the time spent on the other {ph.prompt_tokens - ph.cached_tokens:,}; we count only those."
            )
        elif ph.cached_tokens is None:
            why = "This Ollama does not report cached prompt tokens: if part of the prompt was cached, both numbers overstate."
        else:
            why = "Nothing came from the cache, so both count the same tokens."
        rows.append({"phase": "prefill (prompt)", "ours (tok/s)": ph.prefill_tok_s, "Ollama's (tok/s)": ph.ollama_prefill_tok_s,
                     "why they differ": why})  # fmt: skip
    if ph.output_tokens:
        if ph.output_tokens == 1:
            why = "One token: no interval to time, so there is no real decode rate."
        else:
            why = (
                f"eval_duration runs from the first to the last token: {ph.output_tokens - 1:,} intervals for "
                f"{ph.output_tokens:,} tokens. Ollama divides by {ph.output_tokens:,}, so it reads "
                f"{100 / (ph.output_tokens - 1):.1f}% high."
            )
        rows.append({"phase": "decode (output)", "ours (tok/s)": ph.decode_tok_s, "Ollama's (tok/s)": ph.ollama_decode_tok_s,
                     "why they differ": why})  # fmt: skip
    chunks = rec.token_chunk_ns
    if len(chunks) >= 2 and chunks[-1] > chunks[0]:
        seen = (len(chunks) - 1) / ((chunks[-1] - chunks[0]) / 1e9)
        why = "Chunks arriving at the proxy, first to last: includes network and batching jitter."
        rows.append({"phase": "as the client saw it", "ours (tok/s)": seen, "Ollama's (tok/s)": None, "why they differ": why})
    frame = pd.DataFrame(rows, columns=["phase", "ours (tok/s)", "Ollama's (tok/s)", "why they differ"])
    return frame.round({"ours (tok/s)": 1, "Ollama's (tok/s)": 1})


def explain(db: Path, rec: RequestRecord, ph: Phases) -> tuple[list[str], list[Diagnosis]]:
    """Sentences and diagnoses from the explainer, with this GPU's and model's facts where the store has them."""
    end_ns = rec.closed_ns or rec.final_chunk_ns or (rec.token_chunk_ns[-1] if rec.token_chunk_ns else rec.received_ns)
    ctx = data.load_request_context(db, rec, rec.wall_s(end_ns))
    spec = None
    if ctx.gpu_samples:
        first = ctx.gpu_samples[0]
        spec = match_gpu(first.name, first.mem_total_bytes)
    facts = None
    if ctx.show is not None:
        try:
            facts = model_facts_from_show(ctx.show, None)
        except ModelFactsError:
            facts = None  # an architecture the explainer cannot read: explain without ceilings
    diagnoses = diagnose_request(rec, ph, gpu_samples=ctx.gpu_samples, loaded=ctx.loaded, facts=facts, spec=spec)
    return explain_request(rec, ph, diagnoses=diagnoses), diagnoses


def build_detail(db: Path, request_id: str) -> DetailModel | None:
    stored = data.load_request(db, request_id)
    if stored is None:
        return None
    rec, ph = stored.record, stored.phases  # the phases stored at write time, not split again
    ollama, client, ttft_ms = waterfall_spans(rec, ph)
    waterfall = charts.phase_waterfall_figure(ollama, client, ttft_ms, f"Where the time went: {rec.model}")
    gaps = charts.token_gaps_figure(rec.token_chunk_ns, rec.received_ns) if len(rec.token_chunk_ns) >= 2 else None
    sentences, diagnoses = explain(db, rec, ph)
    return DetailModel(
        record=rec,
        phases=ph,
        waterfall=waterfall,
        gaps=gaps,
        rates=rates_frame(rec, ph),
        sentences=sentences,
        diagnoses=[d for d in diagnoses if d.sentence not in sentences],
        flags=[ph.flag_text[c] for c in ph.flags if c not in ("cache_unknown",)],
    )


def request_label(row: RequestSummary) -> str:
    """Selectbox label of one request (text only: the widget never renders Markdown)."""
    took = fmt.seconds(row.client_s) if row.client_s is not None else row.outcome.value
    return f"{fmt.when(row.started_at_unix_s)} · {row.model} · {row.endpoint} · {took} · {row.id[:8]}"

"""Usage: totals per model, per client and per program over the last 1, 7 and 30 days (requests, prompt and output tokens, GPU
time, energy), for the Requests page and its CSV (no Streamlit).

Embed calls are counted apart among the requests (``embeddings``): one call of many inputs is one request.
A figure no record gives stays unknown: a total sums the records that have it, and says how many had none (never
counted as 0); with none at all the total is unknown. A figure counts only where it applies: output tokens for
generations, prompt tokens, GPU time and energy for generations and embeddings (a load or unload reads no prompt).

GPU time is a request's prefill plus decode (an embedding's prefill): the time the GPU worked on it, overlapping
requests each counted whole. Energy is what all GPUs used over that time (``analysis.energy``: the energy counter,
else power samples), idle draw included and shared by the requests that ran at once, as for one request on Why.
"""

from __future__ import annotations

import csv
import io
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.energy import energy_between
from analysis.records import RequestKind
from pages.shared import fmt
from store import queries, sample_queries
from store.export import CSV_LINE_END, csv_cell
from store.tables import RequestSummary

PERIODS_S = {"1 day": 86_400.0, "7 days": 7 * 86_400.0, "30 days": 30 * 86_400.0}
USAGE_ROWS_MAX = 200_000  # requests read for the 30 days at most (the newest)
DIRECT_CLIENT = "direct (client not known)"
UNKNOWN_PROGRAM = "program not known"  # no User-Agent naming a product (or a direct record): a group, never ""
GROUPINGS = ("model", "client", "program")
CLUSTER_GAP_S = 5.0  # GPU samples are read once for requests closer than this
CLUSTER_MAX_S = 60.0  # a cluster spans this at most: its samples are read raw (1 Hz), not as a long window's rollups
SAMPLE_PAD_S = 3.0  # samples read around each window, so both of its ends have one on either side


@dataclass(frozen=True)
class RequestUsage:
    """One request's figures (None: not known; a figure that does not apply to its kind is None and not counted)."""

    model: str
    client: str
    started_at_unix_s: float
    kind: RequestKind
    prompt_tokens: int | None
    output_tokens: int | None
    gpu_s: float | None
    energy_j: float | None
    program: str = UNKNOWN_PROGRAM  # the User-Agent's product (its versions together)


@dataclass(frozen=True)
class Total:
    value: float | None  # the sum over the records that have it; None when none has
    unknown: int  # records the figure applies to that have none


@dataclass(frozen=True)
class UsageRow:
    by: str  # one of GROUPINGS
    key: str
    period: str  # a key of PERIODS_S
    requests: int
    embeddings: int  # of the requests, embed calls (a direct one gathered from its inputs' runner tasks)
    prompt_tokens: Total
    output_tokens: Total
    gpu_s: Total
    energy_wh: Total


def client_of(client_addr: str | None) -> str:
    """The client's host (the port changes with every connection); a direct record has none."""
    if not client_addr:
        return DIRECT_CLIENT
    host, sep, port = client_addr.rpartition(":")
    return host.strip("[]") if sep and port.isdigit() else client_addr


def gpu_s_of(row: RequestSummary) -> float | None:
    if row.kind is RequestKind.EMBED:
        return row.prefill_s
    if row.kind is RequestKind.GENERATE and row.prefill_s is not None and row.decode_s is not None:
        return row.prefill_s + row.decode_s
    return None


def _applies(kind: RequestKind, figure: str) -> bool:
    if kind is RequestKind.GENERATE:
        return True
    return kind is RequestKind.EMBED and figure != "output_tokens"


def _total(items: Sequence[RequestUsage], figure: str, scale: float = 1.0) -> Total:
    values = [getattr(u, figure) for u in items if _applies(u.kind, figure)]
    known = [v for v in values if v is not None]
    return Total(sum(known) * scale if known else None, len(values) - len(known))


def usage_totals(items: Sequence[RequestUsage], now_unix_s: float) -> list[UsageRow]:
    """Per period, per model, per client and per program (most requests first), the totals of the requests started
    in it."""
    out: list[UsageRow] = []
    for period, span_s in PERIODS_S.items():
        inside = [u for u in items if u.started_at_unix_s >= now_unix_s - span_s]
        for by in GROUPINGS:
            groups: dict[str, list[RequestUsage]] = {}
            for u in inside:
                groups.setdefault(getattr(u, by), []).append(u)
            for key, group in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                out.append(
                    UsageRow(
                        by,
                        key,
                        period,
                        len(group),
                        sum(1 for u in group if u.kind is RequestKind.EMBED),
                        _total(group, "prompt_tokens"),
                        _total(group, "output_tokens"),
                        _total(group, "gpu_s"),
                        _total(group, "energy_j", 1 / 3600),
                    )
                )
    return out


def _windows(rows: Iterable[RequestSummary]) -> list[tuple[RequestSummary, float, float]]:
    found = []
    for r in rows:
        gpu_s = gpu_s_of(r)
        if gpu_s is not None and r.prefill_start_unix_s is not None:
            found.append((r, r.prefill_start_unix_s, r.prefill_start_unix_s + max(gpu_s, 0.0)))
    return sorted(found, key=lambda w: w[1])


def energies_j(conn: sqlite3.Connection, rows: Sequence[RequestSummary]) -> dict[str, float]:
    """Each request's GPU energy over its GPU time (absent: not known), reading the samples once per cluster of
    requests close in time."""
    out: dict[str, float] = {}
    cluster: list[tuple[RequestSummary, float, float]] = []

    def flush() -> None:
        if not cluster:
            return
        t0, t1 = cluster[0][1] - SAMPLE_PAD_S, max(w[2] for w in cluster) + SAMPLE_PAD_S
        samples = sample_queries.gpu_samples(conn, t0, t1)
        for r, a, b in cluster:
            e = energy_between(samples, a, b) if samples else None
            if e is not None:
                out[r.id] = e.joules
        cluster.clear()

    cluster_end = 0.0  # the latest end in the cluster, kept as it grows (a max over the cluster per request was
    # quadratic: a busy day is one cluster of every request, and 170,000 of them never finished)
    for w in _windows(rows):
        if cluster and (w[1] - cluster_end > CLUSTER_GAP_S or w[1] - cluster[0][1] > CLUSTER_MAX_S):
            flush()
        cluster_end = max(cluster_end, w[2]) if cluster else w[2]
        cluster.append(w)
    flush()
    return out


def load_usage(db: Path, now_unix_s: float) -> list[UsageRow] | None:
    """The totals over the last 30 days (and 7 and 1) from the store; None while there is no store."""
    with queries.open_reader(db) as conn:
        if conn is None:
            return None
        since = now_unix_s - max(PERIODS_S.values())
        rows = queries.recent_requests(conn, since, limit=USAGE_ROWS_MAX, until_unix_s=now_unix_s)
        rows = [r for r in rows if r.ended_at_unix_s is not None]  # finished: a running one's figures are not in
        energy = energies_j(conn, rows)
    items = [
        RequestUsage(
            r.model,
            client_of(r.client_addr),
            r.started_at_unix_s,
            r.kind,
            r.prompt_tokens,
            r.output_tokens,
            gpu_s_of(r),
            energy.get(r.id),
            r.client_program if r.client_program is not None else UNKNOWN_PROGRAM,
        )
        for r in rows
    ]
    return usage_totals(items, now_unix_s)


def _value(t: Total, digits: int) -> float | int | None:
    if t.value is None:
        return None
    return round(t.value) if digits == 0 else round(t.value, digits)


FIGURES = (("prompt tokens", "prompt_tokens", 0), ("output tokens", "output_tokens", 0), ("GPU time (s)", "gpu_s", 1))


def usage_frame(rows: Sequence[UsageRow], by: str, period: str) -> pd.DataFrame:
    """The table for one grouping and period: each figure beside how many records had none (empty: unknown)."""
    records = []
    for r in rows:
        if r.by != by or r.period != period:
            continue
        # names come from clients: cut as everywhere
        line: dict[str, object] = {by: fmt.label(r.key), "requests": r.requests, "of which embeddings": r.embeddings}
        for label, name, digits in (*FIGURES, ("energy (Wh)", "energy_wh", 3)):
            total: Total = getattr(r, name)
            line[label] = _value(total, digits)
            line[f"{label}: records without"] = total.unknown
        records.append(line)
    return pd.DataFrame(records)


def usage_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The table as the page shows it: each figure in the units convention, an unknown one "—" (Streamlit would write
    "None"), so an empty total is never read as a value."""
    out = frame.copy()
    for label, _, digits in (*FIGURES, ("energy (Wh)", "energy_wh", 3)):
        if label in out:
            out[label] = [fmt.UNKNOWN if v is None or pd.isna(v) else f"{v:,.{digits}f}" for v in out[label]]
    return out


def usage_csv(rows: Sequence[UsageRow]) -> bytes:
    """Every grouping and period in one CSV; an unknown total is an empty cell, with its count of records without."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator=CSV_LINE_END)
    names = ("prompt_tokens", "output_tokens", "gpu_s", "energy_wh")
    w.writerow(["period", "by", "key", "requests", "embeddings", *(c for n in names for c in (n, f"{n}_records_without"))])
    for r in rows:
        cells: list[object] = [r.period, r.by, csv_cell(r.key), r.requests, r.embeddings]  # names come from clients
        for n in names:
            t: Total = getattr(r, n)
            cells += ["" if t.value is None else (round(t.value, 6) if isinstance(t.value, float) else t.value), t.unknown]
        w.writerow(cells)
    return out.getvalue().encode()

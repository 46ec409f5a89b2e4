"""Usage: totals per model, per client and per program over the last 1, 7 and 30 days (requests, prompt and output tokens, GPU
time, energy), for the Requests page and its CSV (no Streamlit).

Embed calls are counted apart among the requests (``embeddings``): one call of many inputs is one request.
A figure no record gives stays unknown: a total sums the records that have it, and says how many had none (never
counted as 0); with none at all the total is unknown. A figure counts only where it applies: output tokens for
generations, prompt tokens, GPU time and energy for generations and embeddings (a load or unload reads no prompt).

GPU time is a request's prefill plus decode (an embedding's prefill): the time the GPU worked on it, overlapping
requests each counted whole. Energy is what all GPUs used over that time (``analysis.energy``: the energy counter,
else power samples), idle draw included and shared by the requests that ran at once, as for one request on Why.

Where each number comes from (issue 48): requests, tokens and GPU time from ``usage_days``, the store's summary per UTC
day kept as records arrive (store/usage_days.py), so 30 days read a bounded number of rows; a period is whole UTC days,
today's so far included ("7 days": today and the 6 days before). Energy needs the GPU samples over each request's GPU
time, which no summary holds: it is read for the newest ``ENERGY_ROWS_MAX`` finished requests, and an older request's
energy counts among the records without (``UsageRow.energy_unread`` says how many), never as 0.
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
from store.schema import USAGE_DAY_S
from store.tables import RequestSummary
from store.usage_days import UsageDay, day_of, usage_days

PERIODS_S = {"1 day": 86_400.0, "7 days": 7 * 86_400.0, "30 days": 30 * 86_400.0}
ENERGY_ROWS_MAX = 2_000  # requests whose energy is read from the GPU samples (the newest finished ones)
DIRECT_CLIENT = "direct (client not known)"
UNKNOWN_PROGRAM = "program not known"  # no User-Agent naming a product (or a direct record): a group, never ""
GROUPINGS = ("model", "client", "program")
CLUSTER_GAP_S = 5.0  # GPU samples are read once for requests closer than this
CLUSTER_MAX_S = 60.0  # a cluster spans this at most: its samples are read raw (1 Hz), not as a long window's rollups
SAMPLE_PAD_S = 3.0  # samples read around each window, so both of its ends have one on either side


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
    energy_unread: int = 0  # of energy_wh's records without: older than the newest ENERGY_ROWS_MAX, so not read


def client_of(client_addr: str | None) -> str:
    """The client's host (the port changes with every connection); a direct record has none."""
    if not client_addr:
        return DIRECT_CLIENT
    host, sep, port = client_addr.rpartition(":")
    # ASCII digits only, as the store's summary reads a port (store/schema.py, usage_days)
    return host.strip("[]") if sep and port.isascii() and port.isdigit() else client_addr


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
    """The totals over the last 30 UTC days (and 7 and 1) from the store; None while there is no store."""
    today = day_of(now_unix_s)
    first_day = today - (_days(max(PERIODS_S.values())) - 1) * USAGE_DAY_S
    with queries.open_reader(db) as conn:
        if conn is None:
            return None
        days = usage_days(conn, first_day, today)
        rows = queries.recent_requests(conn, first_day, limit=ENERGY_ROWS_MAX, until_unix_s=now_unix_s)
        energy_read_all = len(rows) < ENERGY_ROWS_MAX
        rows = [r for r in rows if r.ended_at_unix_s is not None]  # finished: a running one's figures are not in
        energy = energies_j(conn, rows)
    read = [
        _EnergyRead(r.started_at_unix_s, _keys(r.model, client_of(r.client_addr), r.client_program), energy.get(r.id), r.kind)
        for r in rows
    ]
    return _usage_rows(days, read, energy_read_all, today)


@dataclass(frozen=True)
class _EnergyRead:
    """A finished request read for its energy: when, its group in each grouping, its energy (None: not known)."""

    started_at_unix_s: float
    keys: dict[str, str]
    energy_j: float | None
    kind: RequestKind


def _days(span_s: float) -> int:
    return round(span_s / USAGE_DAY_S)


def _keys(model: str, client: str, program: str | None) -> dict[str, str]:
    return {"model": model, "client": client or DIRECT_CLIENT, "program": program or UNKNOWN_PROGRAM}


def _usage_rows(days: Sequence[UsageDay], read: Sequence[_EnergyRead], energy_read_all: bool, today: int) -> list[UsageRow]:
    """Per period and grouping (most requests first) the summary's totals, with the energy of the requests read."""
    out: list[UsageRow] = []
    for period, span_s in PERIODS_S.items():
        since = today - (_days(span_s) - 1) * USAGE_DAY_S
        inside = [d for d in days if d.day_unix_s >= since]
        read_inside = [e for e in read if e.started_at_unix_s >= since and _applies(e.kind, "energy_j")]
        for by in GROUPINGS:
            groups: dict[str, list[UsageDay]] = {}
            for d in inside:
                groups.setdefault(_keys(d.model, d.client, d.program)[by], []).append(d)
            for key, group in sorted(groups.items(), key=lambda kv: (-sum(d.requests for d in kv[1]), kv[0])):
                out.append(_row(by, key, period, group, [e for e in read_inside if e.keys[by] == key], energy_read_all))
    return out


def _summed(group: Sequence[UsageDay], n: str, known: str, total: str, scale: float = 1.0) -> Total:
    n_known = sum(getattr(d, known) for d in group)
    value = sum(getattr(d, total) for d in group) * scale if n_known else None
    return Total(value, sum(getattr(d, n) for d in group) - n_known)


def _row(by: str, key: str, period: str, group: Sequence[UsageDay], read: Sequence[_EnergyRead], read_all: bool) -> UsageRow:
    gpu_n = sum(d.gpu_n for d in group)
    known = [e.energy_j for e in read if e.energy_j is not None]
    return UsageRow(
        by,
        key,
        period,
        sum(d.requests for d in group),
        sum(d.embeddings for d in group),
        _summed(group, "prompt_n", "prompt_known", "prompt_tokens"),
        _summed(group, "output_n", "output_known", "output_tokens"),
        _summed(group, "gpu_n", "gpu_known", "gpu_s"),
        Total(sum(known) / 3600 if known else None, gpu_n - len(known)),
        0 if read_all else max(gpu_n - len(read), 0),
    )


def usage_sources(rows: Sequence[UsageRow], period: str) -> str:
    """Where the table's numbers come from, and how many requests' energy was not read (a count, never a fixed text)."""
    unread = sum(r.energy_unread for r in rows if r.period == period and r.by == GROUPINGS[0])
    energy = (
        f" Energy is read for the newest {fmt.count(ENERGY_ROWS_MAX)} finished requests only: {fmt.count(unread)} older "
        "ones of this period are among its records without."
        if unread
        else ""
    )
    return (
        f"Over the last {period}: whole UTC days, today's so far included. Requests, tokens and GPU time from the "
        "store's summary per day, kept as requests finish. "
        '"—": no record gave that figure. "Records without" counts the requests a figure applies to that did not give '
        "it (never counted as 0). GPU time is each request's prefill and decode; energy is what the GPUs used meanwhile "
        "(from their samples), idle draw included and shared by requests that ran at once." + energy
    )


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
    for label in out.columns:  # the counts, as every count on the pages (fmt.count: "3,200")
        if label in ("requests", "of which embeddings") or label.endswith(": records without"):
            out[label] = [fmt.count(v) for v in out[label]]
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

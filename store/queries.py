"""Read-only queries for the pages: short, indexed, and downsampled in SQL for long windows.

Open a connection with ``open_readonly`` (``mode=ro``: a reader can never write, even by
mistake). Tabular results are lists of dicts (ready for ``pandas.DataFrame``); single
things and timelines come back as the record types of ``analysis.records``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.records import (
    CollectorInfo,
    FinalMetrics,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    RequestRecord,
)
from store.schema import (
    DB_FILENAME,
    GPU_MEAN_FIELDS,
    GPU_PEAK_FIELDS,
    HOST_MEAN_FIELDS,
    HOST_PEAK_FIELDS,
    ROLLUP_S,
    SCHEMA_VERSION,
    StoreError,
    StoreNotFoundError,
    schema_version,
)
from store.writer import decode_token_times

# Beyond this many points per series a window is averaged into time buckets.
DEFAULT_MAX_POINTS = 1200


def resolve_db(path: str | Path) -> Path:
    """The store file for a data folder or a file path."""
    p = Path(path)
    return p / DB_FILENAME if p.is_dir() else p


def open_readonly(path: str | Path, *, busy_timeout_ms: int = 2000) -> sqlite3.Connection:
    """A read-only connection to the store (a data folder or the file itself).

    Raises StoreNotFoundError when there is no store yet, StoreError when its schema is
    not the one this code reads. The connection may be shared across threads (Streamlit
    reruns), one query at a time.
    """
    db = resolve_db(path)
    if not db.is_file():
        raise StoreNotFoundError(
            f"no Phasewatch store at {db}: the collector creates it on start (python -m collectors --data {db.parent})"
        )
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        version = schema_version(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{db} is not a readable Phasewatch store: {exc}") from exc
    if version != SCHEMA_VERSION:
        conn.close()
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"{db} has schema v{version}; this Phasewatch reads v{SCHEMA_VERSION}: start the collector to migrate"
            )
        raise StoreError(f"{db} has schema v{version}, newer than this Phasewatch (v{SCHEMA_VERSION}): upgrade Phasewatch")
    return conn


# ---------------------------------------------------------------- requests

# What a history table needs; no text, no raw monotonic stamps.
_SUMMARY_COLUMNS = (
    "id", "started_at_unix_s", "ended_at_unix_s", "updated_at_unix_s", "client_addr", "endpoint", "model", "stream",
    "num_ctx", "num_predict", "keep_alive", "status_code", "outcome", "error", "done_reason", "tokens_so_far",
    "total_s", "load_s", "prefill_s", "decode_s", "queue_s", "transport_s", "ttft_s", "client_s",
    "prompt_tokens", "cached_tokens", "output_tokens",
    "prefill_tok_s", "decode_tok_s", "ollama_prefill_tok_s", "ollama_decode_tok_s",
    "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "flags",
    "load_start_unix_s", "prefill_start_unix_s", "decode_start_unix_s", "decode_end_unix_s",
)  # fmt: skip
_SUMMARY_SQL = ", ".join(_SUMMARY_COLUMNS)


def _dicts(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows as dicts, with ``flags`` parsed and ``stream`` a bool where present."""
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(sql, args)
    names = [d[0] for d in cur.description]
    out = []
    for values in cur:
        d = dict(zip(names, values, strict=True))
        if "flags" in d:
            flags = d["flags"]
            d["flags"] = [] if not flags or flags == "[]" else json.loads(flags)
        if "stream" in d:
            d["stream"] = bool(d["stream"])
        out.append(d)
    return out


def recent_requests(
    conn: sqlite3.Connection,
    since_unix_s: float,
    model: str | None = None,
    endpoint: str | None = None,
    outcome: str | Outcome | None = None,
    limit: int = 5000,
    until_unix_s: float | None = None,
) -> list[dict[str, Any]]:
    """Requests started since ``since_unix_s``, newest first, with their phases and rates."""
    where = ["started_at_unix_s >= ?"]
    args: list[Any] = [since_unix_s]
    if until_unix_s is not None:
        where.append("started_at_unix_s <= ?")
        args.append(until_unix_s)
    if model is not None:
        where.append("model = ?")
        args.append(model)
    if endpoint is not None:
        where.append("endpoint = ?")
        args.append(endpoint)
    if outcome is not None:
        where.append("outcome = ?")
        args.append(Outcome(outcome).value)
    sql = f"SELECT {_SUMMARY_SQL} FROM requests WHERE {' AND '.join(where)} ORDER BY started_at_unix_s DESC LIMIT ?"
    return _dicts(conn, sql, [*args, int(limit)])


def request_models(conn: sqlite3.Connection, since_unix_s: float = 0.0) -> list[str]:
    """Models that have requests since a moment (for filters)."""
    rows = conn.execute(
        "SELECT model FROM requests WHERE started_at_unix_s >= ? GROUP BY model ORDER BY model", (since_unix_s,)
    )
    return [r[0] for r in rows]


def _record(row: sqlite3.Row, blob: bytes | None) -> RequestRecord:
    metrics = None
    if row["has_metrics"]:
        metrics = FinalMetrics(
            total_duration_ns=row["total_duration_ns"],
            load_duration_ns=row["load_duration_ns"],
            prompt_eval_count=row["prompt_eval_count"],
            prompt_eval_cached_count=row["prompt_eval_cached_count"],
            prompt_eval_duration_ns=row["prompt_eval_duration_ns"],
            eval_count=row["eval_count"],
            eval_duration_ns=row["eval_duration_ns"],
            done_reason=row["done_reason"],
        )
    return RequestRecord(
        id=row["id"],
        started_at_unix_s=row["started_at_unix_s"],
        client_addr=row["client_addr"],
        endpoint=row["endpoint"],
        model=row["model"],
        stream=bool(row["stream"]),
        num_ctx=row["num_ctx"],
        num_predict=row["num_predict"],
        keep_alive=row["keep_alive"],
        received_ns=row["received_ns"],
        forwarded_ns=row["forwarded_ns"],
        first_byte_ns=row["first_byte_ns"],
        first_token_ns=row["first_token_ns"],
        token_chunk_ns=decode_token_times(row["received_ns"], blob) if blob else [],
        final_chunk_ns=row["final_chunk_ns"],
        closed_ns=row["closed_ns"],
        status_code=row["status_code"],
        outcome=Outcome(row["outcome"]),
        error=row["error"],
        metrics=metrics,
        prompt_text=row["prompt_text"],
        response_text=row["response_text"],
    )


_RECORD_SQL = "SELECT r.*, t.gaps_le_i64 AS tokens FROM requests r LEFT JOIN request_tokens t ON t.request_id = r.id"
_RECORD_SQL_NO_TOKENS = "SELECT r.*, NULL AS tokens FROM requests r"


def request_detail(conn: sqlite3.Connection, id: str) -> RequestRecord | None:
    """One request rebuilt as the proxy recorded it, token times included; None if unknown."""
    row = conn.execute(f"{_RECORD_SQL} WHERE r.id = ?", (id,)).fetchone()
    return None if row is None else _record(row, row["tokens"])


def in_flight_requests(conn: sqlite3.Connection, now_unix_s: float, stale_after_s: float = 30.0) -> list[RequestRecord]:
    """Requests still running, with token times so far. Rows not updated for ``stale_after_s`` are left out
    (their collector died; the next collector start marks them upstream_failed)."""
    rows = conn.execute(
        f"{_RECORD_SQL} WHERE r.outcome = 'in_flight' AND r.updated_at_unix_s >= ? ORDER BY r.started_at_unix_s",
        (now_unix_s - stale_after_s,),
    )
    return [_record(r, r["tokens"]) for r in rows]


def requests_in_window(
    conn: sqlite3.Connection,
    t0_unix_s: float,
    t1_unix_s: float,
    *,
    with_tokens: bool = False,
    limit: int = 2000,
) -> list[RequestRecord]:
    """Requests alive at some point in [t0, t1] (for phase bands under the GPU timeline), oldest first.

    Without ``with_tokens`` the records carry no ``token_chunk_ns`` (cheaper). Beyond
    ``limit`` the newest are kept.
    """
    base = _RECORD_SQL if with_tokens else _RECORD_SQL_NO_TOKENS
    # Two index range scans: finished requests that ended after t0, and those still in flight.
    rows = conn.execute(
        f"{base} WHERE r.rowid IN (SELECT rowid FROM requests WHERE ended_at_unix_s >= :t0 AND started_at_unix_s <= :t1 "
        "UNION ALL SELECT rowid FROM requests WHERE outcome = 'in_flight' AND started_at_unix_s <= :t1) "
        "ORDER BY r.started_at_unix_s DESC LIMIT :limit",
        {"t0": t0_unix_s, "t1": t1_unix_s, "limit": int(limit)},
    ).fetchall()
    return [_record(r, r["tokens"]) for r in reversed(rows)]


def rate_points(conn: sqlite3.Connection, model: str, since_unix_s: float, limit: int = 5000) -> list[dict[str, Any]]:
    """Per finished request of a model: prompt length vs prefill rate, context vs decode rate (the Why page).

    ``decode_context_tokens`` is the mean context during decode: the prompt plus half the reply.
    """
    out = _dicts(
        conn,
        "SELECT id, started_at_unix_s, num_ctx, prompt_tokens, cached_tokens, output_tokens, prefill_s, decode_s, "
        "prefill_tok_s, decode_tok_s, ollama_prefill_tok_s, ollama_decode_tok_s, ttft_s, flags "
        "FROM requests WHERE model = ? AND started_at_unix_s >= ? AND outcome = 'ok' AND has_metrics = 1 "
        "ORDER BY started_at_unix_s DESC LIMIT ?",
        (model, since_unix_s, int(limit)),
    )
    for d in out:
        prompt, output = d["prompt_tokens"], d["output_tokens"]
        d["decode_context_tokens"] = None if prompt is None else prompt + (output or 0) / 2
    return out


# ---------------------------------------------------------------- samples


def _bucket_s(t0: float, t1: float, max_points: int) -> float:
    return max((t1 - t0) / max(max_points, 1), 1e-3)


def _tuples(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Plain tuples: several times cheaper than sqlite3.Row for long results."""
    cur = conn.cursor()
    cur.row_factory = None
    return cur.execute(sql, args).fetchall()


# Windows longer than this, or whose buckets would span a minute or more, read the per-minute rollups.
ROLLUP_WINDOW_S = 3 * 3600.0

_GPU_FIELDS = (
    "util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "power_limit_w", "energy_j",
    "temperature_c", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "mem_bus_width_bits",
    "pcie_tx_bytes_s", "pcie_rx_bytes_s", "pstate", "throttle_reasons", "ollama_mem_bytes",
)  # fmt: skip  (GpuSample's field order)
_GPU_INT_POSITIONS = [
    4 + i for i, f in enumerate(_GPU_FIELDS)
    if f in {"mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz",
             "mem_bus_width_bits", "pstate", "throttle_reasons", "ollama_mem_bytes"}
]  # fmt: skip


_GPU_NAMES = ("ts_unix_s", "index", "name", "uuid", *_GPU_FIELDS)


def _gpu(values: Sequence[Any]) -> GpuSample:
    """A GpuSample from (ts, index, name, uuid, *_GPU_FIELDS, simulated)."""
    return GpuSample(**dict(zip(_GPU_NAMES, values[:-1], strict=True)), simulated=bool(values[-1]))


def _use_rollup(t0: float, t1: float, max_points: int) -> bool:
    return (t1 - t0) > ROLLUP_WINDOW_S or _bucket_s(t0, t1, max_points) >= ROLLUP_S


def _rollup_bucket_s(t0: float, t1: float, max_points: int) -> int:
    """Whole minutes per bucket, so that buckets never split a rollup row."""
    return max(ROLLUP_S, math.ceil(_bucket_s(t0, t1, max_points) / ROLLUP_S) * ROLLUP_S)


def _rollup_select(mean_fields: tuple[str, ...], peak_fields: tuple[str, ...], order: Sequence[str]) -> str:
    exprs = {f: f"SUM({f}_sum) / NULLIF(SUM({f}_n), 0)" for f in mean_fields} | {f: f"MAX({f}_peak)" for f in peak_fields}
    return ", ".join(exprs[f] for f in order)


def _fix_ints(row: tuple[Any, ...], positions: Sequence[int]) -> list[Any]:
    values = list(row)
    for i in positions:
        if values[i] is not None:
            values[i] = round(values[i])
    return values


def gpu_samples(
    conn: sqlite3.Connection, t0_unix_s: float, t1_unix_s: float, max_points: int = DEFAULT_MAX_POINTS
) -> list[GpuSample]:
    """GPU samples in [t0, t1], every GPU, oldest first.

    Beyond ``max_points`` per GPU they are summarised per time bucket (means for
    utilisation, power, clocks; peaks for memory and limits): from the raw samples for
    short windows, from the per-minute rollups for long ones.
    """
    t0, t1 = t0_unix_s, t1_unix_s
    cols = ", ".join(_GPU_FIELDS)
    if _use_rollup(t0, t1, max_points):
        bucket = _rollup_bucket_s(t0, t1, max_points)
        rows = _tuples(
            conn,
            f"SELECT SUM(ts_sum) / SUM(n), gpu_index, MAX(name), MAX(uuid), "
            f"{_rollup_select(GPU_MEAN_FIELDS, GPU_PEAK_FIELDS, _GPU_FIELDS)}, MAX(simulated) FROM gpu_minutes "
            "WHERE minute_unix_s BETWEEN ? AND ? GROUP BY gpu_index, (minute_unix_s - ?) / ? ORDER BY 1, 2",
            (math.floor(t0 / ROLLUP_S) * ROLLUP_S, t1, math.floor(t0 / ROLLUP_S) * ROLLUP_S, bucket),
        )
        return [_gpu(_fix_ints(r, _GPU_INT_POSITIONS)) for r in rows]
    n, n_gpus = conn.execute(
        "SELECT COUNT(*), COUNT(DISTINCT gpu_index) FROM gpu_samples WHERE ts_unix_s BETWEEN ? AND ?", (t0, t1)
    ).fetchone()
    if n <= max_points * max(n_gpus, 1):
        rows = _tuples(
            conn,
            f"SELECT ts_unix_s, gpu_index, name, uuid, {cols}, simulated FROM gpu_samples "
            "WHERE ts_unix_s BETWEEN ? AND ? ORDER BY ts_unix_s, gpu_index",
            (t0, t1),
        )
        return [_gpu(r) for r in rows]
    aggs = ", ".join(("AVG" if f in GPU_MEAN_FIELDS else "MAX") + f"({f})" for f in _GPU_FIELDS)
    rows = _tuples(
        conn,
        f"SELECT AVG(ts_unix_s), gpu_index, MAX(name), MAX(uuid), {aggs}, MAX(simulated) FROM gpu_samples "
        "WHERE ts_unix_s BETWEEN ? AND ? GROUP BY gpu_index, CAST((ts_unix_s - ?) / ? AS INTEGER) ORDER BY 1, 2",
        (t0, t1, t0, _bucket_s(t0, t1, max_points)),
    )
    return [_gpu(_fix_ints(r, _GPU_INT_POSITIONS)) for r in rows]


_HOST_FIELDS = ("cpu_pct", "mem_used_bytes", "mem_total_bytes", "ollama_cpu_pct", "ollama_rss_bytes", "disk_read_bytes_s")
_HOST_INT_POSITIONS = (2, 3, 5)


def host_samples(
    conn: sqlite3.Connection, t0_unix_s: float, t1_unix_s: float, max_points: int = DEFAULT_MAX_POINTS
) -> list[HostSample]:
    """Host samples in [t0, t1], oldest first; summarised per time bucket beyond ``max_points`` (as ``gpu_samples``)."""
    t0, t1 = t0_unix_s, t1_unix_s
    if _use_rollup(t0, t1, max_points):
        start = math.floor(t0 / ROLLUP_S) * ROLLUP_S
        rows = _tuples(
            conn,
            f"SELECT SUM(ts_sum) / SUM(n), {_rollup_select(HOST_MEAN_FIELDS, HOST_PEAK_FIELDS, _HOST_FIELDS)} "
            "FROM host_minutes WHERE minute_unix_s BETWEEN ? AND ? GROUP BY (minute_unix_s - ?) / ? ORDER BY 1",
            (start, t1, start, _rollup_bucket_s(t0, t1, max_points)),
        )
    else:
        (n,) = conn.execute("SELECT COUNT(*) FROM host_samples WHERE ts_unix_s BETWEEN ? AND ?", (t0, t1)).fetchone()
        if n <= max_points:
            rows = _tuples(
                conn,
                f"SELECT ts_unix_s, {', '.join(_HOST_FIELDS)} FROM host_samples WHERE ts_unix_s BETWEEN ? AND ? "
                "ORDER BY ts_unix_s",
                (t0, t1),
            )
            return [HostSample(*r) for r in rows]
        aggs = ", ".join(("AVG" if f in HOST_MEAN_FIELDS else "MAX") + f"({f})" for f in _HOST_FIELDS)
        rows = _tuples(
            conn,
            f"SELECT AVG(ts_unix_s), {aggs} FROM host_samples WHERE ts_unix_s BETWEEN ? AND ? "
            "GROUP BY CAST((ts_unix_s - ?) / ? AS INTEGER) ORDER BY 1",
            (t0, t1, t0, _bucket_s(t0, t1, max_points)),
        )
    return [HostSample(*_fix_ints(r, _HOST_INT_POSITIONS)) for r in rows]


# ---------------------------------------------------------------- Ollama and the collector


def latest_loaded_models(conn: sqlite3.Connection) -> list[LoadedModel]:
    """Models in the latest /api/ps snapshot ([] when nothing is loaded or nothing was polled yet)."""
    rows = conn.execute(
        "SELECT * FROM loaded_models WHERE ts_unix_s = (SELECT MAX(ts_unix_s) FROM ps_snapshots) ORDER BY name"
    )
    return [LoadedModel(**dict(r)) for r in rows]


def latest_ps_snapshot_unix_s(conn: sqlite3.Connection) -> float | None:
    """When /api/ps was last polled successfully (None: never)."""
    (ts,) = conn.execute("SELECT MAX(ts_unix_s) FROM ps_snapshots").fetchone()
    return ts


def _status(r: sqlite3.Row) -> OllamaStatus:
    return OllamaStatus(
        ts_unix_s=r["ts_unix_s"], up=bool(r["up"]), base_url=r["base_url"], version=r["version"], error=r["error"]
    )


def latest_ollama_status(conn: sqlite3.Connection) -> OllamaStatus | None:
    """The last poll of Ollama (None: the collector never polled)."""
    r = conn.execute("SELECT ts_unix_s, up, base_url, version, error FROM ollama_last_poll WHERE id = 1").fetchone()
    return None if r is None else _status(r)


def ollama_events(conn: sqlite3.Connection, t0_unix_s: float, t1_unix_s: float) -> list[OllamaStatus]:
    """Up/down (and version) changes in [t0, t1], oldest first, led by the state in force at t0."""
    rows = conn.execute(
        "SELECT * FROM (SELECT ts_unix_s, up, base_url, version, error FROM ollama_events WHERE ts_unix_s < ? "
        "ORDER BY ts_unix_s DESC LIMIT 1) UNION ALL "
        "SELECT ts_unix_s, up, base_url, version, error FROM ollama_events WHERE ts_unix_s BETWEEN ? AND ? "
        "ORDER BY ts_unix_s",
        (t0_unix_s, t0_unix_s, t1_unix_s),
    )
    return [_status(r) for r in rows]


def latest_heartbeat(conn: sqlite3.Connection) -> CollectorInfo | None:
    """The collector's last heartbeat (compare ``ts_unix_s`` with now to tell whether it is alive)."""
    r = conn.execute("SELECT * FROM collector_heartbeat WHERE id = 1").fetchone()
    if r is None:
        return None
    d = dict(r)
    del d["id"]
    d["demo"] = bool(d["demo"])
    d["record_text"] = bool(d["record_text"])
    return CollectorInfo(**d)


def model_info(conn: sqlite3.Connection, name: str) -> dict[str, Any] | None:
    """The /api/show answer for a model name (``llama3.2`` finds ``llama3.2:latest``), with ``digest`` and ``name``.

    None when the collector has not fetched it yet.
    """
    names = _name_variants(name)
    marks = ", ".join("?" * len(names))
    r = conn.execute(
        f"SELECT digest, name, show_json, updated_at_unix_s FROM model_info WHERE name IN ({marks}) "
        "ORDER BY updated_at_unix_s DESC LIMIT 1",
        names,
    ).fetchone()
    if r is None:
        # One row per digest keeps one name; an alias of the same weights is found through /api/ps.
        r = conn.execute(
            "SELECT digest, name, show_json, updated_at_unix_s FROM model_info WHERE digest = "
            f"(SELECT digest FROM loaded_models WHERE name IN ({marks}) OR model IN ({marks}) ORDER BY ts_unix_s DESC LIMIT 1)",
            [*names, *names],
        ).fetchone()
    if r is None:
        return None
    show: dict[str, Any] = json.loads(r["show_json"])
    return {**show, "digest": r["digest"], "name": r["name"], "updated_at_unix_s": r["updated_at_unix_s"]}


def _name_variants(name: str) -> Sequence[str]:
    if name.endswith(":latest"):
        return (name, name.removesuffix(":latest"))
    if ":" not in name:
        return (name, f"{name}:latest")
    return (name,)


def experiments(conn: sqlite3.Connection, kind: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """Lab experiments, newest first, with ``params`` and ``results`` parsed from JSON."""
    sql = "SELECT * FROM experiments"
    args: list[Any] = []
    if kind is not None:
        sql += " WHERE kind = ?"
        args.append(kind)
    rows = conn.execute(f"{sql} ORDER BY started_at_unix_s DESC LIMIT ?", [*args, int(limit)])
    out = []
    for r in rows:
        d = dict(r)
        d["params"] = json.loads(d.pop("params_json"))
        results = d.pop("results_json")
        d["results"] = None if results is None else json.loads(results)
        out.append(d)
    return out

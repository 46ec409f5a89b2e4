"""GPU and host samples for a window, read-only: raw for short windows, averaged per time bucket in SQL beyond
``max_points``, and from the per-minute rollups for long ones (the pages' charts never read more than that)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import Any

from analysis.records import GpuSample, HostSample
from store.schema import GPU_MEAN_FIELDS, GPU_PEAK_FIELDS, HOST_MEAN_FIELDS, HOST_PEAK_FIELDS, ROLLUP_S
from store.tables import GPU_SAMPLES, HOST_SAMPLES

# Beyond this many points per series a window is averaged into time buckets.
DEFAULT_MAX_POINTS = 1200


def _rows(conn: sqlite3.Connection, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Plain tuples: several times cheaper than sqlite3.Row for long results."""
    cur = conn.cursor()
    cur.row_factory = None
    return cur.execute(sql, args).fetchall()


def _bucket_s(t0: float, t1: float, max_points: int) -> float:
    return max((t1 - t0) / max(max_points, 1), 1e-3)


# Windows longer than this, or whose buckets would span a minute or more, read the per-minute rollups.
ROLLUP_WINDOW_S = 3 * 3600.0

# A GPU sample's measured columns (after ts, index, name, uuid; before simulated), and which hold integers.
_GPU_KEY_COLUMNS = ("ts_unix_s", "gpu_index", "name", "uuid")
_GPU_FIELDS = tuple(n for n in GPU_SAMPLES.column_names if n not in {*_GPU_KEY_COLUMNS, "simulated"})
_GPU_INT_POSITIONS = [len(_GPU_KEY_COLUMNS) + i for i, c in enumerate(GPU_SAMPLES.row_columns[4:-1]) if c.sql_type == "INTEGER"]
_HOST_FIELDS = HOST_SAMPLES.column_names[1:]
_HOST_INT_POSITIONS = [1 + i for i, c in enumerate(HOST_SAMPLES.row_columns[1:]) if c.sql_type == "INTEGER"]


def _gpu(values: Sequence[Any]) -> GpuSample:
    """A GpuSample from (ts, index, name, uuid, *_GPU_FIELDS, simulated)."""
    return GPU_SAMPLES.from_values(values)


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
        rows = _rows(
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
        rows = _rows(
            conn,
            f"SELECT ts_unix_s, gpu_index, name, uuid, {cols}, simulated FROM gpu_samples "
            "WHERE ts_unix_s BETWEEN ? AND ? ORDER BY ts_unix_s, gpu_index",
            (t0, t1),
        )
        return [_gpu(r) for r in rows]
    aggs = ", ".join(("AVG" if f in GPU_MEAN_FIELDS else "MAX") + f"({f})" for f in _GPU_FIELDS)
    rows = _rows(
        conn,
        f"SELECT AVG(ts_unix_s), gpu_index, MAX(name), MAX(uuid), {aggs}, MAX(simulated) FROM gpu_samples "
        "WHERE ts_unix_s BETWEEN ? AND ? GROUP BY gpu_index, CAST((ts_unix_s - ?) / ? AS INTEGER) ORDER BY 1, 2",
        (t0, t1, t0, _bucket_s(t0, t1, max_points)),
    )
    return [_gpu(_fix_ints(r, _GPU_INT_POSITIONS)) for r in rows]


def host_samples(
    conn: sqlite3.Connection, t0_unix_s: float, t1_unix_s: float, max_points: int = DEFAULT_MAX_POINTS
) -> list[HostSample]:
    """Host samples in [t0, t1], oldest first; summarised per time bucket beyond ``max_points`` (as ``gpu_samples``)."""
    t0, t1 = t0_unix_s, t1_unix_s
    if _use_rollup(t0, t1, max_points):
        start = math.floor(t0 / ROLLUP_S) * ROLLUP_S
        rows = _rows(
            conn,
            f"SELECT SUM(ts_sum) / SUM(n), {_rollup_select(HOST_MEAN_FIELDS, HOST_PEAK_FIELDS, _HOST_FIELDS)} "
            "FROM host_minutes WHERE minute_unix_s BETWEEN ? AND ? GROUP BY (minute_unix_s - ?) / ? ORDER BY 1",
            (start, t1, start, _rollup_bucket_s(t0, t1, max_points)),
        )
    else:
        (n,) = conn.execute("SELECT COUNT(*) FROM host_samples WHERE ts_unix_s BETWEEN ? AND ?", (t0, t1)).fetchone()
        if n <= max_points:
            rows = _rows(
                conn,
                f"SELECT ts_unix_s, {', '.join(_HOST_FIELDS)} FROM host_samples WHERE ts_unix_s BETWEEN ? AND ? "
                "ORDER BY ts_unix_s",
                (t0, t1),
            )
            return [HOST_SAMPLES.from_values(r) for r in rows]
        aggs = ", ".join(("AVG" if f in HOST_MEAN_FIELDS else "MAX") + f"({f})" for f in _HOST_FIELDS)
        rows = _rows(
            conn,
            f"SELECT AVG(ts_unix_s), {aggs} FROM host_samples WHERE ts_unix_s BETWEEN ? AND ? "
            "GROUP BY CAST((ts_unix_s - ?) / ? AS INTEGER) ORDER BY 1",
            (t0, t1, t0, _bucket_s(t0, t1, max_points)),
        )
    return [HOST_SAMPLES.from_values(_fix_ints(r, _HOST_INT_POSITIONS)) for r in rows]

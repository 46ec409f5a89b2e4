"""What an import of Ollama's log (``collectors.import_log``) asks the store before it writes: the generations
already recorded around a time, by the runner's own figures, and the model names the store knows by digest and
by runner port. Read-only; the writes go through ``store.writer`` like every other record.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class RecordedFigures:
    """One recorded generation as the runner counted and timed it (None: not recorded), with its end's time."""

    id: str
    ended_unix_s: float | None
    prompt_tokens: int | None  # prompt_eval_count: the whole prompt, cached part included
    output_tokens: int | None  # eval_count
    prefill_ns: int | None  # prompt_eval_duration
    decode_ns: int | None  # eval_duration
    # how far a figure may be off (a direct record read from /slots); None or 0 for the runner's own timings
    prefill_bound_s: float | None
    decode_bound_s: float | None
    output_tokens_bound: int | None


_FIGURES_SQL = (
    "SELECT id, COALESCE(ended_at_unix_s, started_at_unix_s + total_s), prompt_eval_count, eval_count, "
    "prompt_eval_duration_ns, eval_duration_ns, prefill_bound_s, decode_bound_s, output_tokens_bound "
    "FROM requests WHERE kind = 'generate' AND outcome <> 'in_flight' "
    "AND COALESCE(ended_at_unix_s, started_at_unix_s + total_s, started_at_unix_s) BETWEEN ? AND ?"
)


def recorded_between(conn: sqlite3.Connection, since_unix_s: float, until_unix_s: float) -> list[RecordedFigures]:
    """Finished generations whose end lies in [since, until] (by ``idx``-free scan of that time range)."""
    rows = conn.execute(_FIGURES_SQL, (since_unix_s, until_unix_s)).fetchall()
    return [
        RecordedFigures(
            id=str(r[0]),
            ended_unix_s=float(r[1]) if r[1] is not None else None,
            prompt_tokens=r[2],
            output_tokens=r[3],
            prefill_ns=r[4],
            decode_ns=r[5],
            prefill_bound_s=r[6],
            decode_bound_s=r[7],
            output_tokens_bound=r[8],
        )
        for r in rows
    ]


def model_names_by_digest(conn: sqlite3.Connection) -> dict[str, str]:
    """Digest (hex, no ``sha256:``) → the model name Ollama gave it, from /api/ps and /api/tags as recorded."""
    out: dict[str, str] = {}
    for table in ("installed_models", "loaded_models"):
        try:
            rows = conn.execute(f"SELECT digest, name FROM {table} WHERE digest IS NOT NULL ORDER BY rowid").fetchall()
        except sqlite3.OperationalError:  # an older store without the table
            continue
        for digest, name in rows:
            if digest and name:
                out[str(digest).removeprefix("sha256:")] = str(name)
    return out


def runner_models_by_port(conn: sqlite3.Connection) -> dict[int, list[tuple[float, str, str | None]]]:
    """Port → (when read, model name, digest) of each runner the collector found on it, oldest first."""
    out: dict[int, list[tuple[float, str, str | None]]] = {}
    try:
        sql = "SELECT ts_unix_s, port, model, digest FROM runners WHERE model IS NOT NULL ORDER BY ts_unix_s"
        rows = conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return out
    for ts, port, model, digest in rows:
        out.setdefault(int(port), []).append((float(ts), str(model), digest))
    return out


def placement_read_at(conn: sqlite3.Connection) -> dict[int, float]:
    """Port → when the placement stored for it was read (the runner's load lines), for ports that have one."""
    try:
        rows = conn.execute("SELECT port, MAX(ts_unix_s) FROM runner_devices GROUP BY port").fetchall()
    except sqlite3.OperationalError:
        return {}
    return {int(port): float(ts) for port, ts in rows if ts is not None}


# While a collector records it writes a host sample every second, rolled up per minute once old.
WATCH_GAP_S = 5.0


def watched(conn: sqlite3.Connection, lo_unix_s: float, hi_unix_s: float) -> bool:
    """Whether a collector was recording over [lo, hi]: a host sample within ``WATCH_GAP_S`` of it, or a minute's
    rollup holding samples of the minute it began in. What such a collector did not record, it did not believe."""
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM host_samples WHERE ts_unix_s BETWEEN ? AND ? LIMIT 1)",
            (lo_unix_s - WATCH_GAP_S, hi_unix_s + WATCH_GAP_S),
        ).fetchone()
        if n:
            return True
        (m,) = conn.execute(
            "SELECT COUNT(*) FROM host_minutes WHERE minute_unix_s = ? AND n > 0", (int(lo_unix_s // 60) * 60,)
        ).fetchone()
    except sqlite3.OperationalError:  # an older store without the tables
        return False
    return bool(m)

"""What the Lab page shows, shaped from the store (read-only) and the run documents. No Streamlit, no sockets."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from collectors.api import Cost, ExperimentResult, ResultFileError, RunState, list_results, result_from_row
from pages.shared import fmt
from pages.shared.basis import window_speeds
from pages.shared.window import DEFAULT_WINDOW_S, ModelWindow, window_words
from store import queries

MODELS_SINCE_S = 30 * 86_400.0
# Upper-guess rates when the store has none for a model: a small machine running a mid-size model.
FALLBACK_PREFILL_TOK_S = 300.0
FALLBACK_DECODE_TOK_S = 15.0
FALLBACK_LOAD_S = 10.0


def known_models(db: Path, now_unix_s: float | None = None) -> list[str]:
    """Models the collector has seen: loaded now first, then those with recent requests."""
    now = time.time() if now_unix_s is None else now_unix_s
    with queries.open_reader(db) as conn:
        if conn is None:
            return []
        loaded = [m.name for m in queries.latest_loaded_models(conn)]
        seen = queries.request_models(conn, now - MODELS_SINCE_S)
    return list(dict.fromkeys([*loaded, *seen]))


def loaded_context(db: Path, model: str) -> int | None:
    """The context the loaded model gets (``/api/ps`` context_length), if it is loaded."""
    with queries.open_reader(db) as conn:
        loaded = None if conn is None else queries.loaded_model(conn, model)
    return None if loaded is None else loaded.context_length


@dataclass(frozen=True)
class Rates:
    prefill_tok_s: float
    decode_tok_s: float
    measured: bool  # False: fallback guesses, no reading of this model that counts
    requests: int = 0  # readings behind the medians (prefill, decode: the fewer); measured False: readings set apart
    window: ModelWindow | None = None  # the requests they come from: the Why page's window


def recent_rates(db: Path, model: str, now_unix_s: float | None = None, window_s: float = DEFAULT_WINDOW_S) -> Rates:
    """The model's prefill and decode speed for the cost estimate, read as the Why page reads them
    (``pages.shared.basis.window_speeds``: the medians of the readings that count, in the same window)."""
    now = time.time() if now_unix_s is None else now_unix_s
    read = window_speeds(db, model, now, window_s) if model else None
    speeds, win = read if read is not None else (None, None)
    if speeds is None or speeds.prefill_tok_s is None or speeds.decode_tok_s is None:
        return Rates(FALLBACK_PREFILL_TOK_S, FALLBACK_DECODE_TOK_S, False, speeds.readings_judged if speeds else 0, win)
    n = min(speeds.prefill_readings, speeds.decode_readings)
    return Rates(speeds.prefill_tok_s, speeds.decode_tok_s, True, n, win)


def _none_count(rates: Rates) -> str:
    if not rates.requests or rates.window is None:
        return "no reading of this model that counts yet"
    return (
        f"none of this model's {fmt.count(rates.requests)} readings over {window_words(rates.window)} counts: too short to time, "
        "or above the ceiling of the hardware they ran on (the Why page shows which)"
    )


def cost_sentence(cost: Cost, rates: Rates) -> str:
    seconds = cost.seconds(rates.prefill_tok_s, rates.decode_tok_s, FALLBACK_LOAD_S)
    where = window_words(rates.window) if rates.window is not None else "the window"
    basis = (
        f"at this model's speed over {where}, as the Why page reads it ({rates.prefill_tok_s:,.0f} tok/s prefill, "
        f"{rates.decode_tok_s:,.1f} tok/s decode: medians of the readings that count)"
        if rates.measured
        else f"at a slow machine's speed ({rates.prefill_tok_s:,.0f} / {rates.decode_tok_s:,.0f} tok/s; {_none_count(rates)})"
    )
    warm = " (the first a warm-up that gives no point)" if cost.warm_up_requests else ""
    text = (
        f"Sends {fmt.count(cost.requests)} requests{warm}: about {fmt.count(cost.prompt_tokens)} prompt tokens and "
        f"{fmt.count(cost.output_tokens)} "
        f"output tokens; about {seconds:,.0f} s {basis}."
    )
    for note in cost.notes:
        text += f" Note: {note}."
    return text


def load_runs(data_dir: Path, db: Path) -> list[ExperimentResult]:
    """Every run, newest first: the store's experiments plus run documents not stored yet (running ones).

    A document wins over the store's row for the same run: it is the source, the row its copy.
    """
    by_id: dict[str, ExperimentResult] = {}
    with queries.open_reader(db) as conn:
        if conn is not None:
            for row in queries.experiment_rows(conn, limit=200):
                with contextlib.suppress(ResultFileError, KeyError):
                    r = result_from_row(row)
                    by_id[r.run_id] = r
    for r in list_results(data_dir):
        by_id[r.run_id] = r
    return sorted(by_id.values(), key=lambda r: r.started_at_unix_s, reverse=True)


def run_label(r: ExperimentResult, interrupted: bool = False) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at_unix_s))
    state = "interrupted" if interrupted else r.state
    return f"{when} · {r.name} · {fmt.label(r.model)} · {state}"


def is_running(r: ExperimentResult) -> bool:
    return r.state == RunState.RUNNING


# Names a user reads for the points' keys; anything else follows the suffix rules of ``column_name``.
POINT_NAMES = {
    "ttft_s": "first token",
    "ttft_s_max": "slowest first token",
    "ttft_s_median": "median first token",
    "num_ctx": "context (num_ctx)",
    "num_parallel": "parallel slots",
}


def column_name(key: str) -> str:
    """``prefill_tok_s`` → "prefill (tok/s)", ``load_s`` → "load", ``prompt_tokens`` → "prompt tokens"."""
    if key in POINT_NAMES:
        return POINT_NAMES[key]
    for suffix, unit in (("_tok_s", " (tok/s)"), ("_ms", ""), ("_s", ""), ("_bytes", ""), ("_pct", " (%)"), ("_w", " (W)")):
        if key.endswith(suffix):
            return key[: -len(suffix)].replace("_", " ") + unit
    return key.replace("_", " ")


def _cell(key: str, value: object) -> object:
    """One value as the page's units convention shows it: durations in ms below 1 s, bytes in GB, "—" when unknown."""
    if value is None or (isinstance(value, float) and value != value):
        return fmt.UNKNOWN
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if key.endswith("_ms"):
        return fmt.seconds(value / 1000)
    if (key.endswith("_s") and not key.endswith("_tok_s")) or (key in POINT_NAMES and key.startswith("ttft")):
        return fmt.seconds(float(value))
    if key.endswith("_bytes"):
        return fmt.gb(value)
    if key.endswith("_tok_s"):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"  # the unit is in the column's name
    if float(value).is_integer():
        return fmt.count(value)
    return f"{value:,.3g}"


def points_frame(points: list[dict[str, object]]) -> pd.DataFrame:
    """A run's measured points with human column names and units (text cells: what the table shows)."""
    keys = list(dict.fromkeys(k for p in points for k in p))
    return pd.DataFrame([{column_name(k): _cell(k, p.get(k)) for k in keys} for p in points])

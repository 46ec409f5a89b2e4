"""The time windows every page offers, the one they start on, and the window a model's numbers come from (no
Streamlit: ``python -m pages.why`` uses the same defaults as the page)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from pages.shared import fmt
from store import queries

WINDOWS_S: dict[str, float] = {"1 min": 60, "5 min": 300, "15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 24 * 3600}
DEFAULT_WINDOW = "5 min"
DEFAULT_WINDOW_S = WINDOWS_S[DEFAULT_WINDOW]
ACTIVITY_PAD_S = 60.0  # a window moved to the last activity ends this long after its newest request started


@dataclass(frozen=True)
class ModelWindow:
    """The requests every number of the page comes from: those that started in [end − length, end]."""

    end_unix_s: float
    length_s: float
    asked_end_unix_s: float  # the end asked for (the wall clock on the page)
    moved: bool = False  # the asked window held no request of the model: this one ends at its newest request

    @property
    def start_unix_s(self) -> float:
        return self.end_unix_s - self.length_s


def model_window(conn: sqlite3.Connection, model: str, now_unix_s: float, window_s: float) -> ModelWindow:
    """The window ending at ``now_unix_s``; when it holds no finished request of ``model``, the same length ending
    ACTIVITY_PAD_S after the model's newest request (the last period with activity), said so."""
    asked = ModelWindow(now_unix_s, window_s, now_unix_s)
    inside = queries.rate_rows(conn, model, now_unix_s - window_s, limit=1)
    if inside and inside[0].started_at_unix_s <= now_unix_s:
        return asked
    newest = queries.rate_rows(conn, model, 0.0, limit=1)
    if not newest or newest[0].started_at_unix_s > now_unix_s:
        return asked
    return ModelWindow(newest[0].started_at_unix_s + ACTIVITY_PAD_S, window_s, now_unix_s, moved=True)


def window_words(win: ModelWindow) -> str:
    """How the page names its window: the sidebar's, or the last period with activity it moved to."""
    length = fmt.seconds(win.length_s)
    if not win.moved:
        return f"the last {length} (the sidebar's window)"
    return f"the {length} up to {fmt.clock(win.end_unix_s)}, the last period with activity"

"""The time windows every page offers and the one they start on (no Streamlit: ``python -m pages.why`` uses the same
default as the page)."""

from __future__ import annotations

WINDOWS_S: dict[str, float] = {"1 min": 60, "5 min": 300, "15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 24 * 3600}
DEFAULT_WINDOW = "5 min"
DEFAULT_WINDOW_S = WINDOWS_S[DEFAULT_WINDOW]

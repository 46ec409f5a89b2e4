"""Formatting of numbers with their units, for display only (values stay in SI units elsewhere).

The convention on every page and in the export: bytes in GB = 10^9, as ``ollama ps`` prints them,
labelled "GB"; integral quantities as integers; durations in ms below one second; "—" for unknown
(never 0, never "None").
"""

from __future__ import annotations

import re
from datetime import datetime

from analysis import wording

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:])")
# Where Markdown's autolinks start (http://, www., e-mail): a word joiner (invisible) breaks each one.
_AUTOLINK_START = re.compile(r"(?i)(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)")
WORD_JOINER = "\u2060"
_DATE = re.compile(r"\b([0-9]{4})-([0-9]{2})-([0-9]{2})\b")
GB = 1e9
MB = 1e6
UNKNOWN = "—"
# What a page draws from a text field that comes from elsewhere (issue 25 #7: one 1 MB model name, copied into
# every chart bar and table cell, cost the Live tab 12 s of server CPU per 15 s and hung the browser tab):
LABEL_MAX_CHARS = 100  # a name (model, client, GPU) in a chart, table, card or menu: cut in the middle beyond this
# (Hugging Face model names run to ~80 characters: they stay whole)
SENTENCE_MAX_CHARS = 600  # a sentence of ours that quotes such names (diagnoses, flags)
TEXT_MAX_CHARS = 20_000  # a prompt, reply or error shown on a page: its start, the whole as a download
ELLIPSIS = "…"


def seconds(duration_s: float | None) -> str:
    """Seconds as '4.2 s', '3 min 05 s' or '1 h 02 min'."""
    if duration_s is None:
        return "—"
    if duration_s < 0:
        return "-" + seconds(-duration_s)
    if duration_s < 0.01:
        return f"{duration_s * 1000:.1f} ms"  # "0.4 ms", not "0 ms": a short phase is not a missing one
    if duration_s < 1:
        return f"{duration_s * 1000:.0f} ms"
    if duration_s < 10:
        return f"{duration_s:.2f} s"
    if duration_s < 60:
        return f"{duration_s:.1f} s"
    if duration_s < 3600:
        minutes, secs = divmod(round(duration_s), 60)
        return f"{minutes} min" if secs == 0 else f"{minutes} min {secs:02d} s"
    hours, rest = divmod(round(duration_s), 3600)
    return f"{hours} h" if rest // 60 == 0 else f"{hours} h {rest // 60:02d} min"


def rate(tok_s: float | None) -> str:
    """Tokens per second with sensible precision."""
    if tok_s is None:
        return "—"
    if tok_s >= 1000:
        return f"{tok_s:,.0f} tok/s"
    if tok_s >= 10:
        return f"{tok_s:.1f} tok/s"
    return f"{tok_s:.2f} tok/s"


def gb(n_bytes: int | float | None) -> str:
    """Bytes in GB = 10^9, as ``ollama ps`` prints them ("4.92 GB", "12.3 GB", "512 MB"): one rule with the sentences'."""
    return UNKNOWN if n_bytes is None else wording.gb(n_bytes)


def count(n: int | float | None) -> str:
    """An integral quantity (tokens, requests, heads): "8", "1,234"; "—" when unknown."""
    if n is None:
        return UNKNOWN
    return f"{round(n):,}"


def clock(ts_unix_s: float) -> str:
    """Wall-clock time of day in the machine's local time zone."""
    return datetime.fromtimestamp(ts_unix_s).strftime("%H:%M:%S")


def when(ts_unix_s: float) -> str:
    """Date and time of day in the machine's local time zone."""
    return datetime.fromtimestamp(ts_unix_s).strftime("%Y-%m-%d %H:%M:%S")


def label(name: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """A name as drawn on a page: whole up to ``max_chars`` characters, else its start and end around "…".

    The end stays because it is what tells names apart (``llama3.1:8b`` and ``llama3.1:70b``).
    """
    if len(name) <= max_chars:
        return name
    tail = max_chars // 3
    return name[: max_chars - tail - 1] + ELLIPSIS + name[-tail:]


def labels(names: list[str], max_chars: int = LABEL_MAX_CHARS) -> list[str]:
    """``label`` of each name, kept apart: a chart category shared by two names cut alike would merge their bars."""
    out: list[str] = []
    seen: set[str] = set()
    for name in names:
        shown = label(name, max_chars)
        n = 1
        while shown in seen:  # two long names cut alike: number the later one
            n += 1
            shown = f"{label(name, max_chars - len(str(n)) - 3)} ({n})"
        seen.add(shown)
        out.append(shown)
    return out


def excerpt(text: str, max_chars: int = TEXT_MAX_CHARS) -> str:
    """The start of a long text (prompt, reply, error) as a page shows it, saying how much more there is."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n{ELLIPSIS} ({count(len(text) - max_chars)} more characters: download the whole text)"


def md_escape(text: str) -> str:
    """Text from elsewhere (model and GPU names, versions, flag texts) made literal inside our own Markdown.

    Backslash escapes stop emphasis and links, but not autolinks: Streamlit's Markdown finds bare URLs in
    the text after escapes are resolved, so a word joiner goes where each would start.
    """
    return _MD_SPECIAL.sub(r"\\\1", _AUTOLINK_START.sub(WORD_JOINER, text))


def unbroken_dates(text: str) -> str:
    """``text`` with a word joiner (invisible) after each hyphen of a date, so a wrapping cell never breaks one; for
    display only: the view-models and ``--json`` keep the plain date."""
    return _DATE.sub(lambda m: f"{m[1]}-{WORD_JOINER}{m[2]}-{WORD_JOINER}{m[3]}", text)

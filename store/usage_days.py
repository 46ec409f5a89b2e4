"""Reads of ``usage_days`` (store/schema.py, v23): the finished requests' usage per UTC day × model × client host ×
program, kept by triggers as rows are written, so that 30 days of usage read a bounded number of summary rows."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from store.schema import USAGE_DAY_S


@dataclass(frozen=True)
class UsageDay:
    """One group's day. Per figure: ``*_n`` the requests it applies to, ``*_known`` those that gave it, and the sum
    over those (0 when none did: the reader says unknown, never 0)."""

    day_unix_s: int  # the UTC day's start
    model: str
    client: str  # the client's host; "" for a direct record (no client address)
    program: str  # the User-Agent's product; "" when not known
    requests: int
    embeddings: int
    prompt_n: int
    prompt_known: int
    prompt_tokens: int
    output_n: int
    output_known: int
    output_tokens: int
    gpu_n: int
    gpu_known: int
    gpu_s: float


def day_of(ts_unix_s: float) -> int:
    """The start of the UTC day holding ``ts_unix_s``, as the store's triggers compute it."""
    return int(ts_unix_s // USAGE_DAY_S) * USAGE_DAY_S


def usage_days(conn: sqlite3.Connection, since_day_unix_s: int, until_day_unix_s: int) -> list[UsageDay]:
    """The groups of the UTC days from ``since_day_unix_s`` to ``until_day_unix_s`` (both day starts, inclusive)."""
    cur = conn.execute(
        "SELECT day, model, client, program, requests, embeddings, prompt_n, prompt_known, prompt_tokens, output_n, "
        "output_known, output_tokens, gpu_n, gpu_known, gpu_s FROM usage_days WHERE day BETWEEN ? AND ?",
        (int(since_day_unix_s), int(until_day_unix_s)),
    )
    return [UsageDay(*row) for row in cur.fetchall()]

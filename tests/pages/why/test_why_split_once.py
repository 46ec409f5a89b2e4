"""Why splits the wait of each diagnosed request among the window's recent requests: each recent request's
intervals are read once for all of them (analysis.wait_split.Neighbours), not once per pair (issue 48: 100 diagnosed
among 400 recent read 40,000 pairs, 2-6 s of the page's first content at 200,000 requests)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import analysis.wait_split as wait_split
from bench.pages_fixture import make_request
from pages.why.view import DIAGNOSE_LIMIT, build_why
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter

N_REQUESTS = 300


def test_each_recent_request_is_read_once_for_every_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    t0 = now - 250
    w = StoreWriter(db_path(tmp_path))
    w.apply([PutRequest(make_request(t0 + i * 0.8, t0, model="llama3.2:latest")) for i in range(N_REQUESTS)])
    w.close()
    calls = [0]
    real = wait_split.busy_of

    def counted(*args: object, **kwargs: object) -> wait_split.Busy:
        calls[0] += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(wait_split, "busy_of", counted)
    why = build_why(db_path(tmp_path), "llama3.2:latest", now, 300.0)
    assert why is not None and why.diagnosed_requests == DIAGNOSE_LIMIT  # every one split among the others
    # Each recent request once, and each diagnosed one as itself: on main 100 × 299 pairs.
    assert calls[0] <= N_REQUESTS + DIAGNOSE_LIMIT, calls[0]

"""Issue 25 #7: one long name (or text) from elsewhere costs the pages only what a short one does.

A store holds the usual fixture plus one request whose model is named 1 MB long (and so is a loaded model), with
3 MB of prompt and reply recorded. Each page runs in ``AppTest``; what it would send to the browser (every
element's protobuf: figures, tables, menus, text) stays small, each name is cut (``fmt.LABEL_MAX_CHARS``), and
the whole name and text stay on demand (downloads fetched only when clicked).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from analysis.records import LoadedModel
from bench.pages_fixture import GIB, Shape, build_fixture_store, make_request
from pages.shared import charts, fmt
from store.ops import PutLoadedModels, PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.paths import REPO

APP = str(REPO / "app.py")
TIMEOUT_S = 120  # generous: the test machine is shared, and the old code took seconds here
LONG_NAME = "m" * 1_000_000 + ":latest"  # 1 MB
LONG_TEXT = "t" * 3_000_000  # 3 MB of prompt, and as much reply
# What one page may send with that store: the same store with short names sends ~0.2-0.4 MB (the GPU and host
# charts' samples); the old code sent the 1 MB name once per phase bar, table cell and menu entry.
PAGE_MAX_BYTES = 1_000_000


@pytest.fixture
def long_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PHASEWATCH_DATA", str(tmp_path))
    monkeypatch.setenv("PHASEWATCH_COLLECTOR", "off")
    for name in ("PHASEWATCH_DEMO", "OLLAMA_HOST", "PHASEWATCH_LISTEN"):
        monkeypatch.delenv(name, raising=False)
    now = time.time()
    build_fixture_store(tmp_path, now)
    t0 = now - 600
    long = make_request(
        now - 50,
        t0,
        model=LONG_NAME,
        shape=Shape(output_tokens=40, decode_ms=800),
        prompt_text=LONG_TEXT,
        response_text=LONG_TEXT,
        request_id="long-name-request",
    )
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(long))
        w.write(
            PutLoadedModels(
                now - 1,
                [
                    LoadedModel(
                        now - 1, LONG_NAME, LONG_NAME, "c" * 64, 2 * GIB, 2 * GIB, 8192, now + 240, "3.2B", "Q4_K_M", "llama"
                    )
                ],
            )
        )
    finally:
        w.close()
    return long.id


def _elements(node: Any) -> Iterator[Any]:
    proto = getattr(node, "proto", None)
    if proto is not None:
        yield node
    for child in getattr(node, "children", {}).values():
        yield from _elements(child)


def sent_bytes(at: AppTest) -> int:
    """What the page's elements weigh as Streamlit sends them (their protobuf messages)."""
    return sum(len(e.proto.SerializeToString()) for e in _elements(at._tree))


def _run(page: str | None = None, **state: Any) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT_S)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("page", [None, "pages/requests/page.py", "pages/why/page.py", "pages/lab/page.py"])
def test_a_1_mb_name_costs_each_page_what_a_short_one_does(long_store: str, page: str | None) -> None:
    at = _run(page, why_model=LONG_NAME, lab_model=LONG_NAME)  # the long name picked where a page offers models
    size = sent_bytes(at)
    assert size < PAGE_MAX_BYTES, f"{page or 'Live'} sends {size:,} bytes with one 1 MB model name stored"
    # Each name shown is cut: no element holds more than a cut name's share of it.
    for e in _elements(at._tree):
        assert e.proto.SerializeToString().count(b"m" * (fmt.LABEL_MAX_CHARS + 1)) == 0, type(e).__name__


def test_requests_detail_shows_the_start_of_a_long_text_and_offers_the_whole(long_store: str) -> None:
    at = _run("pages/requests/page.py", req_pick=long_store)
    assert sent_bytes(at) < PAGE_MAX_BYTES
    codes = [c.value for c in at.code]
    shown = [c for c in codes if c.startswith("t" * 100)]
    assert len(shown) == 2 and all(len(c) < fmt.TEXT_MAX_CHARS + 100 and "3,000,000" not in c for c in shown)
    assert all("more characters" in c for c in shown)
    downloads = [b.proto.label for b in _elements(at._tree) if type(b.proto).__name__ == "DownloadButton"]
    assert any("whole prompt (3,000,000 characters)" in d for d in downloads), downloads
    assert any("whole reply" in d for d in downloads) and any("whole model name (1,000,007" in d for d in downloads)


def test_model_groups_name_each_model_once_and_bound_the_traces() -> None:
    names, group_of = charts.model_groups([LONG_NAME, "a", LONG_NAME, *[f"m{i}" for i in range(20)]])
    assert len(names) == charts.MAX_MODEL_GROUPS and names[-1] == f"15 {charts.OTHER_MODELS}"
    assert all(len(n) <= fmt.LABEL_MAX_CHARS for n in names) and names[0].endswith(":latest")
    assert group_of[:3] == [0, 1, 0] and group_of[-1] == charts.MAX_MODEL_GROUPS - 1

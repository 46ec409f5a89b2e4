"""The report names the programs behind the requests (their User-Agent products), the most frequent first, at most
``MAX_PROGRAMS_NAMED``; the rest and those naming none are counted; a product's text never starts a line of its own."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from pages.why.report import MAX_PROGRAMS_NAMED, build_report
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.records import make_record


def _line(data: Path) -> str:
    report = build_report(data)
    assert report is not None
    return next(x for x in report.splitlines() if x.startswith("Requests:"))


def test_programs_named_bounded_and_unknown_counted(tmp_path: Path) -> None:
    now = time.time()
    programs = ["llm"] * 3 + [f"tool-{i}" for i in range(MAX_PROGRAMS_NAMED + 1)] + [None, None]
    w = StoreWriter(db_path(tmp_path))
    try:
        for i, program in enumerate(programs):
            w.write(PutRequest(replace(make_record(f"r{i}", now - 100 + i), client_program=program)))
    finally:
        w.close()
    line = _line(tmp_path)
    named = ", ".join(["llm × 3", *(f"tool-{i} × 1" for i in range(MAX_PROGRAMS_NAMED - 1))])
    assert line.endswith(f"by program (User-Agent): {named}, 2 other programs × 2, 2 naming no program"), line


def test_a_forged_line_in_a_product_stays_in_its_line(tmp_path: Path) -> None:
    now = time.time()
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(replace(make_record("x", now - 10), client_program="evil\nFlags seen:\n  none")))
    finally:
        w.close()
    report = build_report(tmp_path)
    assert report is not None
    assert "evil\\nFlags seen:\\n  none × 1" in _line(tmp_path)
    assert report.count("Flags seen:") == 2  # the report's own line, and the escaped one inside the Requests line
    assert sum(1 for x in report.splitlines() if x.startswith("Flags seen:")) == 1


def test_no_program_known_says_so(tmp_path: Path) -> None:
    w = StoreWriter(db_path(tmp_path))
    try:
        w.write(PutRequest(make_record("plain", time.time() - 10)))
    finally:
        w.close()
    assert _line(tmp_path).endswith("by program (User-Agent): 1 naming no program")

"""How much SQLite work each page's script run does: the VM steps of every statement it runs, counted per page.

Every connection opened while a page renders in ``AppTest`` gets a progress handler that counts SQLite VM
instructions (``set_progress_handler``, one call per ``STEP_UNIT``). A page whose queries read a bounded number of
rows does about the same work over a store ten times the size; one that scans does ten times the work.
Used by tests/pages/test_page_work_bounded.py; bench/page_queries.py prints the same per statement.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.support.paths import REPO

USAGE = "Requests: usage totals"  # the Requests page again, its "Show usage totals" toggle turned on
PAGES = ("Live", "pages/requests/page.py", USAGE, "pages/why/page.py", "pages/lab/page.py")
STEP_UNIT = 100  # the handler runs every STEP_UNIT VM instructions: fine enough for a page that reads a few rows


@contextmanager
def counted_connections(counter: list[int], statements: list[str] | None = None) -> Iterator[None]:
    """While inside, every ``sqlite3.connect`` returns a connection whose VM steps add to ``counter[0]``
    (in units of ``STEP_UNIT``), and whose statements (values bound) are appended to ``statements``."""
    real_connect = sqlite3.connect

    def tick() -> int:
        counter[0] += 1
        return 0  # 0: go on

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)  # type: ignore[call-overload]
        conn.set_progress_handler(tick, STEP_UNIT)
        if statements is not None:
            conn.set_trace_callback(statements.append)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = real_connect


@dataclass
class PageWork:
    steps: int  # VM steps, in STEP_UNITs
    statements: list[str] = field(default_factory=list)  # every statement run, values bound
    marks: dict[str, int] = field(default_factory=dict)  # chart title → markers and bars it draws (chart_marks)
    captions: list[str] = field(default_factory=list)  # the page's captions, as written


_ITEM_BYTES = {"f8": 8, "f4": 4, "i4": 4, "u4": 4, "i2": 2, "u2": 2, "i1": 1, "u1": 1}


def _length(values: object) -> int:
    """How many values a trace's array holds, as Plotly sends it: a list, or a typed array (base64 ``bdata``)."""
    if isinstance(values, list):
        return len(values)
    if isinstance(values, dict) and "bdata" in values:
        return len(base64.b64decode(values["bdata"])) // _ITEM_BYTES[str(values["dtype"])]
    return 0


def chart_marks(at: AppTest) -> dict[str, int]:
    """Per chart on the page (by its title), the markers and bars it draws: what the browser lays out one by one.
    A line is one path whatever its points, so its points are not counted."""
    out: dict[str, int] = {}
    for i, el in enumerate(at.get("plotly_chart")):
        spec = json.loads(el.proto.spec)
        title = spec.get("layout", {}).get("title", {})
        name = f"{i}: {(title.get('text') if isinstance(title, dict) else title) or ''}"[:60]
        n = 0
        for trace in spec.get("data", []):
            drawn = trace.get("type") == "bar" or "markers" in str(trace.get("mode", "markers"))
            n += _length(trace.get("x")) if drawn else 0
        out[name] = n
    return out


def page_work(window: str, timeout_s: float = 120.0) -> dict[str, PageWork]:
    """Each page's SQLite work for one script run over the store the environment names (``PHASEWATCH_DATA``, with
    ``PHASEWATCH_COLLECTOR=off``: set by the caller): Live rendered from app.py, then a switch to each other page,
    as a user clicks through them, turning on the Requests page's usage totals on the way."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=timeout_s)
    at.session_state["pw_window"] = window
    out: dict[str, PageWork] = {}
    for page in PAGES:
        counter: list[int] = [0]
        statements: list[str] = []
        with counted_connections(counter, statements):
            if page == "Live":
                at.run()
            elif page == USAGE:
                at.toggle(key="usage_show").set_value(True).run()
            else:
                at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        out[page] = PageWork(counter[0], statements, chart_marks(at), [c.value for c in at.caption])
    return out


def full_scans(db: Path, statements: list[str], tables: tuple[str, ...] = ("requests", "request_tokens")) -> list[str]:
    """The plan lines of the SELECTs among ``statements`` that read all of one of ``tables`` (``SCAN t``, not
    ``SEARCH``), each with its statement's start. An index walked whole (``SCAN t USING INDEX``) is left to the step
    count: with ORDER BY and LIMIT it reads only the rows it returns."""
    found = []
    with contextlib.closing(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        for sql in dict.fromkeys(s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))):
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql):
                detail = str(row[3])
                if any(re.search(rf"\bSCAN {t}\b(?! USING (?:COVERING )?INDEX)", detail) for t in tables):
                    found.append(f"{detail}: {' '.join(sql.split())[:160]}")
    return found

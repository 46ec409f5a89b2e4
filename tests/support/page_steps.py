"""How much SQLite work each page's script run does: the VM steps of every statement it runs, counted per page.

Every connection opened while a page renders in ``AppTest`` gets a progress handler that counts SQLite VM
instructions (``set_progress_handler``, one call per ``STEP_UNIT``). A page whose queries read a bounded number of
rows does about the same work over a store ten times the size; one that scans does ten times the work.
Used by tests/pages/test_page_work_bounded.py; bench/page_queries.py prints the same per statement.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.support.paths import REPO

PAGES = ("Live", "pages/requests/page.py", "pages/why/page.py", "pages/lab/page.py")
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


def page_work(window: str, timeout_s: float = 120.0) -> dict[str, PageWork]:
    """Each page's SQLite work for one script run over the store the environment names (``PHASEWATCH_DATA``, with
    ``PHASEWATCH_COLLECTOR=off``: set by the caller): Live rendered from app.py, then a switch to each other page,
    as a user clicks through them."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=timeout_s)
    at.session_state["pw_window"] = window
    out: dict[str, PageWork] = {}
    for page in PAGES:
        counter: list[int] = [0]
        statements: list[str] = []
        with counted_connections(counter, statements):
            if page == "Live":
                at.run()
            else:
                at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        out[page] = PageWork(counter[0], statements)
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

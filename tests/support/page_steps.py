"""How much SQLite work each page's script run does: the VM steps of every statement it runs, counted per page.

Every connection opened while a page renders in ``AppTest`` gets a progress handler that counts SQLite VM
instructions (``set_progress_handler``, one call per ``STEP_UNIT``). A page whose queries read a bounded number of
rows does about the same work over a store ten times the size; one that scans does ten times the work.
Used by tests/pages/test_page_work_bounded.py and bench/page_queries.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from streamlit.testing.v1 import AppTest

from tests.support.paths import REPO

PAGES = ("Live", "pages/requests/page.py", "pages/why/page.py", "pages/lab/page.py")
STEP_UNIT = 100  # the handler runs every STEP_UNIT VM instructions: fine enough for a page that reads a few rows


@contextmanager
def counted_connections(counter: list[int]) -> Iterator[None]:
    """While inside, every ``sqlite3.connect`` returns a connection whose VM steps add to ``counter[0]``
    (in units of ``STEP_UNIT``)."""
    real_connect = sqlite3.connect

    def tick() -> int:
        counter[0] += 1
        return 0  # 0: go on

    def connect(*args: object, **kwargs: object) -> sqlite3.Connection:
        conn = real_connect(*args, **kwargs)  # type: ignore[call-overload]
        conn.set_progress_handler(tick, STEP_UNIT)
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = real_connect


def page_steps(window: str, timeout_s: float = 120.0) -> dict[str, int]:
    """Each page's VM steps (in ``STEP_UNIT``s) for one script run over the store the environment names
    (``PHASEWATCH_DATA``, with ``PHASEWATCH_COLLECTOR=off``: set by the caller): Live rendered from app.py, then a
    switch to each other page, as a user clicks through them."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=timeout_s)
    at.session_state["pw_window"] = window
    out: dict[str, int] = {}
    for page in PAGES:
        counter = [0]
        with counted_connections(counter):
            if page == "Live":
                at.run()
            else:
                at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        out[page] = counter[0]
    return out

"""Phasewatch: ``streamlit run app.py``.

Starts the collector for the data folder when none runs (or the demo, with
``PHASEWATCH_DEMO=1`` or the "Start demo" button), draws the sidebar, then shows
the pages through ``st.navigation``. Pages only read the store.

This file plays two parts. ``streamlit run`` first imports it as a module (``__name__ == "app"``)
and finds ``app``, an ``st.App`` that serves this same file behind ``HostGuard`` (foreign Host
names get 403: see ``pages/host_guard.py``); every page run then executes it as ``__main__``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import streamlit as st

if __name__ != "__main__":  # imported by `streamlit run` (or uvicorn): the server, not a page run
    from starlette.middleware import Middleware

    from pages.host_guard import HostGuard

    app = st.App(__file__, middleware=[Middleware(HostGuard)])
    # Streamlit treats a pages/ folder as legacy pages until some session first runs st.navigation: the first
    # visit after the server starts listed every helper module in pages/ (fmt, live view...) as a clickable
    # page. Say from the start what st.navigation says on its first run; a Streamlit without this flag loses
    # only that (tests/e2e/test_deep_link.py).
    with contextlib.suppress(ImportError):
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
else:
    from collectors.api import LaunchStatus
    from pages import common, sidebar

    # An emoji icon becomes an inline SVG in the browser; a ":material/...:" icon is fetched from a font CDN.
    st.set_page_config(page_title="Phasewatch", page_icon="⏱️", layout="wide")

    ctx = common.app_context()
    problem = common.store_problem(ctx)  # a store the pages cannot read: said in words instead of the pages
    if problem is None:
        sidebar.render(ctx)
    if ctx.launch.state == LaunchStatus.STARTING:
        with st.sidebar:
            common.follow_start()

    HERE = Path(__file__).parent
    pages = [
        st.Page("pages/live.py", title="Live", icon=":material/monitoring:", default=True),
        st.Page("pages/requests.py", title="Requests", icon=":material/receipt_long:"),
    ]
    # The Why and Lab pages join here when their files exist.
    for file, title, icon in (("pages/why.py", "Why", ":material/lightbulb:"), ("pages/lab.py", "Lab", ":material/science:")):
        if (HERE / file).is_file():
            pages.append(st.Page(file, title=title, icon=icon))
    if os.environ.get("PHASEWATCH_PROMETHEUS", "").strip():  # several hosts, through Prometheus
        pages.append(st.Page("pages/hosts.py", title="Hosts", icon=":material/dns:"))
    navigation = st.navigation(pages)
    if problem is None:
        navigation.run()
    else:
        common.show_store_problem(ctx, problem)

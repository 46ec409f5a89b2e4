"""Phasewatch: ``streamlit run app.py``.

Starts the collector for the data folder when none runs (or the demo, with
``PHASEWATCH_DEMO=1`` or the "Start demo" button), draws the sidebar, then shows
the pages through ``st.navigation``. Pages only read the store.

This file plays two parts. ``streamlit run`` first imports it as a module (``__name__ == "app"``)
and finds ``app``, an ``st.App`` that serves this same file behind ``HostGuard`` (foreign Host
names get 403: see ``pages/shared/host_guard.py``) and forbids framing on every answer (clickjacking:
``pages/shared/frame_guard.py``); every page run then executes it as ``__main__``.
"""

from __future__ import annotations

import contextlib
import os

import streamlit as st

if __name__ != "__main__":  # imported by `streamlit run` (or uvicorn): the server, not a page run
    from starlette.middleware import Middleware

    from pages.shared.frame_guard import NoFraming
    from pages.shared.host_guard import HostGuard

    # NoFraming first (outermost), so that HostGuard's 403s say "no framing" too.
    app = st.App(__file__, middleware=[Middleware(NoFraming), Middleware(HostGuard)])
    # Streamlit runs a folder named pages/ beside the main script as a legacy multipage app until some session
    # first runs st.navigation: a deep link (/why) as the server's first visit then showed "Page not found"
    # before app.py's navigation took over. Say from the start what st.navigation says on its first run; a
    # Streamlit without this flag loses only that (tests/e2e/test_deep_link.py).
    with contextlib.suppress(ImportError):
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
else:
    from collectors.api import LaunchStatus
    from pages.shared import common, sidebar

    # An emoji icon becomes an inline SVG in the browser; a ":material/...:" icon is fetched from a font CDN.
    st.set_page_config(page_title="Phasewatch", page_icon="⏱️", layout="wide")

    ctx = common.app_context()
    problem = common.store_problem(ctx)  # a store the pages cannot read: said in words instead of the pages
    if problem is None:
        sidebar.render(ctx)
    if ctx.launch.state == LaunchStatus.STARTING:
        with st.sidebar:
            common.follow_start()

    # Live is the default page, which Streamlit serves at the app's root only: /live (a bookmark, a link) would
    # answer "Page not found". A hidden page at /live switches to it (tests/e2e/test_deep_link.py).
    live = st.Page("pages/live/page.py", title="Live", icon=":material/monitoring:", url_path="live-root", default=True)

    def open_live() -> None:
        st.switch_page(live)

    pages = [
        live,
        st.Page("pages/requests/page.py", title="Requests", icon=":material/receipt_long:", url_path="requests"),
        st.Page("pages/why/page.py", title="Why", icon=":material/lightbulb:", url_path="why"),
        st.Page("pages/lab/page.py", title="Lab", icon=":material/science:", url_path="lab"),
    ]
    if os.environ.get("PHASEWATCH_PROMETHEUS", "").strip():  # several hosts, through Prometheus
        pages.append(st.Page("pages/hosts/page.py", title="Hosts", icon=":material/dns:", url_path="hosts"))
    pages.append(st.Page(open_live, title="Live", url_path="live", visibility="hidden"))
    navigation = st.navigation(pages)
    if problem is None:
        navigation.run()
    else:
        common.show_store_problem(ctx, problem)

"""The empty state's offer: nothing is recorded yet, but Ollama's own log holds its history (docs/import-log.md)."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from collectors.api import LockHeldError, find_ollama_log, import_file, started_here
from pages.shared.common import AppContext
from store.queries import open_reader
from store.schema import StoreError

BUTTON_KEY = "pw_import_log"


def _nothing_recorded(db_path: Path) -> bool:
    with open_reader(db_path) as conn:
        return conn is not None and conn.execute("SELECT 1 FROM requests LIMIT 1").fetchone() is None


def offer_log_import(ctx: AppContext) -> None:
    """When the store holds no request and a readable Ollama log is found: offer to import it, with progress."""
    if ctx.demo or not _nothing_recorded(ctx.db_path):
        return
    log = find_ollama_log(os.environ, Path.home())
    if log is None:
        return
    data_dir = ctx.data_dir
    ours = started_here(data_dir)  # the app's own collector: stopped for the import, started again on the next run
    st.info(
        f"**Ollama's log holds history.** `{log}` ({log.stat().st_size / 1e6:,.1f} MB) has the generations Ollama "
        "served before Phasewatch recorded them, with the runner's own timings. Import them; none is recorded twice."
        + (" Recording pauses for the few seconds it takes." if ours else ""),
        icon=":material/history:",
    )
    if not st.button("Import history from Ollama's log", key=BUTTON_KEY):
        return
    bar = st.progress(0.0, text="Reading Ollama's log…")

    def show(done: int, size: int | None) -> None:
        bar.progress(min(1.0, done / size) if size else 0.0, text=f"Reading Ollama's log… {done / 1e6:,.0f} MB")

    try:
        result = import_file(data_dir, log, show, stop_collector_first=ours)
    except LockHeldError as exc:
        st.warning(f"{exc}; or run `python -m collectors.import_log --data {data_dir} {log}` once it is stopped.")
        return
    except (OSError, StoreError) as exc:
        st.error(f"The import stopped: {exc}")
        return
    bar.progress(1.0, text="Done")
    st.success(result.summary())

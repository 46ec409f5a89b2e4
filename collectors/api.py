"""What the pages may use of the collectors: the one module of ``collectors/`` that ``pages/`` imports.

- the collector and the demo: ``ensure_collector``/``ensure_demo`` start one for a data folder
  or find the one that runs (``LaunchState``); ``demo_runs``, ``start_demo``,
  ``start_demo_at_start`` and ``stop_demo`` (the demo is the server's, not a session's);
  ``engine_problem`` says why the demo cannot run the real llama.cpp engine here (None: it can);
- which process holds a data folder as its collector now (``collector_pid``);
- settings, read as ``python -m collectors`` reads them;
- history from Ollama's log (``find_ollama_log``, ``import_file``: docs/import-log.md), and whether the running
  collector is the one this server started (``started_here``: the import may stop it for a moment);
- Lab experiments (``EXPERIMENTS``, ``make_params``, ``Cost``); Lab runs: ``start_run``,
  ``is_alive``, ``exit_code``, ``log_tail``, ``cancel_run``, ``interrupted``; their documents
  (``ExperimentResult``, ``read_result``, ``list_results``) and the store's copies of them
  (``result_from_row``).

import-linter holds the line (``pyproject.toml``): a page that needs something else from
the collectors adds it here, on purpose. Nothing here opens a socket or imports Streamlit;
what starts is a detached process (``python -m collectors``, ``collectors.demo``, ``collectors.lab``).
"""

from __future__ import annotations

from pathlib import Path

from collectors.config import DEFAULT_LISTEN, SettingsError, default_data_dir, ollama_base_url, parse_listen
from collectors.demo import engine_problem
from collectors.import_log import ImportResult, find_ollama_log, import_file
from collectors.lab.experiments import EXPERIMENTS, Cost, ExperimentSpec, make_params
from collectors.lab.ingest import result_from_row
from collectors.lab.launcher import RunHandle, exit_code, interrupted, is_alive, log_tail, read_run, start_run
from collectors.lab.launcher import cancel as cancel_run
from collectors.lab.results import FINAL_STATES, ExperimentResult, ResultFileError, RunState, lab_dir, list_results, read_result
from collectors.launch import (
    LaunchState,
    LaunchStatus,
    demo_runs,
    ensure_collector,
    ensure_demo,
    start_demo,
    start_demo_at_start,
    started_here,
    stop_demo,
)
from collectors.lock import LockHeldError, read_lock

__all__ = [
    "DEFAULT_LISTEN",
    "EXPERIMENTS",
    "FINAL_STATES",
    "Cost",
    "ExperimentResult",
    "ExperimentSpec",
    "ImportResult",
    "LaunchState",
    "LaunchStatus",
    "LockHeldError",
    "ResultFileError",
    "RunHandle",
    "RunState",
    "SettingsError",
    "cancel_run",
    "collector_log",
    "collector_pid",
    "default_data_dir",
    "demo_runs",
    "engine_problem",
    "ensure_collector",
    "ensure_demo",
    "exit_code",
    "find_ollama_log",
    "import_file",
    "interrupted",
    "is_alive",
    "lab_dir",
    "list_results",
    "log_tail",
    "make_params",
    "ollama_base_url",
    "parse_listen",
    "read_result",
    "read_run",
    "result_from_row",
    "start_demo",
    "start_demo_at_start",
    "start_run",
    "started_here",
    "stop_demo",
]


def collector_log(data_dir: Path) -> str | None:
    """The Ollama log the collector of ``data_dir`` reads (a path, or the journal of a unit); None: none, or no
    collector runs."""
    info = read_lock(data_dir)
    return (info.ollama_log or None) if info is not None else None


def collector_pid(data_dir: Path) -> int | None:
    """The process that holds ``data_dir`` as its collector now (None: none does, or its lock names none)."""
    info = read_lock(data_dir)
    return info.pid if info is not None else None

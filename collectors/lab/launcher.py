"""Start, follow and cancel Lab runs as background processes (for the Lab page). Opens no sockets.

A run is ``python -m collectors.lab EXPERIMENT --ollama PROXY --model M --data DIR
--run-id ID``: it talks HTTP to the proxy (so its probes are recorded like any
other request) and keeps ``DIR/lab/ID.json`` up to date. The process is detached,
so a closed tab or a rerun does not stop it; cancelling sends it SIGTERM, which
closes its streams at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from collectors.lab.results import FINAL_STATES, RUNNING, ExperimentResult, lab_dir, read_result
from collectors.stopping import new_group_options

REPO_ROOT = Path(__file__).resolve().parents[2]

_lock = threading.Lock()
_children: dict[str, subprocess.Popen[bytes]] = {}  # reaped on every look, so no zombies pile up


@dataclass(frozen=True)
class RunHandle:
    run_id: str
    pid: int
    path: Path  # the run document
    log_path: Path  # the process's stderr


def command(
    experiment: str, ollama_url: str, model: str, data_dir: Path, run_id: str, params: dict[str, Any], num_ctx: int | None = None
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "collectors.lab",
        experiment,
        "--ollama",
        ollama_url,
        "--model",
        model,
        "--data",
        str(data_dir),
        "--run-id",
        run_id,
    ]
    for name, value in params.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    if num_ctx is not None:
        argv += ["--num-ctx", str(num_ctx)]
    return argv


def run_path(data_dir: Path, run_id: str) -> Path:
    """Where the run's process keeps its document (``DIR/lab/ID.json``)."""
    return lab_dir(data_dir) / f"{run_id}.json"


def read_run(data_dir: Path, run_id: str) -> ExperimentResult | None:
    """The run's document as its process last wrote it; None before it wrote one (raises ResultFileError when
    the file cannot be read as one)."""
    path = run_path(data_dir, run_id)
    return read_result(path) if path.exists() else None


def start_run(
    experiment: str, ollama_url: str, model: str, data_dir: Path, params: dict[str, Any], num_ctx: int | None = None
) -> RunHandle:
    run_id = uuid.uuid4().hex[:12]
    folder = lab_dir(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{run_id}.log"
    new_session, creationflags = new_group_options()  # a process group of its own, on every OS
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            command(experiment, ollama_url, model, data_dir, run_id, params, num_ctx),
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=new_session,
            creationflags=creationflags,
        )
    with _lock:
        _children[run_id] = child
    return RunHandle(run_id, child.pid, run_path(data_dir, run_id), log_path)


def reap() -> None:
    with _lock:
        for run_id, child in list(_children.items()):
            if child.poll() is not None:
                del _children[run_id]


def exit_code(run_id: str) -> int | None:
    """The exit code of a run this process started and that has ended; None otherwise."""
    with _lock:
        child = _children.get(run_id)
    return None if child is None else child.poll()


def is_alive(result: ExperimentResult) -> bool:
    """Whether the process behind a ``running`` document still runs (and is that run, not a reused pid)."""
    reap()
    if result.state in FINAL_STATES or result.pid is None:
        return False
    try:
        proc = psutil.Process(result.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "collectors.lab" in cmdline and result.run_id in cmdline


def cancel(result: ExperimentResult) -> bool:
    """Ask a running run to stop (SIGTERM: its streams close at once, its partial result is kept)."""
    if not is_alive(result):
        return False
    assert result.pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(result.pid, signal.SIGTERM)
        return True
    return False


def interrupted(result: ExperimentResult) -> bool:
    """A document still saying ``running`` whose process is gone (killed, machine restarted)."""
    return result.state == RUNNING and not is_alive(result)


def log_tail(data_dir: Path, run_id: str, n_lines: int = 5) -> str:
    try:
        lines = (lab_dir(data_dir) / f"{run_id}.log").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n_lines:])

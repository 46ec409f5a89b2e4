"""What several pages read from the store: its path and the status every page opens with (``store.queries``).

Every function opens the store read-only for one use and returns None when there is
no store yet, so a page can show its empty state instead of an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from analysis.records import (
    CollectorInfo,
    GpuSample,
    OllamaStatus,
)
from store import queries, sample_queries
from store.schema import db_path as _db_path


def db_path(data_dir: Path) -> Path:
    return _db_path(data_dir)


# Every function below reads through store.queries.open_reader: None while there is no store yet.
_open = queries.open_reader


@dataclass(frozen=True)
class Status:
    ollama: OllamaStatus | None = None
    heartbeat: CollectorInfo | None = None
    gpus: list[GpuSample] = field(default_factory=list)  # latest sample of each GPU
    store_exists: bool = False
    ollama_down_since_unix_s: float | None = None  # the first failed poll after the last answer (None: up, or unknown)


def load_status(db: Path, now_unix_s: float | None = None) -> Status:
    """Ollama's last poll, the collector's heartbeat and the GPUs it saw in the last minute."""
    import time

    now = time.time() if now_unix_s is None else now_unix_s
    with _open(db) as conn:
        if conn is None:
            return Status()
        latest: dict[int, GpuSample] = {}
        for s in sample_queries.gpu_samples(conn, now - 60, now + 5):
            latest[s.index] = s
        ollama = queries.latest_ollama_status(conn)
        return Status(
            ollama=ollama,
            heartbeat=queries.latest_heartbeat(conn),
            gpus=[latest[i] for i in sorted(latest)],
            store_exists=True,
            ollama_down_since_unix_s=queries.ollama_down_since(conn) if ollama is not None and not ollama.up else None,
        )

"""How many slots a model's runner has, best source first: the runner's command line (-np), its own start line
(``n_slots``), else OLLAMA_NUM_PARALLEL as Ollama's own start line printed it (the same for every model it loads).
None where nothing said it: then no wait is told as a queue for a slot (analysis.wait_split)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

from analysis.runner_wait_tasks import TaskWaits
from store import queries
from store.tables import OllamaSettingRow

NUM_PARALLEL = "OLLAMA_NUM_PARALLEL"
MAX_SLOTS = 256  # a setting beyond this is not a slot count anyone runs (Ollama's log is text anyone can write into)


def num_parallel_setting(settings: Sequence[OllamaSettingRow]) -> int | None:
    """OLLAMA_NUM_PARALLEL from Ollama's newest start line; None when unset, 0 (Ollama's own default then) or odd."""
    rows = sorted((r for r in settings if r.name == NUM_PARALLEL), key=lambda r: r.ts_unix_s)
    if not rows:
        return None
    value = rows[-1].value.strip()
    # ASCII digits only: str.isdigit also takes "１" and "²", which Go's strconv.Atoi (Ollama's own reading) does not.
    if re.fullmatch(r"[0-9]{1,4}", value) is None:
        return None
    return int(value) if 1 <= int(value) <= MAX_SLOTS else None


def slot_count(
    conn: sqlite3.Connection, model: str, waits: TaskWaits | None = None, settings: Sequence[OllamaSettingRow] | None = None
) -> int | None:
    runner = queries.runner_for(conn, model, None)
    if runner is not None and runner.parallel:
        return runner.parallel
    if waits is not None and waits.n_slots:
        return waits.n_slots
    return num_parallel_setting(queries.ollama_settings(conn) if settings is None else settings)

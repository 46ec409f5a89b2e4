"""Copy the Lab's run documents (``<data>/lab/*.json``) into the store's experiments table.

Only the collector writes the store; a Lab run is a separate process that talks
HTTP to the proxy and keeps its result in a file. The collector calls
:meth:`LabIngester.poll` on its tick, which stores every new or changed document
(``INSERT OR REPLACE`` by run id, so repeating is harmless). Runs then live under
the store's retention with everything else, and the Lab page can compare them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from collectors.lab.results import ExperimentResult, ResultFileError, lab_dir, read_result
from store.tables import ExperimentRow


class ExperimentSink(Protocol):
    """``StoreWriter.write_experiment`` and ``BackgroundWriter.submit_experiment`` both fit."""

    def __call__(
        self,
        id: str,
        kind: str,
        params: Mapping[str, Any],
        started_at_unix_s: float,
        status: str,
        ended_at_unix_s: float | None = None,
        results: Any = None,
    ) -> None: ...


def store_row(r: ExperimentResult) -> dict[str, Any]:
    """The experiments-table row for one run: everything but the parameters goes in ``results``."""
    doc = r.to_json_dict()
    params = doc.pop("parameters")
    for k in ("run_id", "name", "state", "started_at_unix_s", "finished_at_unix_s"):
        doc.pop(k)
    return {
        "id": r.run_id,
        "kind": r.name,
        "params": params,
        "started_at_unix_s": r.started_at_unix_s,
        "status": r.state,
        "ended_at_unix_s": r.finished_at_unix_s,
        "results": doc,
    }


def result_from_row(row: ExperimentRow) -> ExperimentResult:
    """Inverse of :func:`store_row`, from the store's experiments table."""
    results = dict(row.results or {})
    return ExperimentResult.from_json_dict(
        {
            **results,
            "run_id": row.id,
            "name": row.kind,
            "state": row.status,
            "parameters": row.params or {},
            "started_at_unix_s": row.started_at_unix_s,
            "finished_at_unix_s": row.ended_at_unix_s,
            "model": results.get("model", "?"),
            "ollama_url": results.get("ollama_url", "?"),
        }
    )


class LabIngester:
    """Remembers each file's modification time, so a tick only stores what changed."""

    def __init__(self, data_dir: str | os.PathLike[str], sink: ExperimentSink) -> None:
        self.folder = lab_dir(data_dir)
        self.sink = sink
        self._seen: dict[Path, int] = {}

    def poll(self) -> int:
        """Store new or changed run documents; returns how many. Unreadable files are skipped."""
        if not self.folder.is_dir():
            return 0
        stored = 0
        for path in sorted(self.folder.glob("*.json")):
            try:
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            if self._seen.get(path) == mtime:
                continue
            try:
                result = read_result(path)
            except ResultFileError:
                continue  # half-written files cannot exist (atomic rename); anything else is not ours
            self.sink(**store_row(result))
            self._seen[path] = mtime
            stored += 1
        return stored

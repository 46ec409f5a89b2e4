"""The Lab's result document: what one experiment run measured, as plain JSON.

Pure data and file helpers, no sockets: the Lab page imports this module to
read runs. A run is one JSON file ``<data>/lab/<run_id>.json``; the runner
rewrites it atomically after every point, so a reader always sees either the
previous or the next complete document, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

SCHEMA = 1
LAB_DIRNAME = "lab"


class RunState(StrEnum):
    """States of a run document (stored as these strings in the file and the store)."""

    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    FAILED = "failed"


RUNNING, DONE, CANCELLED = RunState.RUNNING, RunState.DONE, RunState.CANCELLED
TIMED_OUT, FAILED = RunState.TIMED_OUT, RunState.FAILED
FINAL_STATES = frozenset({DONE, CANCELLED, TIMED_OUT, FAILED})


class ResultFileError(ValueError):
    """A run file that cannot be read as a result document."""


@dataclass
class Progress:
    done: int = 0
    total: int = 0
    message: str = ""

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total > 0 else 0.0


@dataclass
class ExperimentResult:
    """One run of one experiment. Point keys carry their units (``prefill_tok_s``, ``ttft_s``)."""

    name: str
    run_id: str
    model: str
    ollama_url: str
    parameters: dict[str, Any]
    started_at_unix_s: float
    state: RunState = RUNNING
    points: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)  # the key figures the conclusion is built from
    conclusion: str = ""
    finished_at_unix_s: float | None = None
    error: str | None = None
    server_version: str | None = None
    model_facts: dict[str, Any] = field(default_factory=dict)  # from /api/show and /api/tags, for ceilings
    progress: Progress = field(default_factory=Progress)
    pid: int | None = None  # the runner process, so a page can cancel it
    schema: int = SCHEMA

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> ExperimentResult:
        try:
            prog = data.get("progress") or {}
            return cls(
                name=str(data["name"]),
                run_id=str(data["run_id"]),
                model=str(data["model"]),
                ollama_url=str(data["ollama_url"]),
                parameters=dict(data.get("parameters") or {}),
                started_at_unix_s=float(data["started_at_unix_s"]),
                state=RunState(data.get("state", RUNNING)),
                points=[dict(p) for p in data.get("points") or []],
                summary=dict(data.get("summary") or {}),
                conclusion=str(data.get("conclusion") or ""),
                finished_at_unix_s=_opt_float(data.get("finished_at_unix_s")),
                error=data.get("error"),
                server_version=data.get("server_version"),
                model_facts=dict(data.get("model_facts") or {}),
                progress=Progress(int(prog.get("done", 0)), int(prog.get("total", 0)), str(prog.get("message", ""))),
                pid=data.get("pid"),
                schema=int(data.get("schema", SCHEMA)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultFileError(f"not a Lab result document: {exc!r}") from exc


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def lab_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / LAB_DIRNAME


def write_result(path: str | os.PathLike[str], result: ExperimentResult) -> None:
    """Write the document atomically (temp file in the same folder, then rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result.to_json_dict(), f, indent=1)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_result(path: str | os.PathLike[str]) -> ExperimentResult:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultFileError(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ResultFileError(f"{path}: not a JSON object")
    return ExperimentResult.from_json_dict(data)


def list_results(data_dir: str | os.PathLike[str]) -> list[ExperimentResult]:
    """Every readable run in ``<data>/lab``, newest first. Unreadable files are skipped, not fatal."""
    folder = lab_dir(data_dir)
    if not folder.is_dir():
        return []
    out: list[ExperimentResult] = []
    for p in folder.glob("*.json"):
        try:
            out.append(read_result(p))
        except ResultFileError:
            continue
    out.sort(key=lambda r: r.started_at_unix_s, reverse=True)
    return out

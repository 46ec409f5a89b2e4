"""What ``RunnerReader`` (``collectors.ollama.runners``) keeps: each runner found, each in-flight request it reads,
each runner start Ollama's log told of, and the state its parts share (``ReaderState``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from analysis.records import LoadedModel, ProgressSample, RequestRecord
from analysis.runner_placement import PlacementReader
from analysis.runner_wait_fold import WaitJoiner
from analysis.runner_wait_tasks import RequestWaitsRow
from collectors.ollama.direct import DirectTasks
from collectors.ollama.discovery import Runner
from collectors.ollama.log import LogSource
from collectors.ollama.log_watch import LogNotices
from collectors.ollama.mlx_direct import MlxDirect
from collectors.ollama.slots import SlotReading

# Readings kept per in-flight request, to give them the prompt's size once it is known (or raised: a
# reading racing the last batch can read it low, and the next one corrects it). A prefill reading is new only
# when a batch ends, so a 128k prompt in 512-token batches needs 256; decode readings come every poll, so
# only the latest few are kept. Past these, the oldest are let go: they stay in the store with the size they
# had, and the finished request's own count fills it in.
MAX_PREFILL_ROWS_KEPT = 1024
MAX_DECODE_ROWS_KEPT = 8


@dataclass
class RunnerState:
    runner: Runner
    digest: str | None = None
    model: str | None = None  # /api/ps name of the model it serves, once matched
    slots: list[SlotReading] = field(default_factory=list)
    problem: str | None = None
    next_poll_s: float = 0.0  # monotonic
    polling: bool = False
    started_unix_s: float | None = None  # when its process started (psutil), to confirm a start sequence as its own

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self.runner)
        out.update(
            digest=self.digest,
            model=self.model,
            problem=self.problem,
            slots=[asdict(s) for s in self.slots],
        )
        return out


@dataclass
class Track:
    """What the reader knows of one in-flight request."""

    request_id: str
    prompt_tokens: int | None = None
    exact: bool = False  # prompt_tokens read from /slots after decoding began (not from a log fraction)
    last_key: tuple[Any, ...] | None = None
    # rows written, as last written: prefill ones and the latest decode ones (bounded, see above)
    prefill_rows: deque[ProgressSample] = field(default_factory=lambda: deque(maxlen=MAX_PREFILL_ROWS_KEPT))
    decode_rows: deque[ProgressSample] = field(default_factory=lambda: deque(maxlen=MAX_DECODE_ROWS_KEPT))


@dataclass
class StartSequence:
    """A runner's start as Ollama's log tells it: from Ollama's ``starting llama-server`` line (its port) to the
    runner's own listening line (or Ollama's "started in"); its load lines fold into ``reader``."""

    port: int
    read_unix_s: float  # when its start line was read
    reader: PlacementReader = field(default_factory=PlacementReader)
    up: bool = False  # the runner said it listens: no load line after this is its


def process_started_unix_s(pid: int) -> float | None:
    """When process ``pid`` started (its creation time, as the OS keeps it); None when it cannot be read."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def model_of(digest: str | None, models: Sequence[LoadedModel]) -> str | None:
    """The /api/ps name of the loaded model with this weights digest (None: not loaded, or not known)."""
    if not digest:
        return None
    for m in models:
        if m.digest == digest or m.digest.removeprefix("sha256:") == digest:
            return m.name
    return None


class ReaderState:
    """The state ``RunnerReader.__init__`` sets up and its parts share (``runner_loads``, ``runner_join``,
    ``runner_log``, each a base class of the reader): declared here so that each part is typed on its own."""

    runners: dict[int, RunnerState]  # by pid
    direct: DirectTasks
    mlx: MlxDirect
    errors: int
    _clock: Callable[[], float]
    _in_flight: Callable[[], Sequence[RequestRecord]]
    _look_now: bool
    # joining /slots readings to requests
    _tasks: dict[tuple[int, int], str]
    _tracks: dict[str, Track]
    _queue: list[ProgressSample]
    claims_by_order: int
    # Ollama's log
    _log: LogSource | None
    _log_problem: str | None
    _log_read: asyncio.Future[None] | None
    log_notices: LogNotices
    _log_read_to_end_s: float | None
    _active_s: float
    _generations_without_runner_lines: int
    runner_lines_missing: str | None
    log_lines_dropped: int
    _mlx_answered: set[int]
    _mlx_out: list[RequestRecord]
    # placements and waits
    placements: dict[int, PlacementReader]
    _placement_pid: dict[int, int]
    _sequences: deque[StartSequence]
    _loading_port: int | None
    load_lines_dropped: int
    _waits: dict[int | None, WaitJoiner]
    _waits_unjoined: dict[tuple[int | None, int], float]
    _waits_queue: dict[str, RequestWaitsRow]
    wait_lines_dropped: int

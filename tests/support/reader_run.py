"""Run a ``RunnerReader`` for a while on its own loop and collect what it queued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from analysis.records import LoadedModel, ProgressSample, RequestRecord
from collectors.ollama.poller import parse_ps
from collectors.ollama.runners import RunnerReader


def in_flight_record(rid: str, model: str, started_unix_s: float | None = None) -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=started_unix_s or time.time(),
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model=model,
        stream=True,
        received_ns=time.monotonic_ns(),
    )


def loaded(ps_models: list[dict[str, object]]) -> list[LoadedModel]:
    return parse_ps({"models": ps_models}, time.time())


@dataclass
class ReaderRun:
    reader: RunnerReader
    samples: list[ProgressSample] = field(default_factory=list)
    task_done_early: bool = False
    work_result: object = None


async def run_reader(
    ollama_url: str,
    *,
    in_flight: Callable[[], Sequence[RequestRecord]],
    models: Sequence[LoadedModel],
    seconds: float,
    log_path: Path | None = None,
    until: Callable[[ReaderRun], bool] | None = None,
    work: Callable[[], object] | None = None,
    on_drain: Callable[[ReaderRun], None] | None = None,
    linger_s: float = 1.5,
) -> ReaderRun:
    """Run the reader ``seconds`` (or until ``until`` says so, or ``linger_s`` after ``work``, run in a thread, returned),
    draining its rows every 0.1 s as the service does; ``on_drain`` sees the rows so far after each drain."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        reader = RunnerReader(
            ollama_url, session, in_flight=in_flight, loaded_models=lambda: models, log_path=log_path, discover_every_s=0.5
        )
        run = ReaderRun(reader)
        stop = asyncio.Event()
        task = asyncio.create_task(reader.run(stop))
        worker = asyncio.create_task(asyncio.to_thread(work)) if work is not None else None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            run.samples.extend(reader.drain())
            if on_drain is not None:
                on_drain(run)
            if worker is not None and worker.done():
                deadline = min(deadline, time.monotonic() + linger_s)
            if task.done():
                run.task_done_early = True
                break
            if until is not None and until(run):
                break
        stop.set()
        await asyncio.wait_for(task, 10)
        if worker is not None:
            run.work_result = await worker  # its exception, if any, is the test's
        run.samples.extend(reader.drain())
        return run

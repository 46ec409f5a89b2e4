"""Discovery costs what it must (issue 33): with a process watch, the timer's round is skipped while no runner
process came or went, so the socket table (``/proc/net/tcp``) is not read again; a round reads it once; and a
runner process that appears is still found at the next look. Real child processes, a real Ollama stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path

import aiohttp
import pytest

from collectors.ollama import discovery
from collectors.ollama.discovery import Discoverer, Discovery, ProcessWatch, RunnerSet
from collectors.ollama.runners import RunnerReader
from tests.support.reader_run import loaded
from tests.support.runner_process import OllamaStandIn, ps_entry, start_bad_runner
from tests.support.waiting import wait_until_async

MODEL = "gemma3:270m"
DIGEST = "cd" * 32
EVERY_S = 0.5  # the reader's timer (10 s in the collector): a quiet window of QUIET_S holds many of its periods
QUIET_S = 4.0
FOUND_WITHIN_S = 15.0  # a runner that appears is found at the next period; wide for a loaded machine


class RecordingWatch(ProcessWatch):
    """The process watch, remembering what it answered (another user of this machine may start runners too)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[RunnerSet] = []

    def runner_set(self) -> RunnerSet:
        answer = super().runner_set()
        self.answers.append(answer)
        return answer


def _changes(answers: list[RunnerSet]) -> int:
    return sum(a != b for a, b in itertools.pairwise(answers))


@pytest.mark.slow
def test_no_round_while_no_runner_came_or_went_and_a_new_one_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_file = tmp_path / f"sha256-{DIGEST}"  # Ollama's blob name: the digest without hashing
    model_file.write_bytes(b"GGUF")
    table_reads: list[float] = []
    read_table = discovery.listening_sockets

    def counted_table(proc_root: Path = Path("/proc")) -> list[discovery.Listener] | None:
        table_reads.append(0.0)
        return read_table(proc_root)

    monkeypatch.setattr(discovery, "listening_sockets", counted_table)
    rounds: list[Discovery] = []
    discoverer = Discoverer()

    def discover(url: str) -> Discovery:
        found = discoverer(url)
        rounds.append(found)
        return found

    watch = RecordingWatch()
    models = loaded([ps_entry(MODEL, DIGEST)])

    async def scenario(ollama: OllamaStandIn, first_pid: int, stack: contextlib.ExitStack) -> None:
        async with aiohttp.ClientSession(trust_env=False) as session:
            reader = RunnerReader(
                ollama.base_url,
                session,
                in_flight=list,
                loaded_models=lambda: models,
                discover_every_s=EVERY_S,
                discover=discover,
                watch=watch,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(reader.run(stop))
            try:
                await wait_until_async(lambda: first_pid in reader.runners, 30.0, "the first runner found")
                rounds_before, answers_before = len(rounds), len(watch.answers)
                await asyncio.sleep(QUIET_S)
                quiet = rounds[rounds_before:]
                answers = watch.answers[max(answers_before - 1, 0) :]
                rechecks = sum(r.recheck for r in rounds[rounds_before - 1 :])
                # Without the watch the timer ran a round every EVERY_S: QUIET_S / EVERY_S rounds here. With it,
                # a round only where the runner processes changed (another user's, on a shared machine) or the
                # last answer could change without one (a runner not listening yet).
                assert len(answers) >= 2, "the timer did not ask the process watch"
                assert len(quiet) <= _changes(answers) + rechecks, (len(quiet), _changes(answers), rechecks)
                assert len(table_reads) == len(rounds), "a round reads the socket table once"
                second = await asyncio.to_thread(stack.enter_context, start_bad_runner("good", model_file))
                await wait_until_async(lambda: second.proc.pid in reader.runners, FOUND_WITHIN_S, "the new runner found")
            finally:
                stop.set()
                await asyncio.wait_for(task, 10)

    with (
        contextlib.ExitStack() as stack,
        OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama,
        start_bad_runner("good", model_file) as first,
    ):
        asyncio.run(scenario(ollama, first.proc.pid, stack))

"""A cloud model's request (issue 41: run on ollama.com, no local runner ever serves it) is not waited on by the
runner reader: it sends no look for a runner for its model (a local model's request with no runner found does, every
``REDISCOVER_BUSY_S``), and a runner's new task is never claimed by it, even a runner serving the model of the same
base name."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import aiohttp
import pytest

from collectors.ollama.discovery import Discovery, Runner
from collectors.ollama.runner_state import RunnerState
from collectors.ollama.runners import REDISCOVER_BUSY_S, RunnerReader
from collectors.ollama.slots import SlotReading
from tests.support.reader_run import in_flight_record

CLOUD = "gpt-oss:120b-cloud"
LOCAL = "gpt-oss:120b"  # the same model run here: its runner is not the cloud model's
# A local request without a runner would send three looks in this time (two at least on a loaded machine).
WATCH_S = 3.5 * REDISCOVER_BUSY_S


def discovery_rounds(model: str) -> int:
    """Looks for runners while one request of ``model`` is in flight for ``WATCH_S`` (the timer's own round: an hour)."""
    rounds: list[float] = []

    def discover(_: str) -> Discovery:
        rounds.append(time.monotonic())
        return Discovery(runners=[])

    async def scenario() -> None:
        async with aiohttp.ClientSession(trust_env=False) as session:
            request = in_flight_record("r1", model)
            reader = RunnerReader(
                "http://127.0.0.1:1",
                session,
                in_flight=lambda: [request],
                loaded_models=list,
                discover_every_s=3600.0,
                discover=discover,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(reader.run(stop))
            await asyncio.sleep(WATCH_S)
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    return len(rounds)


@pytest.mark.slow  # two readers watched for WATCH_S each
def test_a_cloud_request_sends_no_look_for_a_runner() -> None:
    assert discovery_rounds(LOCAL) >= 2  # the look a local request without a runner gets: the test can see it
    assert discovery_rounds(CLOUD) == 1  # the reader's first round only


def test_a_cloud_request_claims_no_task_of_a_local_runner() -> None:
    reader = RunnerReader("http://127.0.0.1:1", cast(Any, None), in_flight=list, loaded_models=list, clock=lambda: 0.0)
    state = RunnerState(Runner(100, 4000, "/m.gguf"), model=LOCAL)
    reader.runners[100] = state
    cloud = in_flight_record("cloud", CLOUD, started_unix_s=1.0)
    busy = [SlotReading(0, 8192, True, 7, 0, 12, 0, 0)]
    reader._join(state, busy, [cloud], 2.0)
    assert reader._tasks == {}  # left to the direct side: the cloud request is not this runner's
    local = in_flight_record("local", LOCAL, started_unix_s=1.5)
    reader._join(state, [SlotReading(0, 8192, True, 8, 0, 12, 0, 0)], [cloud, local], 3.0)
    assert reader._tasks == {(100, 8): "local"}

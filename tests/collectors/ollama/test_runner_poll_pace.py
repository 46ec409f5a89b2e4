"""The runner reader reads a slot reading a proxied request's prompt at the prefill pace (8 Hz).

Its next poll was counted from the end of the last one, which fell just after the reader's next step (steps came
every busy interval): /slots was read every 0.5 s, not 4 times a second, and each prefill reading came up to
0.5 s after the batch it shows, which the ETA extrapolates over the rest of the prompt (a CI run missed its 30%
bound that way). A real child process named ``llama-server`` on loopback, read by the real reader; its one slot
is reading a prompt (512 of 1,024 tokens, nothing decoded).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from collectors.ollama.runners import PREFILL_INTERVAL_S
from tests.support.reader_run import ReaderRun, in_flight_record, loaded, run_reader
from tests.support.runner_process import OllamaStandIn, ps_entry, start_bad_runner

MODEL = "gemma3:270m"
DIGEST = "ef" * 32
READ_S = 4.0
# 8 Hz reads 32 times in 4 s (the old pace 8 times). A loaded machine delays the reader's timers by some
# milliseconds each, not by whole intervals: three quarters of the pace is the floor.
MIN_POLLS_PER_S = 0.75 / PREFILL_INTERVAL_S


def test_a_prompt_being_read_is_read_at_the_prefill_pace(tmp_path: Path) -> None:
    model_file = tmp_path / f"sha256-{DIGEST}"
    model_file.write_bytes(b"GGUF")
    request = in_flight_record("r1", MODEL)
    counts: list[tuple[float, int]] = []  # (time, polls so far), from the first poll on

    def count(run: ReaderRun) -> None:
        if run.reader.polls:
            counts.append((time.monotonic(), run.reader.polls))

    with OllamaStandIn([ps_entry(MODEL, DIGEST)]) as ollama, start_bad_runner("good", model_file):
        run = asyncio.run(
            run_reader(
                ollama.base_url,
                in_flight=lambda: [request],
                models=loaded(ollama.models),
                seconds=60,
                on_drain=count,
                until=lambda _run: bool(counts) and counts[-1][0] - counts[0][0] >= READ_S,
            )
        )
    assert run.reader.errors == 0 and run.samples, "the busy slot was joined to the request and read"
    (t0, n0), (t1, n1) = counts[0], counts[-1]
    rate = (n1 - n0) / (t1 - t0)
    print(f"\n{n1 - n0} polls in {t1 - t0:.2f} s: {rate:.2f} per second (prefill interval {PREFILL_INTERVAL_S} s)")
    assert rate >= MIN_POLLS_PER_S

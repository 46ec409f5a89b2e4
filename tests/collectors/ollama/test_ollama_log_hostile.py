"""Ollama's log written by someone hostile (issue 29): anyone who can reach the runner's port can have text of
their choosing copied into it (an invalid grammar is echoed verbatim). No line stalls the collector, no line
grows its memory, no number overflows, and a runner, access or load line counts only in its exact form from
its first character, never as a fragment inside another line."""

from __future__ import annotations

import asyncio
import json
import math
import time
import tracemalloc
from pathlib import Path

import aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.ollama.discovery import Discovery
from collectors.ollama.journal import JournalTail
from collectors.ollama.log import MAX_LOG_LINE_CHARS, LogEvent, LogTail, parse_line
from collectors.ollama.runners import RunnerReader

SLOT = "slot print_timing: id  0 | task 5 | "
# Fragments of every line the parser reads: repeated within one line they made the old patterns' stacked lazy
# wildcards cost cubic time (a 14 KB line: 10.7 s on the loop that relays every proxied request).
FRAGMENTS = [
    "id 0 | task 0 | new prompt, ",
    "id 0 | task 0 | processing ",
    "id 0 | task 0 | stop processing: ",
    "id 0 | task 0 | prompt processing, n_tokens = 1, ",
    "id 0 | task 0 | prompt processing done, ",
    "id 0 | task 0 | eval time = 1 ms / ",
    "starting llama-server --port ",
    "llama runner started in ",
    "[GIN] 2026/06/12 - 22:48:16 | 200 | 1s | ",
]
# A line that stalls must not take this long (the parser takes microseconds; the old one took seconds).
LINE_BUDGET_S = 0.25


def repeated(fragment: str, chars: int, prefix: str = "") -> str:
    return (prefix + fragment * (chars // len(fragment) + 1))[:chars]


def test_lines_of_repeated_fragments_parse_in_bounded_time() -> None:
    lines = [
        repeated(fragment, chars, prefix)
        for fragment in FRAGMENTS
        for prefix in ("", SLOT, 'time=2026-06-12T22:48:14.120Z level=INFO source=x.go:1 msg="')
        for chars in (MAX_LOG_LINE_CHARS - 16, 14 * 1024, 28 * 1024)
    ]
    for line in lines:  # the shortest first: the old parser failed on the first, in seconds rather than minutes
        start = time.perf_counter()
        assert parse_line(line, 1.0) is None
        took_s = time.perf_counter() - start
        assert took_s < LINE_BUDGET_S, f"{line[:40]!r}… ({len(line)} characters) took {took_s:.3f} s"


def endless(path: Path, total_bytes: int) -> None:
    chunk = b"x" * (1 << 20)
    with path.open("ab") as f:
        for _ in range(total_bytes // len(chunk)):
            f.write(chunk)


def test_the_tail_drops_an_endless_line_and_keeps_its_memory(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("")
    tail = LogTail(log)
    assert tail.read(1.0) == []
    total_bytes = 48 << 20
    endless(log, total_bytes)  # 48 MB and no end yet
    tracemalloc.start()
    try:
        for _ in range(total_bytes // LogTail.MAX_READ_BYTES + 1):
            assert tail.read(2.0) == []
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 8 * LogTail.MAX_READ_BYTES, f"reading it held {peak_bytes / 1e6:.0f} MB at once"
    with log.open("a") as f:  # its end, then a real line
        f.write("yyy\n" + SLOT + "prompt processing, n_tokens = 512, progress = 0.25\n")
    assert [(e.kind, e.tokens) for e in tail.read(3.0)] == [("progress", 512)], "its rest is not a line of its own"
    assert tail.long_lines == 1 and tail.unknown_lines == 1
    with log.open("a") as f:  # an over-long line written whole, between two real ones
        f.write(SLOT + "eval time = 1.00 ms / 2 tokens\n" + "z" * (MAX_LOG_LINE_CHARS + 1) + "\n")
        f.write(SLOT + "eval time = 3.00 ms / 4 tokens\n")
    assert [e.tokens for e in tail.read(4.0)] == [2, 4]
    assert tail.long_lines == 2 and tail.unknown_lines == 2


def test_numbers_that_are_not_finite_or_beyond_any_reading_are_refused() -> None:
    huge = "9" * 400  # float() of it is inf
    for line in [
        SLOT + f"prompt eval time = {huge} ms / 10 tokens (1 ms per token, 1 tokens per second)",
        SLOT + f"       eval time = {huge}.5 ms / 10 tokens",
        SLOT + "       eval time = 999999999999.00 ms / 10 tokens",  # 31 years
        SLOT + f"prompt processing, n_tokens = {'9' * 5000}, progress = 0.5",  # int() refuses 5,000 digits
        SLOT + f"prompt processing, n_tokens = 10, progress = {huge}",
        SLOT + f"stop processing: n_tokens = {'9' * 30}, truncated = 0",
        f'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama-server started in {huge} seconds"',
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:1362 msg="llama runner started in 86400000.00 seconds"',
        f'[GIN] 2026/06/12 - 22:48:16 | 200 | {"9" * 20}h | 10.0.0.7 | POST     "/api/chat"',
    ]:
        event = parse_line(line, 1.0)
        assert event is None, (line[:80], event)
    for line in [SLOT + "prompt eval time = 1e999 ms / 1 tokens", SLOT + "eval time = inf ms / 1 tokens"]:
        assert parse_line(line, 1.0) is None


def test_fragments_inside_other_lines_are_not_read() -> None:
    """Text a client had echoed into the log (an invalid grammar, a pattern), with a line's words inside it."""
    forged = [
        # a grammar error echo with a timing inside: would rewrite another client's record
        "parse: error parsing grammar: expecting name at slot print_timing: id  0 | task 5 |        eval time = "
        "99999.00 ms /  9999 tokens (  10.00 ms per token,  99.99 tokens per second)",
        "srv  params_from_: " + SLOT + "prompt eval time =       1.00 ms /     1 tokens",
        "E srv  params_from_: grammar: slot      release: id  0 | task 5 | stop processing: n_tokens = 9999, truncated = 0",
        "root ::= slot update_slots: id  0 | task 5 | prompt processing progress, n_tokens = 999999, progress = 0.5",
        "x slot   operator(): id  0 | task 5 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 999999",
        "x slot launch_slot_: id  0 | task 5 | processing task, is_child = 0",
        # a load line inside another message: would switch the log's figures off (a runner on port 1 never found)
        'time=2026-06-12T22:48:14.120+02:00 level=WARN source=server.go:1 msg="bad grammar: starting llama-server '
        '--model /m --port 1"',
        'time=2026-06-12T22:48:14.120Z level=INFO source=server.go:1 msg="echo" cmd="starting llama-server --port 1"',
        'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:431 msg="starting llama-server" '
        'cmd="/b/llama-server --port 40123 --port 1"',  # two ports: not a command line to believe
        # a day of load from a message that only contains the words
        'time=2026-06-12T22:48:14.120Z level=INFO source=x.go:1 msg="request: llama runner started in 86399.00 seconds"',
        "grammar: llama-server started in 86399.00 seconds",
        # an access line inside another, or with text after its path
        'srv  log_server_r: [GIN] 2026/06/12 - 22:48:16 | 200 |     26.1s |       10.0.0.9 | POST     "/api/chat"',
        '[GIN] 2026/06/12 - 22:48:16 | 200 |     26.1s |       10.0.0.9 | POST     "/api/chat" | 10.0.0.7 "x"',
        '[GIN] 2026/06/12 - 22:48:16 | 200 |     26.1s |       10.0.0.9 | POST     "/api/chat" x"',
    ]
    for line in forged:
        assert parse_line(line, 1.0) is None, line
    # The same lines in their own form are read: the rule is the form, not the words.
    real: list[tuple[str, str]] = [
        (SLOT + "       eval time =   99999.00 ms /  9999 tokens (  10.00 ms per token,  99.99 tokens per second)", "eval"),
        ("slot      release: id  0 | task 5 | stop processing: n_tokens = 9999, truncated = 0", "release"),
        ("0.09.894.504 I slot launch_slot_: id  0 | task 5 | processing task, is_child = 0", "launch"),
        (
            'time=2026-06-12T22:48:14.120Z level=INFO source=llama_server.go:431 msg="starting llama-server" '
            'cmd="/b/llama-server --model /m --port 40123 -np 2"',
            "runner_start",
        ),
        (
            'time=2026-06-12T22:48:14.120Z level=INFO source=server.go:1 msg="llama runner started in 2.31 seconds"',
            "runner_started",
        ),
        ('[GIN] 2026/06/12 - 22:48:16 | 200 |     26.1s |       10.0.0.9 | POST     "/api/chat"', "access"),
        ('[GIN] 2026/06/12 - 22:48:16 | 404 |      1.2ms |       10.0.0.9 | GET      "/a\\"b"', "access"),
    ]
    for line, kind in real:
        event = parse_line(line, 1.0)
        assert event is not None and event.kind == kind, line
    start = parse_line(real[3][0], 1.0)
    assert start is not None and start.port == 40123
    launch = parse_line(real[2][0], 1.0)
    assert launch is not None and (launch.slot_id, launch.task_id) == (0, 5), "what /slots confirms a line against"


@settings(max_examples=300, deadline=None)
@given(
    # runs of one fragment (the shape that cost cubic time), mixed with the characters the patterns split on
    st.lists(
        st.tuples(st.sampled_from([*FRAGMENTS, " ", "|", "=", ",", "0", "\\", '"', "(", "1.5 ms"]), st.integers(1, 400)),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["", SLOT, "0.00.001.410 I " + SLOT, "[GIN] ", 'time=2026-06-12T22:48:14.120Z level=INFO source=x msg="']),
)
def test_fuzzed_lines_parse_within_a_time_budget(runs: list[tuple[str, int]], prefix: str) -> None:
    parts = [fragment * count for fragment, count in runs]
    line = prefix + "".join(parts)
    start = time.perf_counter()
    event = parse_line(line, 1.0)
    took_s = time.perf_counter() - start
    assert took_s < LINE_BUDGET_S, f"{len(line)} characters took {took_s:.3f} s"
    if event is not None:
        assert event.tokens >= 0
        for value in (event.duration_ms, event.fraction, event.access.latency_s if event.access else None):
            assert value is None or math.isfinite(value)


class SlowLog(LogTail):
    """A log whose every read takes READ_S: a flood of lines up to a read's cap, or a slow disk."""

    READ_S = 1.0

    def read(self, now_unix_s: float) -> list[LogEvent]:
        time.sleep(self.READ_S)
        return super().read(now_unix_s)


def test_the_log_is_read_off_the_loop_that_relays_the_proxy(tmp_path: Path) -> None:
    """The proxy relays on the collector's one loop: a log read must never hold it."""

    async def run() -> float:
        async with aiohttp.ClientSession() as session:
            reader = RunnerReader(
                "http://127.0.0.1:9",
                session,
                in_flight=list,
                loaded_models=list,
                log_source=SlowLog(tmp_path / "ollama.log"),
                discover=lambda _url: Discovery([]),
            )
            stop = asyncio.Event()
            task = asyncio.create_task(reader.run(stop))
            worst_gap_s, last = 0.0, time.monotonic()
            end = last + 2.5 * SlowLog.READ_S
            while time.monotonic() < end:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst_gap_s, last = max(worst_gap_s, now - last), now
            stop.set()
            await asyncio.wait_for(task, 10)
            return worst_gap_s

    worst_gap_s = asyncio.run(run())
    assert worst_gap_s < SlowLog.READ_S / 2, f"the loop stalled {worst_gap_s:.2f} s"


def test_a_journal_message_is_split_on_newlines_only() -> None:
    """journald keeps a line up to 48 KiB; a Unicode line separator inside one does not start a line of its own."""
    tail = JournalTail("ollama")  # journalctl starts on the first read(): take_output alone needs none
    try:
        timing = SLOT + "       eval time =       1.00 ms /     2 tokens"
        for sep in ("\u2028", "\u2029", "\x1c", "\x1e", "\x85", "\x0b", "\x0c"):
            entry = {"__REALTIME_TIMESTAMP": "1700000000250000", "MESSAGE": f"grammar: x{sep}{timing}"}
            assert tail.take_output(json.dumps(entry).encode() + b"\n", 5.0) == [], repr(sep)
        both = {"__REALTIME_TIMESTAMP": "1700000000250000", "MESSAGE": f"grammar: x\n{timing}\n"}
        assert [e.tokens for e in tail.take_output(json.dumps(both).encode() + b"\n", 5.0)] == [2]
        assert tail.unknown_lines == 8 and tail.known_lines == 1
    finally:
        tail.close()


# Fragments of the wait, load, fit and settings lines (issue 39: the fuzzing extended to their grammars), each with
# the characters their patterns split on; whole lines start with each of their prefixes.
GRAMMAR_FRAGMENTS = [
    " - saving prompt with length 1, total state size = 1.000 MiB",
    "restored context checkpoint (pos_min = 0, pos_max = 1, n_tokens = 2, ",
    "forcing full prompt re-processing due to lack of cache data",
    "created context checkpoint 1 of 32 (pos_min = 0, ",
    "initializing, n_slots = 2, n_ctx_slot = 4096",
    "prompt cache update took 1.00 ms",
    "offloaded 7/19 layers to GPU",
    "   CUDA0 model buffer size =  1.00 MiB",
    "using device CUDA0 (NVIDIA H200 (x) ) (0000:00:06.0) - 1 MiB free",
    "  - CUDA0   : Intel(R) Xeon(R) (1 MiB, 1 MiB free)",
    "|   - CUDA0 (H200)  | 1 = 1 + (1 =  1 +  1 +  1) +  -1 |",
    "layer  12 assigned to device CUDA1, is_swa = 0",
    "listening on http://127.0.0.1:1",
    ' msg="truncating input prompt" limit=1 prompt=2 keep=1 new=1',
    ' msg="server config" env="map[OLLAMA_NUM_PARALLEL:64 ',
    ' msg="inference compute" id=GPU-1 library=CUDA name=CUDA0 total="1 GiB"',
    ' total_vram="1 GiB" default_num_ctx=1',
    ' x=\\"\\\\\\u00e9"',
]
SPLITTERS = [" ", "|", "=", ",", "(", ")", '"', "\\", "0", "9" * 20]
GRAMMAR_PREFIXES = [
    "",
    "srv   prompt_save: ",
    "srv  get_availabl: ",
    "slot   operator(): id  0 | task 5 | ",
    "0.00.001.410 I srv    load_model: ",
    "load_tensors: ",
    "llama_kv_cache: ",
    "sched_reserve: ",
    "llama_prepare_model_devices: ",
    "cmn  common_param: ",
    "common_memory_breakdown_print: ",
    "srv  llama_server: ",
    "time=2026-12-04T18:31:01.404+00:00 level=WARN source=llama_server.go:314 msg=",
    "time=2026-12-04T18:31:01.404+00:00 level=INFO source=routes.go:1741 msg=",
]


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*GRAMMAR_FRAGMENTS, " ", "|", "=", ",", "(", ")", '"', "\\", "0", "9" * 20]), st.integers(1, 300)
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(GRAMMAR_PREFIXES),
)
def test_fuzzed_wait_load_fit_and_settings_lines_parse_within_a_time_budget(runs: list[tuple[str, int]], prefix: str) -> None:
    from analysis.prompt_fit import parse_fit_line
    from analysis.runner_load_lines import parse_load_line
    from analysis.runner_wait_lines import parse_wait_line

    line = (prefix + "".join(fragment * count for fragment, count in runs))[: 2 * MAX_LOG_LINE_CHARS]
    for parse in (parse_wait_line, parse_load_line, parse_fit_line, lambda x: parse_line(x, 1.0)):
        start = time.perf_counter()
        fact = parse(line)
        took_s = time.perf_counter() - start
        assert took_s < LINE_BUDGET_S, f"{len(line)} characters took {took_s:.3f} s"
        for name in ("size_bytes", "free_bytes", "total_bytes", "tokens", "limit", "prompt", "new", "duration_ms"):
            value = getattr(fact, name, None)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value)


def test_repeated_grammar_fragments_at_the_length_cap_parse_in_bounded_time() -> None:
    from analysis.prompt_fit import parse_fit_line
    from analysis.runner_load_lines import parse_load_line
    from analysis.runner_wait_lines import parse_wait_line

    for fragment in GRAMMAR_FRAGMENTS:
        for prefix in GRAMMAR_PREFIXES:
            line = repeated(fragment, MAX_LOG_LINE_CHARS - len(prefix), prefix)
            for parse in (parse_wait_line, parse_load_line, parse_fit_line, lambda x: parse_line(x, 1.0)):
                start = time.perf_counter()
                parse(line)
                took_s = time.perf_counter() - start
                assert took_s < LINE_BUDGET_S, f"{line[:60]!r}… took {took_s:.3f} s"

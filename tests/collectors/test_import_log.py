"""python -m collectors.import_log: the generations an Ollama log holds, into the store, never twice.

On the H200 run (tests/data/real_gpu_h200/): its own store recorded all 13 generations live (10 proxied, 3 direct),
so importing its log adds none; into an empty store the import records those 13 with the runner's figures."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from collectors.import_log import EXIT_COLLECTOR_RUNS, ImportResult, import_log, same_generation
from collectors.lock import CollectorLock
from collectors.ollama.history import Generation, LogHistory
from store.history import RecordedFigures
from store.queries import open_readonly, request_waits, requests_in_window
from store.schema import db_path
from tests.support.paths import REPO
from tests.support.real_gpu import LOG, real_gpu_store

FIGURES_SQL = (
    "SELECT prompt_eval_count, eval_count, prompt_eval_duration_ns, eval_duration_ns FROM requests "
    "ORDER BY prompt_eval_count, eval_count, prompt_eval_duration_ns"
)


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _import(data_dir: Path, log: Path = LOG) -> tuple[ImportResult, list[tuple[int, int | None]]]:
    seen: list[tuple[int, int | None]] = []
    with log.open("rb") as f:
        result = import_log(data_dir, f, size_bytes=log.stat().st_size, progress=lambda done, size: seen.append((done, size)))
    return result, seen


def test_fixture_log_into_its_own_store_adds_no_duplicate(tmp_path: Path) -> None:
    path = real_gpu_store(tmp_path / "data", with_placement=False)
    before = _rows(path, FIGURES_SQL)
    assert len(before) == 13
    result, seen = _import(tmp_path / "data")
    assert result.counts.generations == 13
    assert (result.recorded, result.already) == (0, 13)
    assert _rows(path, FIGURES_SQL) == before  # 13 stay 13, unchanged
    assert seen[-1] == (LOG.stat().st_size, LOG.stat().st_size)  # progress reached the end
    # the runner's placement, which that collector did not store yet, is stored from the log's load lines
    devices = _rows(path, "SELECT device, layers_offloaded, layers_total, model FROM runner_devices ORDER BY device")
    assert ("CUDA0", 49, 49, "gemma3:12b-random") in devices


def test_fixture_log_into_an_empty_store_records_its_generations(tmp_path: Path) -> None:
    live = real_gpu_store(tmp_path / "live", with_placement=False)
    result, _ = _import(tmp_path / "empty")
    assert (result.counts.generations, result.recorded, result.already) == (13, 13, 0)
    path = db_path(tmp_path / "empty")
    # the runner's own counts and durations, as the live collector recorded them (proxied: Ollama's reply, in ns;
    # the log prints them to 0.01 ms)
    imported, recorded = _rows(path, FIGURES_SQL), _rows(live, FIGURES_SQL)
    assert [r[:2] for r in imported] == [r[:2] for r in recorded]
    for a, b in zip(imported, recorded, strict=True):
        assert abs(a[2] - b[2]) <= 5_000 and abs(a[3] - b[3]) <= 5_000
    rows = _rows(path, "SELECT seen_from, runner_source, runner_port, endpoint, ends_bound_s FROM requests")
    assert {r[:3] for r in rows} == {("runner", "log", 48613)}
    assert all(r[3] == "/api/generate" for r in rows)  # each one's access line fitted it alone
    assert all(0 < r[4] <= 1.0 for r in rows)
    # the first one waited for the load (llama-server started in 3.42 seconds)
    assert _rows(path, "SELECT load_duration_ns FROM requests WHERE runner_task_id = 0") == [(3_420_000_000,)]
    # their times: each ends within its bound of the live record of the same figures
    live_end = _rows(live, "SELECT prompt_eval_duration_ns, ended_at_unix_s FROM requests")
    for prefill_ns, end, bound in _rows(path, "SELECT prompt_eval_duration_ns, ended_at_unix_s, ends_bound_s FROM requests"):
        [truth] = [t for p, t in live_end if abs(p - prefill_ns) <= 5_000]
        assert abs(end - truth) <= bound + 0.05
    # imported again: nothing new
    again, _ = _import(tmp_path / "empty")
    assert (again.recorded, again.already) == (0, 13)
    assert len(_rows(path, "SELECT id FROM requests")) == 13


def test_fixture_log_into_an_empty_store_records_the_runners_waits(tmp_path: Path) -> None:
    result, _ = _import(tmp_path / "empty")
    assert result.waits == 13  # every generation's task: its slot, the slots busy, and what the runner did first
    reader = open_readonly(db_path(tmp_path / "empty"))
    try:
        stored = {s.record.id: s.record for s in requests_in_window(reader, 0.0, 4e9, limit=100)}
        waits = request_waits(reader, list(stored))
    finally:
        reader.close()
    saves = {rid: w for rid, t in waits.items() for w in t.before_prefill() if w.kind == "prompt_cache_save" and w.size_bytes}
    # The 272-token prompt sent after the 16,414-token one: the runner first saved the other slot's 16,669 tokens
    # (1,362.016 MiB) into its prompt cache.
    prompts = {rid: rec.metrics.prompt_eval_count if rec.metrics is not None else None for rid, rec in stored.items()}
    [(rid, save)] = [(rid, w) for rid, w in saves.items() if prompts[rid] == 272 and w.tokens == 16669]
    assert round(save.size_bytes / 2**20) == 1362
    assert waits[rid].n_slots == 2


def test_refused_while_a_collector_records_into_the_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = real_gpu_store(data, with_placement=False)
    with CollectorLock(data) as lock:
        lock.acquire(listen="127.0.0.1:11435", ollama_url="http://127.0.0.1:11434")
        out = subprocess.run(
            [sys.executable, "-m", "collectors.import_log", "--data", str(data), str(LOG)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == EXIT_COLLECTOR_RUNS
    assert "127.0.0.1:11435" in out.stderr and "--stop" in out.stderr
    assert len(_rows(path, "SELECT id FROM requests")) == 13


def _generations(text: str) -> list[Generation]:
    out: list[Generation] = []
    history = LogHistory(out.append)
    for line in io.StringIO(text):
        history.feed(line.rstrip("\n"))
    history.finish()
    return out


TASK = """\
slot launch_slot_: id  0 | task 7 | processing task, is_child = 0
slot   operator(): id  0 | task 7 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 100
slot print_timing: id  0 | task 7 | prompt eval time = 200.00 ms / 60 tokens (    3.33 ms per token, 300.00 tokens per second)
slot print_timing: id  0 | task 7 |        eval time = 1000.00 ms / 20 tokens (   50.00 ms per token, 20.00 tokens per second)
slot      release: id  0 | task 7 | stop processing: n_tokens = 119, truncated = 0
"""


def test_lines_without_time_are_stamped_from_the_preceding_ollama_line() -> None:
    log = (
        'time=2026-12-04T10:00:00.000Z level=INFO source=x.go:1 msg="starting llama-server" cmd="/bin/llama-server '
        "--model /m/blobs/sha256-" + "a" * 64 + ' --port 40001"\n'
        'time=2026-12-04T10:00:02.500Z level=INFO source=x.go:2 msg="llama-server started in 2.50 seconds"\n'
        + TASK
        + 'time=2026-12-04T10:00:06.000Z level=INFO source=x.go:3 msg="something else"\n'
    )
    [gen] = _generations(log)
    rec = gen.record
    # the release line is stamped 10:00:02.5 (the line before it); the next stamp, 10:00:06.000, closes the window
    assert gen.end_lo_unix_s == 1796378402.5
    assert gen.end_hi_unix_s == pytest.approx(1796378406.001)
    assert rec.ends_bound_s == pytest.approx(1.7505)
    assert rec.metrics is not None
    assert (rec.metrics.prompt_eval_count, rec.metrics.prompt_eval_cached_count, rec.metrics.eval_count) == (100, 40, 20)
    assert rec.metrics.load_duration_ns == 2_500_000_000  # it launched right after the load
    assert rec.runner_port == 40001 and gen.runner is not None and gen.runner.digest == "a" * 64
    assert rec.endpoint is None  # no access line: the route is not known


def test_journal_iso_prefix_is_a_stamp_and_lines_before_any_stamp_wait_for_one() -> None:
    prefixed = "".join(f"2026-12-04T10:00:0{i}+0000 host ollama[42]: {line}\n" for i, line in enumerate(TASK.splitlines()))
    [gen] = _generations(prefixed + "2026-12-04T10:00:09+0000 host ollama[42]: [GIN] end\n")
    assert gen.end_lo_unix_s == 1796378404.0  # the release line's own prefix
    assert gen.record.runner_port is None  # no runner start in this log


def test_store_import_log_runs_the_import(tmp_path: Path) -> None:
    """`python -m store import-log` is the collectors' import run with the same arguments (the issue's command)."""
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "server.log"
    log.write_bytes(LOG.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "store", "import-log", "--data", str(data), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert _rows(db_path(data), "SELECT COUNT(*) FROM requests") == [(13,)]


def _figures(**kw: Any) -> RecordedFigures:
    base: dict[str, Any] = dict(
        id="r",
        ended_unix_s=1000.0,
        prompt_tokens=100,
        output_tokens=20,
        prefill_ns=200_000_000,
        decode_ns=1_000_000_000,
        prefill_bound_s=None,
        decode_bound_s=None,
        output_tokens_bound=None,
    )
    return RecordedFigures(**{**base, **kw})


def test_a_stored_generation_is_matched_by_the_runners_figures_within_its_own_bounds() -> None:
    [gen] = _generations(
        'time=1970-01-01T00:16:39.000Z level=INFO source=x.go:1 msg="x"\n'
        + TASK
        + 'time=1970-01-01T00:16:41.000Z level=INFO source=x.go:2 msg="y"\n'
    )
    rec, lo, hi = gen.record, gen.end_lo_unix_s, gen.end_hi_unix_s
    assert same_generation(rec, lo, hi, _figures(prefill_ns=200_004_000))  # the log's 0.01 ms rounding
    assert not same_generation(rec, lo, hi, _figures(prefill_ns=200_100_000))  # another prompt's time
    assert not same_generation(rec, lo, hi, _figures(output_tokens=25))
    assert not same_generation(rec, lo, hi, _figures(ended_unix_s=1100.0))  # the same figures, another time
    # a direct record read from /slots: its durations within their bounds, its output within its bound
    slots = _figures(prefill_ns=260_000_000, decode_ns=940_000_000, prefill_bound_s=0.125, decode_bound_s=0.125)
    assert same_generation(rec, lo, hi, slots)
    assert same_generation(rec, lo, hi, _figures(output_tokens=23, output_tokens_bound=3))
    # an OpenAI-style reply: counts only, and the time
    assert same_generation(rec, lo, hi, _figures(prefill_ns=None, decode_ns=None))


# What an API client had the runner echo into the log (issue 39 F12): a whole generation with a chosen client, and a
# runner start naming the real runner's port with a day of load, all printed at once, as an echo prints them.
FORGED_BLOCK = [
    "slot launch_slot_: id  0 | task 987654 | processing task, is_child = 0",
    "slot   operator(): id  0 | task 987654 | new prompt, n_ctx_slot = 20480, n_keep = 0, task.n_tokens = 4242",
    "slot print_timing: id  0 | task 987654 | prompt eval time =     900.00 ms /  4242 tokens",
    "slot print_timing: id  0 | task 987654 |        eval time =    1200.00 ms /    77 tokens",
    "slot      release: id  0 | task 987654 | stop processing: n_tokens = 4319, truncated = 0",
    '[GIN] 2026/12/04 - 18:31:07 | 200 |          2.2s |    203.0.113.77 | POST     "/api/chat"',
    'time=2026-12-04T18:31:07.500+00:00 level=INFO source=llama_server.go:431 msg="starting llama-server" '
    'cmd="/tmp/pwdev/ls-wrap.sh --model /tmp/pwdev/model.gguf --port 48613 --host 127.0.0.1 -np 2"',
    "load_tensors: offloaded 7/19 layers to GPU",
    "load_tensors:        CUDA0 model buffer size =   100.00 MiB",
    'time=2026-12-04T18:31:07.501+00:00 level=INFO source=llama_server.go:1362 msg="llama-server started in 86400.00 seconds"',
]


def test_an_attacked_log_into_a_fresh_store_records_no_forged_generation_and_no_verified_client(tmp_path: Path) -> None:
    lines = LOG.read_text().splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("[GIN] 2026/12/04 - 18:31:07") and "/api/generate" in x)
    attacked = tmp_path / "attacked.log"
    attacked.write_text("\n".join([*lines[: at + 1], *FORGED_BLOCK, *lines[at + 1 :]]) + "\n")
    result, _ = _import(tmp_path / "data", attacked)
    path = db_path(tmp_path / "data")
    rows = _rows(path, "SELECT prompt_eval_count, eval_count, client_addr, client_unverified, load_duration_ns FROM requests")
    assert not [r for r in rows if r[0] == 4242 or r[2] == "203.0.113.77"], rows
    assert all(r[3] == 1 for r in rows if r[2] is not None), "an access line's client is Ollama's text: unverified"
    assert not [r for r in rows if (r[4] or 0) > 3600e9], "no day of load"
    assert result.counts.refused_tasks >= 1 and result.counts.refused_loads == 1
    devices = _rows(path, "SELECT device, layers_offloaded, layers_total FROM runner_devices WHERE device = 'CUDA0'")
    assert devices == [("CUDA0", 49, 49)], "the real placement stands"
    assert result.recorded == 13  # the log's own generations, every one


def test_an_import_does_not_resurrect_what_a_collector_recording_then_did_not_record(tmp_path: Path) -> None:
    """The store knows when a collector recorded (a host sample every second): a generation of the log at such a time
    that the store does not hold is one that collector did not believe."""
    from datetime import datetime

    from analysis.records import HostSample
    from store.ops import PutHostSample
    from store.writer import StoreWriter

    w = StoreWriter(db_path(tmp_path / "data"))
    ran_at = datetime.fromisoformat("2026-12-04T18:31:07+00:00").timestamp()  # the collector ran then, recorded nothing
    w.write(PutHostSample(HostSample(ran_at, cpu_pct=5.0, mem_used_bytes=1 << 30, mem_total_bytes=1 << 34)))
    w.close()
    result, _ = _import(tmp_path / "data", LOG)
    assert result.refused_live >= 1 and result.recorded == 13 - result.refused_live

"""``python -m collectors.import_log --data DIR FILE``: the generations an Ollama log holds, into the store.

FILE is Ollama's server.log, or what ``journalctl -u ollama -o cat`` (or ``-o short-iso``) printed; ``-`` reads
standard input. Each generation the log holds (``collectors.ollama.history``) is recorded as a direct record
with the runner's own timings, unless the store already has it: a generation recorded live (proxied, or direct
from the runner) is found by the runner's own figures (prompt and output tokens, prefill and decode durations
within the 0.01 ms the log prints them to, or within a /slots record's own bounds) and a time in the window the
log places it in, and is not written again. Importing the same log twice adds nothing the second time. Each
runner's placement from its load lines is stored for its port when the store has none as recent.

One writer per data folder: the import takes the folder's lock as a collector does, and refuses (exit 3, the
holder named) while a collector records into it; see docs/import-log.md for why it does not hand its rows over.
Generations older than the store keeps requests (``RetentionPolicy.requests_max_age_s``) are counted, not written.

Why here and not ``python -m store import-log``: the store imports nothing above ``analysis`` (pyproject.toml's
contracts), and reading Ollama's log is the collectors' concern (their parser and their direct records).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from analysis.command_line import ExitCode
from analysis.records import RequestRecord
from analysis.runner_load_rows import placement_rows
from analysis.runner_wait_tasks import RequestWaitsRow, waits_row
from collectors.lock import CollectorLock, LockHeldError, UnsafeFileError, lock_path, read_lock
from collectors.ollama.direct_owner import DURATION_MATCH_NS
from collectors.ollama.history import Generation, HistoryCounts, LogHistory, RunnerStart, read_lines
from collectors.stopping import stop_collector
from store.history import (
    RecordedFigures,
    model_names_by_digest,
    placement_read_at,
    recorded_between,
    runner_models_by_port,
    watched,
)
from store.ops import PutRequest, PutRequestWaits, PutRunnerPlacement, RetentionPolicy
from store.queries import open_readonly, request_waits, resolve_db
from store.schema import StoreError
from store.writer import StoreWriter

# The exit codes every command shares (analysis/command_line.py), by what they mean here.
EXIT_OK = ExitCode.OK
EXIT_FAILED = ExitCode.FAILED
EXIT_USAGE = ExitCode.USAGE
EXIT_COLLECTOR_RUNS = ExitCode.BUSY
BATCH = 256  # generations checked against the store and written in one transaction
MATCH_SLACK_S = 2.0  # a recorded end may lie this far outside the window the log places the generation in


@dataclass
class ImportResult:
    counts: HistoryCounts = field(default_factory=HistoryCounts)
    recorded: int = 0  # new records written
    already: int = 0  # generations the store had (recorded live, or imported before)
    too_old: int = 0  # older than the store keeps requests
    refused_live: int = 0  # at a time a collector recorded, and not among what it recorded: it did not believe them
    unnamed: int = 0  # written with the model unknown (no digest or runner the store knows)
    placements: int = 0  # runner ports whose placement was written
    waits: int = 0  # generations whose runner waits (prompt-cache saves, checkpoints, …) were written
    bytes_read: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        c = self.counts
        parts = [
            f"{c.generations} generations in {c.lines} lines",
            f"{self.recorded} recorded",
            f"{self.already} already in the store",
        ]
        if self.too_old:
            parts.append(f"{self.too_old} older than the store keeps")
        if self.refused_live:
            parts.append(f"{self.refused_live} at a time a collector recorded and did not record them (not believed then)")
        refused = c.refused_tasks + c.refused_loads + c.refused_load_lines
        if refused:
            parts.append(
                f"{refused} not believed as the live collector would not ({c.refused_tasks} tasks whose lines are not one "
                f"runner's in time, {c.refused_loads} load times, {c.refused_load_lines} load lines outside a runner's start)"
            )
        if self.unnamed:
            parts.append(f"{self.unnamed} with the model unknown (the store knows no model by that runner or digest)")
        if c.incomplete_tasks:
            parts.append(f"{c.incomplete_tasks} tasks without both timing lines (not generations)")
        if c.dropped_tasks:
            parts.append(f"{c.dropped_tasks} tasks whose start the log does not hold")
        if self.placements:
            parts.append(f"{self.placements} runner placements")
        if self.waits:
            parts.append(f"the runner's waits of {self.waits}")
        return "; ".join(parts) + f" ({self.bytes_read / 1e6:.1f} MB in {self.seconds:.1f} s)"


def same_generation(rec: RequestRecord, lo: float, hi: float, stored: RecordedFigures) -> bool:
    """Whether a stored row is this generation: the runner's counts and durations, at a time the log allows."""
    m = rec.metrics
    if m is None or stored.ended_unix_s is None or not lo - MATCH_SLACK_S <= stored.ended_unix_s <= hi + MATCH_SLACK_S:
        return False
    if stored.prompt_tokens != m.prompt_eval_count or stored.output_tokens is None or m.eval_count is None:
        return False
    if abs(stored.output_tokens - m.eval_count) > (stored.output_tokens_bound or 0) + 1:
        return False
    if stored.prefill_ns is None or stored.decode_ns is None:
        return True  # an OpenAI-style reply records counts only: they and the time are what can match
    assert m.prompt_eval_duration_ns is not None and m.eval_duration_ns is not None
    prefill_slack = DURATION_MATCH_NS + (stored.prefill_bound_s or 0.0) * 1e9
    decode_slack = DURATION_MATCH_NS + (stored.decode_bound_s or 0.0) * 1e9
    return (
        abs(stored.prefill_ns - m.prompt_eval_duration_ns) <= prefill_slack
        and abs(stored.decode_ns - m.eval_duration_ns) <= decode_slack
    )


class _Importer:
    """Checks each batch of generations against the store and writes the new ones through the writer."""

    def __init__(self, writer: StoreWriter, db: Path, result: ImportResult, now_unix_s: float) -> None:
        self.writer = writer
        self.conn = open_readonly(db)  # beside the writer's: WAL lets it read what each batch committed
        self.result = result
        self.oldest_kept_unix_s = now_unix_s - RetentionPolicy().requests_max_age_s
        self.names = model_names_by_digest(self.conn)
        self.by_port = runner_models_by_port(self.conn)
        self.batch: list[Generation] = []
        self.taken: set[str] = set()  # stored rows matched already (one row is one generation)

    def add(self, gen: Generation) -> None:
        self.batch.append(gen)
        if len(self.batch) >= BATCH:
            self.flush()

    def model_of(self, runner: RunnerStart | None, at_unix_s: float) -> str:
        if runner is None:
            return ""
        if runner.digest is not None and runner.digest in self.names:
            return self.names[runner.digest]
        seen = self.by_port.get(runner.port, [])
        # the runner the collector found on that port nearest in time to the generation (its model then)
        best = min(seen, key=lambda s: abs(s[0] - at_unix_s), default=None)
        return best[1] if best is not None else ""

    def flush(self) -> None:
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        lo = min(g.end_lo_unix_s for g in batch) - MATCH_SLACK_S
        hi = max(g.end_hi_unix_s for g in batch) + MATCH_SLACK_S
        stored = recorded_between(self.conn, lo, hi)
        ops: list[PutRequest] = []
        waits: list[RequestWaitsRow] = []  # the runner's own waits, for the new records and matched ones without any
        matched: dict[str, Generation] = {}
        for gen in batch:
            rec = gen.record
            if rec.started_at_unix_s < self.oldest_kept_unix_s:
                self.result.too_old += 1
                continue
            match = next(
                (s for s in stored if s.id not in self.taken and same_generation(rec, gen.end_lo_unix_s, gen.end_hi_unix_s, s)),
                None,
            )
            if match is not None:
                self.taken.add(match.id)
                self.result.already += 1
                matched[match.id] = gen
                continue
            if watched(self.conn, gen.end_lo_unix_s, gen.end_hi_unix_s):
                self.result.refused_live += 1  # a collector recorded then and did not record this: not resurrected
                continue
            model = self.model_of(gen.runner, rec.started_at_unix_s)
            self.result.unnamed += not model
            ops.append(PutRequest(replace(rec, model=model)))
            waits += _waits_of(rec.id, gen)
        if matched:  # recorded live, perhaps without the log: its waits where the store has none
            known = request_waits(self.conn, list(matched))
            waits += [row for rid, gen in matched.items() if rid not in known for row in _waits_of(rid, gen)]
        if ops:
            self.writer.apply(ops)
            self.result.recorded += len(ops)
        if waits:
            self.writer.apply([PutRequestWaits(waits)])  # after their requests: a wait row needs its request
            self.result.waits += len(waits)

    def placements(self, history: LogHistory) -> None:
        stored_at = placement_read_at(self.conn)
        for port, (at_unix_s, placement, runner) in history.placements().items():
            if stored_at.get(port, float("-inf")) >= at_unix_s:
                continue  # the store's is as recent (the collector read the same load live, or a later one)
            model = self.model_of(runner, at_unix_s) or None
            rows = placement_rows(placement, ts_unix_s=at_unix_s, port=port, model=model, digest=runner.digest)
            self.writer.write(PutRunnerPlacement(port, rows))
            self.result.placements += 1


def _waits_of(request_id: str, gen: Generation) -> list[RequestWaitsRow]:
    """The row of the runner's waits before this generation's prompt ([] when its launch line gave none)."""
    if gen.waits is None:
        return []
    port = gen.runner.port if gen.runner is not None else None
    return [waits_row(request_id, gen.waits, ts_unix_s=gen.end_lo_unix_s, port=port)]


def import_log(
    data_dir: Path,
    source: BinaryIO,
    *,
    size_bytes: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> ImportResult:
    """Import the log read from ``source`` into the store in ``data_dir`` (module doc). ``progress(bytes read,
    size)`` after each chunk. Raises LockHeldError while a collector records into the folder, StoreError,
    UnsafeFileError or OSError when the store cannot be written."""
    t0 = time.monotonic()
    result = ImportResult()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with CollectorLock(data_dir) as lock:
        lock.acquire(listen="", ollama_url="(importing Ollama's log)")
        writer = StoreWriter(resolve_db(data_dir))
        try:
            importer = _Importer(writer, resolve_db(data_dir), result, clock())
            history = LogHistory(importer.add)
            result.counts = history.counts

            def read(done: int) -> None:
                result.bytes_read = done
                if progress is not None:
                    progress(done, size_bytes)

            for line in read_lines(source, history.counts, read):
                history.feed(line)
            history.finish()
            importer.flush()
            importer.placements(history)
            importer.conn.close()
        finally:
            writer.close()
    result.seconds = time.monotonic() - t0
    return result


def find_ollama_log(env: Mapping[str, str], home: Path) -> Path | None:
    """Ollama's log file where this user can read it: $PHASEWATCH_OLLAMA_LOG, then where Ollama writes it on macOS,
    Windows and a manual install (``~/.ollama/logs/server.log``, ``%LOCALAPPDATA%\\Ollama\\server.log``). None when
    none is readable (on Linux the service writes to the journal: ``journalctl -u ollama -o cat`` into a file)."""
    candidates = [Path(env["PHASEWATCH_OLLAMA_LOG"]).expanduser()] if env.get("PHASEWATCH_OLLAMA_LOG") else []
    candidates.append(home / ".ollama" / "logs" / "server.log")
    if env.get("LOCALAPPDATA"):
        candidates.append(Path(env["LOCALAPPDATA"]) / "Ollama" / "server.log")
    for path in candidates:
        if path.is_file() and os.access(path, os.R_OK) and path.stat().st_size > 0:
            return path
    return None


def import_file(
    data_dir: Path,
    path: Path,
    progress: Callable[[int, int | None], None] | None = None,
    *,
    stop_collector_first: bool = False,
) -> ImportResult:
    """The dashboard's import of one log file. ``stop_collector_first``: the collector recording into the folder is
    stopped for the import (the caller starts it again); otherwise LockHeldError while one records."""
    if stop_collector_first and stop_collector(data_dir) is False:
        raise LockHeldError(lock_path(data_dir), read_lock(data_dir))
    with path.open("rb") as f:
        return import_log(data_dir, f, size_bytes=os.fstat(f.fileno()).st_size, progress=progress)


def _progress_printer(out: object) -> Callable[[int, int | None], None]:
    last = [-1]

    def show(done: int, size: int | None) -> None:
        step = int(100 * done / size) if size else done >> 26  # per cent, or every 64 MiB of a pipe
        if step != last[0]:
            last[0] = step
            text = f"{step:3d}% ({done / 1e6:.0f} MB)" if size else f"{done / 1e6:.0f} MB"
            print(f"\rimporting: {text}", end="", file=out, flush=True)  # type: ignore[call-overload]

    return show


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectors.import_log", description="Record the generations an Ollama log holds (docs/import-log.md)."
    )
    parser.add_argument(
        "--data", metavar="DIR", default=os.environ.get("PHASEWATCH_DATA"), help="data folder (default $PHASEWATCH_DATA)"
    )
    parser.add_argument("file", metavar="FILE", help="Ollama's server.log, or journalctl -u ollama -o cat output; - for stdin")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    prog = "import-log"
    if not args.data:
        print(f"{prog}: say where the store is: --data DIR (or set PHASEWATCH_DATA)", file=sys.stderr)
        return EXIT_USAGE
    progress = None if args.quiet else _progress_printer(sys.stderr)
    try:
        if args.file == "-":
            result = import_log(Path(args.data), sys.stdin.buffer, progress=progress)
        else:
            path = Path(args.file)
            with path.open("rb") as f:
                result = import_log(Path(args.data), f, size_bytes=os.fstat(f.fileno()).st_size, progress=progress)
    except LockHeldError as exc:
        print(
            f"\n{prog}: {exc}. The import writes the store itself; run it while no collector records "
            f"(python -m collectors --stop --data {args.data}), then start the collector again",
            file=sys.stderr,
        )
        return EXIT_COLLECTOR_RUNS
    except (StoreError, UnsafeFileError, OSError) as exc:
        print(f"\n{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if progress is not None:
        print(file=sys.stderr)
    print(result.summary())
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())

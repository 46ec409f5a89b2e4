"""The store's only writer: ``StoreWriter`` (sync) and ``BackgroundWriter`` (a thread and a queue).

Every write is an *op* (a method name and its arguments). A batch of ops is applied in
one transaction, so a batch is either all on disk or not at all: after a failure the
batch stays in memory and is retried whole.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import math
import queue
import sqlite3
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from analysis.phases import Phases, split_record
from analysis.records import (
    CollectorInfo,
    GpuSample,
    HostSample,
    LoadedModel,
    OllamaStatus,
    Outcome,
    RequestRecord,
)
from store.schema import GPU_ROLLUP_SQL, HOST_ROLLUP_SQL, ROLLUP_S, connect_writer

log = logging.getLogger(__name__)

DAY_S = 86_400.0
# /api/show keys that are long, user-facing text and carry no architecture facts.
SHOW_KEYS_DROPPED = ("license", "modelfile", "template")


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows are kept, and the most the store may use on disk."""

    samples_max_age_s: float = 7 * DAY_S  # GPU/host samples, /api/ps snapshots, Ollama events
    requests_max_age_s: float = 90 * DAY_S  # requests, their token times, experiments
    max_bytes: int = 2 * 1024**3


@dataclass
class RetentionResult:
    deleted: dict[str, int] = field(default_factory=dict)
    used_bytes_before: int = 0
    used_bytes_after: int = 0


# ---------------------------------------------------------------- encoding helpers


def encode_token_times(received_ns: int, token_chunk_ns: Sequence[int]) -> bytes:
    """Chunk times as little-endian int64 gaps: first from ``received_ns``, then chunk to chunk."""
    gaps = array("q", [t - prev for prev, t in itertools.pairwise(itertools.chain((received_ns,), token_chunk_ns))])
    if sys.byteorder != "little":
        gaps.byteswap()
    return gaps.tobytes()


def decode_token_times(received_ns: int, blob: bytes) -> list[int]:
    """Inverse of ``encode_token_times``."""
    gaps = array("q")
    gaps.frombytes(blob)
    if sys.byteorder != "little":
        gaps.byteswap()
    return list(itertools.accumulate(gaps, initial=received_ns))[1:]


def _opt_wall(rec: RequestRecord, t_ns: int | None) -> float | None:
    return None if t_ns is None else rec.wall_s(t_ns)


REQUEST_COLUMNS = (
    "id", "started_at_unix_s", "client_addr", "endpoint", "model", "stream", "num_ctx", "num_predict", "keep_alive",
    "received_ns", "forwarded_ns", "first_byte_ns", "first_token_ns", "final_chunk_ns", "closed_ns",
    "status_code", "outcome", "error", "has_metrics",
    "total_duration_ns", "load_duration_ns", "prompt_eval_count", "prompt_eval_cached_count",
    "prompt_eval_duration_ns", "eval_count", "eval_duration_ns", "done_reason",
    "prompt_text", "response_text",
    "updated_at_unix_s", "ended_at_unix_s", "last_token_unix_s", "tokens_so_far",
    "total_s", "load_s", "prefill_s", "decode_s", "queue_s", "transport_s", "ttft_s", "client_s",
    "prompt_tokens", "cached_tokens", "output_tokens",
    "prefill_tok_s", "decode_tok_s", "ollama_prefill_tok_s", "ollama_decode_tok_s",
    "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "flags",
    "load_start_unix_s", "prefill_start_unix_s", "decode_start_unix_s", "decode_end_unix_s",
)  # fmt: skip

_PHASE_COLUMNS = (
    "total_s", "load_s", "prefill_s", "decode_s", "queue_s", "transport_s", "ttft_s", "client_s",
    "prompt_tokens", "cached_tokens", "output_tokens",
    "prefill_tok_s", "decode_tok_s", "ollama_prefill_tok_s", "ollama_decode_tok_s",
    "itl_p50_ms", "itl_p99_ms", "itl_max_ms",
)  # fmt: skip

# A late in-flight progress row never replaces a finished one.
_UPSERT_REQUEST = (
    f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)}) VALUES ({', '.join(':' + c for c in REQUEST_COLUMNS)}) "
    f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in REQUEST_COLUMNS[1:])} "
    "WHERE requests.outcome = 'in_flight' OR excluded.outcome <> 'in_flight' RETURNING id"
)


def request_row(rec: RequestRecord, phases: Phases, now_unix_s: float) -> dict[str, Any]:
    """One ``requests`` row: the record's fields, its metrics flattened, and its derived phases."""
    m = rec.metrics
    in_flight = Outcome(rec.outcome) is Outcome.IN_FLIGHT
    end_ns = rec.final_chunk_ns if rec.final_chunk_ns is not None else rec.closed_ns
    row: dict[str, Any] = {
        "id": rec.id,
        "started_at_unix_s": rec.started_at_unix_s,
        "client_addr": rec.client_addr,
        "endpoint": rec.endpoint,
        "model": rec.model,
        "stream": int(rec.stream),
        "num_ctx": rec.num_ctx,
        "num_predict": rec.num_predict,
        "keep_alive": rec.keep_alive,
        "received_ns": rec.received_ns,
        "forwarded_ns": rec.forwarded_ns,
        "first_byte_ns": rec.first_byte_ns,
        "first_token_ns": rec.first_token_ns,
        "final_chunk_ns": rec.final_chunk_ns,
        "closed_ns": rec.closed_ns,
        "status_code": rec.status_code,
        "outcome": Outcome(rec.outcome).value,
        "error": rec.error,
        "has_metrics": int(m is not None),
        "total_duration_ns": m.total_duration_ns if m else None,
        "load_duration_ns": m.load_duration_ns if m else None,
        "prompt_eval_count": m.prompt_eval_count if m else None,
        "prompt_eval_cached_count": m.prompt_eval_cached_count if m else None,
        "prompt_eval_duration_ns": m.prompt_eval_duration_ns if m else None,
        "eval_count": m.eval_count if m else None,
        "eval_duration_ns": m.eval_duration_ns if m else None,
        "done_reason": m.done_reason if m else None,
        "prompt_text": rec.prompt_text,
        "response_text": rec.response_text,
        "updated_at_unix_s": now_unix_s,
        # A finished request always has an end (the write time at worst), so windows can find it by index.
        "ended_at_unix_s": _opt_wall(rec, end_ns) if end_ns is not None else (None if in_flight else now_unix_s),
        "last_token_unix_s": _opt_wall(rec, rec.token_chunk_ns[-1] if rec.token_chunk_ns else None),
        "tokens_so_far": len(rec.token_chunk_ns),
        "flags": json.dumps(phases.flags),
        "load_start_unix_s": _opt_wall(rec, phases.load_start_ns),
        "prefill_start_unix_s": _opt_wall(rec, phases.prefill_start_ns),
        "decode_start_unix_s": _opt_wall(rec, phases.decode_start_ns),
        "decode_end_unix_s": _opt_wall(rec, phases.decode_end_ns),
    }
    for c in _PHASE_COLUMNS:
        row[c] = getattr(phases, c)
    return row


def _rollup_params(values: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Named parameters for a rollup upsert: the sample's fields plus its minute."""
    values.update(extra, minute_unix_s=int(values["ts_unix_s"] // ROLLUP_S) * ROLLUP_S)
    if "simulated" in values:
        values["simulated"] = int(values["simulated"])
    return values


def _show_json(show: Mapping[str, Any]) -> str:
    kept = {k: v for k, v in show.items() if k not in SHOW_KEYS_DROPPED}
    return json.dumps(kept, default=str, sort_keys=True)


# ---------------------------------------------------------------- the writer


Op = tuple[str, tuple[Any, ...]]


class StoreWriter:
    """Synchronous writer. Each public ``write_*`` call is one transaction.

    Not thread-safe: one thread at a time (``BackgroundWriter`` owns one in its thread).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention: RetentionPolicy | None = None,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.retention = retention or RetentionPolicy()
        self._clock = clock
        self._conn = connect_writer(self.path, busy_timeout_ms=busy_timeout_ms)
        self._page_size = int(self._conn.execute("PRAGMA page_size").fetchone()[0])

    # -- public sync API: one transaction each

    def write_request(self, rec: RequestRecord) -> None:
        self.apply([("request", (rec,))])

    def write_requests(self, recs: Iterable[RequestRecord]) -> None:
        self.apply([("request", (r,)) for r in recs])

    def write_gpu_samples(self, samples: Iterable[GpuSample]) -> None:
        self.apply([("gpu_samples", (list(samples),))])

    def write_host_sample(self, s: HostSample) -> None:
        self.apply([("host_sample", (s,))])

    def write_loaded_models(self, ts_unix_s: float, models: Iterable[LoadedModel]) -> None:
        self.apply([("loaded_models", (ts_unix_s, list(models)))])

    def write_model_info(self, digest: str, name: str, show: Mapping[str, Any]) -> None:
        self.apply([("model_info", (digest, name, dict(show)))])

    def write_ollama_status(self, status: OllamaStatus) -> None:
        self.apply([("ollama_status", (status,))])

    def write_heartbeat(self, info: CollectorInfo) -> None:
        self.apply([("heartbeat", (info,))])

    def write_experiment(
        self,
        id: str,
        kind: str,
        params: Mapping[str, Any],
        started_at_unix_s: float,
        status: str,
        ended_at_unix_s: float | None = None,
        results: Any = None,
    ) -> None:
        """Insert or replace one Lab experiment (``params`` and ``results`` are stored as JSON)."""
        self.apply([("experiment", (id, kind, dict(params), started_at_unix_s, status, ended_at_unix_s, results))])

    def mark_interrupted_in_flight(self, reason: str) -> int:
        """At collector start: in-flight rows left by a killed collector become upstream_failed. Returns how many."""
        n = self.apply([("mark_interrupted", (reason,))])
        assert isinstance(n, int)
        return n

    def apply_retention(self, now_unix_s: float) -> RetentionResult:
        """Delete rows past their age, then the oldest rows while the store is over ``max_bytes``."""
        result = self.apply([("retention", (now_unix_s,))])
        assert isinstance(result, RetentionResult)
        return result

    def set_hard_limit_bytes(self, limit_bytes: int | None) -> None:
        """Cap the file (SQLite ``max_page_count``): writes past it fail like a full disk. None lifts the cap.

        A cap below the current size holds the file at its current size.
        """
        pages = 2**31 - 2 if limit_bytes is None else max(1, limit_bytes // self._page_size)
        self._conn.execute(f"PRAGMA max_page_count = {int(pages)}")

    def used_bytes(self) -> int:
        """Bytes of the main file that hold data (free pages excluded)."""
        pages = int(self._conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])
        return (pages - free) * self._page_size

    def close(self) -> None:
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:  # closing still matters more than the checkpoint
            log.warning("checkpoint on close failed: %s", exc)
        self._conn.close()

    # -- batches

    def apply(self, ops: Sequence[Op]) -> object:
        """Apply ops in one transaction (all or nothing). Returns the last op's result."""
        ops = _drop_superseded(ops)
        now = self._clock()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result: object = None
            for name, args in ops:
                result = getattr(self, f"_op_{name}")(now, *args)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if any(name == "retention" for name, _ in ops):
            self._after_retention()
        return result

    def _after_retention(self) -> None:
        # Give freed pages back to the file system; best effort.
        try:
            conn = self._conn
            conn.execute("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.warning("incremental vacuum after retention failed: %s", exc)

    # -- op implementations, inside a transaction

    def _op_request(self, now: float, rec: RequestRecord) -> None:
        row = request_row(rec, split_record(rec), now)
        if self._conn.execute(_UPSERT_REQUEST, row).fetchone() is None:
            return  # a stale in-flight row for a request already finished
        self._conn.execute(
            "INSERT OR REPLACE INTO request_tokens (request_id, n_chunks, gaps_le_i64) VALUES (?, ?, ?)",
            (rec.id, len(rec.token_chunk_ns), encode_token_times(rec.received_ns, rec.token_chunk_ns)),
        )

    def _op_gpu_samples(self, now: float, samples: list[GpuSample]) -> None:
        self._conn.executemany(
            "INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    s.ts_unix_s, s.index, s.name, s.uuid, s.util_gpu_pct, s.util_mem_pct,
                    s.mem_used_bytes, s.mem_total_bytes, s.power_w, s.power_limit_w, s.energy_j, s.temperature_c,
                    s.sm_clock_mhz, s.sm_clock_max_mhz, s.mem_clock_mhz, s.mem_clock_max_mhz,
                    s.mem_bus_width_bits, s.pcie_tx_bytes_s, s.pcie_rx_bytes_s,
                    s.pstate, s.throttle_reasons, s.ollama_mem_bytes, int(s.simulated),
                )
                for s in samples
            ],
        )
        self._conn.executemany(GPU_ROLLUP_SQL, [_rollup_params(asdict(s), gpu_index=s.index) for s in samples])

    def _op_host_sample(self, now: float, s: HostSample) -> None:
        self._conn.execute(
            "INSERT INTO host_samples VALUES (?,?,?,?,?,?,?)",
            (s.ts_unix_s, s.cpu_pct, s.mem_used_bytes, s.mem_total_bytes, s.ollama_cpu_pct, s.ollama_rss_bytes,
             s.disk_read_bytes_s),
        )  # fmt: skip
        self._conn.execute(HOST_ROLLUP_SQL, _rollup_params(asdict(s)))

    def _op_loaded_models(self, now: float, ts_unix_s: float, models: list[LoadedModel]) -> None:
        conn = self._conn
        conn.execute("INSERT OR REPLACE INTO ps_snapshots VALUES (?, ?)", (ts_unix_s, len(models)))
        conn.execute("DELETE FROM loaded_models WHERE ts_unix_s = ?", (ts_unix_s,))
        conn.executemany(
            "INSERT INTO loaded_models VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [
                (ts_unix_s, m.name, m.model, m.digest, m.size_bytes, m.size_vram_bytes, m.context_length,
                 m.expires_at_unix_s, m.parameter_size, m.quantization_level, m.family)
                for m in models
            ],
        )  # fmt: skip

    def _op_model_info(self, now: float, digest: str, name: str, show: dict[str, Any]) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO model_info (digest, name, show_json, updated_at_unix_s) VALUES (?,?,?,?)",
            (digest, name, _show_json(show), now),
        )

    def _op_ollama_status(self, now: float, s: OllamaStatus) -> None:
        conn = self._conn
        values = (s.ts_unix_s, int(s.up), s.base_url, s.version, s.error)
        conn.execute(
            "INSERT OR REPLACE INTO ollama_last_poll (id, ts_unix_s, up, base_url, version, error) VALUES (1,?,?,?,?,?)",
            values,
        )
        last = conn.execute("SELECT up, base_url, version FROM ollama_events ORDER BY ts_unix_s DESC LIMIT 1").fetchone()
        if last is None or (bool(last[0]), last[1], last[2]) != (s.up, s.base_url, s.version):
            conn.execute("INSERT INTO ollama_events VALUES (?,?,?,?,?)", values)

    def _op_heartbeat(self, now: float, i: CollectorInfo) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO collector_heartbeat VALUES (1,?,?,?,?,?,?,?,?,?)",
            (i.ts_unix_s, i.pid, i.listen, i.ollama_url, i.data_dir, i.gpu_state, i.gpu_message, int(i.demo),
             int(i.record_text)),
        )  # fmt: skip

    def _op_experiment(
        self,
        now: float,
        id: str,
        kind: str,
        params: dict[str, Any],
        started_at_unix_s: float,
        status: str,
        ended_at_unix_s: float | None,
        results: Any,
    ) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO experiments VALUES (?,?,?,?,?,?,?)",
            (id, kind, json.dumps(params, default=str), started_at_unix_s, ended_at_unix_s, status,
             None if results is None else json.dumps(results, default=str)),
        )  # fmt: skip

    def _op_mark_interrupted(self, now: float, reason: str) -> int:
        cur = self._conn.execute(
            "UPDATE requests SET outcome = ?, error = ?, updated_at_unix_s = ?, "
            "ended_at_unix_s = COALESCE(ended_at_unix_s, last_token_unix_s, ?) WHERE outcome = ?",
            (Outcome.UPSTREAM_FAILED.value, reason, now, now, Outcome.IN_FLIGHT.value),
        )
        return cur.rowcount

    def _op_retention(self, now: float, now_unix_s: float) -> RetentionResult:
        conn = self._conn
        policy = self.retention
        result = RetentionResult(used_bytes_before=self.used_bytes())
        deleted = result.deleted

        def count(table: str, n: int) -> None:
            deleted[table] = deleted.get(table, 0) + n

        def delete_samples_before(cutoff: float) -> None:
            for table in ("gpu_samples", "host_samples", "loaded_models", "ps_snapshots", "ollama_events"):
                count(table, conn.execute(f"DELETE FROM {table} WHERE ts_unix_s < ?", (cutoff,)).rowcount)
            for table in ("gpu_minutes", "host_minutes"):  # minutes wholly before the cutoff
                count(table, conn.execute(f"DELETE FROM {table} WHERE minute_unix_s + ? <= ?", (ROLLUP_S, cutoff)).rowcount)

        def delete_requests_before(cutoff: float) -> None:
            # request_tokens go with their rows (ON DELETE CASCADE).
            n = conn.execute("DELETE FROM requests WHERE started_at_unix_s < ?", (cutoff,)).rowcount
            count("requests", n)
            count("experiments", conn.execute("DELETE FROM experiments WHERE started_at_unix_s < ?", (cutoff,)).rowcount)

        delete_samples_before(now_unix_s - policy.samples_max_age_s)
        delete_requests_before(now_unix_s - policy.requests_max_age_s)

        # Size bound: oldest samples first, then oldest requests, a tenth of the time span at a time.
        for _ in range(200):
            if self.used_bytes() <= policy.max_bytes:
                break
            span = conn.execute(
                "SELECT MIN(t), MAX(t) FROM (SELECT MIN(ts_unix_s) AS t FROM gpu_samples UNION ALL "
                "SELECT MAX(ts_unix_s) FROM gpu_samples UNION ALL SELECT MIN(ts_unix_s) FROM host_samples UNION ALL "
                "SELECT MAX(ts_unix_s) FROM host_samples UNION ALL SELECT MIN(ts_unix_s) FROM ps_snapshots UNION ALL "
                "SELECT MAX(ts_unix_s) FROM ps_snapshots)"
            ).fetchone()
            if span[0] is not None:
                delete_samples_before(_next_cutoff(span[0], span[1]))
                continue
            span = conn.execute("SELECT MIN(started_at_unix_s), MAX(started_at_unix_s) FROM requests").fetchone()
            if span[0] is None:
                break
            delete_requests_before(_next_cutoff(span[0], span[1]))
        result.used_bytes_after = self.used_bytes()
        return result


def _next_cutoff(t_min: float, t_max: float) -> float:
    """Cut the oldest tenth of a time span; always past the oldest row, so every step deletes something."""
    return max(t_min + (t_max - t_min) / 10.0, math.nextafter(t_min, math.inf))


def _drop_superseded(ops: Sequence[Op]) -> list[Op]:
    """Within a batch, an upsert of a request makes earlier upserts of the same id redundant."""
    last: dict[str, int] = {}
    for i, (name, args) in enumerate(ops):
        if name == "request":
            last[args[0].id] = i
    return [op for i, op in enumerate(ops) if op[0] != "request" or last[op[1][0].id] == i]


# ---------------------------------------------------------------- background writer


_FLUSH: Op = ("flush", ())  # queue marker: write what is gathered now


def _weight(op: Op) -> int:
    """Records an op carries (what ``pending_count`` counts)."""
    name, args = op
    if name == "gpu_samples":
        return max(1, len(args[0]))
    return 1


class BackgroundWriter:
    """A ``StoreWriter`` on its own thread, fed by a queue.

    ``submit_*`` never block on disk (safe to call from an asyncio loop). Every
    ``batch_interval_s`` what has been submitted is written in one transaction. When
    SQLite fails with ``OperationalError`` (disk full, locked), the batch stays in memory
    and is retried with backoff; ``last_error`` and ``pending_count`` say so.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        retention: RetentionPolicy | None = None,
        batch_interval_s: float = 0.2,
        busy_timeout_ms: int = 1000,
        max_backoff_s: float = 5.0,
    ) -> None:
        # Opened here, so that an unusable store fails the caller at once.
        self._writer = StoreWriter(path, retention=retention, busy_timeout_ms=busy_timeout_ms)
        self._batch_interval_s = batch_interval_s
        self._max_backoff_s = max_backoff_s
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._submitted = 0
        self._committed = 0
        self._dropped = 0
        self._batches = 0
        self._closing = False
        self._give_up_at: float | None = None
        self._wake = threading.Event()
        self._hard_limit: tuple[bool, int | None] = (False, None)
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="phasewatch-store-writer", daemon=True)
        self._thread.start()

    # -- submit: non-blocking

    def _submit(self, op: Op) -> None:
        with self._lock:
            if self._closing:
                raise RuntimeError("BackgroundWriter is closed")
            self._submitted += _weight(op)
        self._queue.put(op)

    def submit_request(self, rec: RequestRecord) -> None:
        """Queue a snapshot of ``rec``: the proxy keeps changing a running request while this thread writes it."""
        snap = copy.copy(rec)
        snap.token_chunk_ns = list(rec.token_chunk_ns)
        self._submit(("request", (snap,)))

    def submit_requests(self, recs: Iterable[RequestRecord]) -> None:
        for r in recs:
            self.submit_request(r)

    def submit_gpu_samples(self, samples: Iterable[GpuSample]) -> None:
        self._submit(("gpu_samples", (list(samples),)))

    def submit_host_sample(self, s: HostSample) -> None:
        self._submit(("host_sample", (s,)))

    def submit_loaded_models(self, ts_unix_s: float, models: Iterable[LoadedModel]) -> None:
        self._submit(("loaded_models", (ts_unix_s, list(models))))

    def submit_model_info(self, digest: str, name: str, show: Mapping[str, Any]) -> None:
        self._submit(("model_info", (digest, name, dict(show))))

    def submit_ollama_status(self, status: OllamaStatus) -> None:
        self._submit(("ollama_status", (status,)))

    def submit_heartbeat(self, info: CollectorInfo) -> None:
        self._submit(("heartbeat", (info,)))

    def submit_experiment(
        self,
        id: str,
        kind: str,
        params: Mapping[str, Any],
        started_at_unix_s: float,
        status: str,
        ended_at_unix_s: float | None = None,
        results: Any = None,
    ) -> None:
        self._submit(("experiment", (id, kind, dict(params), started_at_unix_s, status, ended_at_unix_s, results)))

    def submit_mark_interrupted_in_flight(self, reason: str) -> None:
        self._submit(("mark_interrupted", (reason,)))

    def submit_retention(self, now_unix_s: float) -> None:
        self._submit(("retention", (now_unix_s,)))

    def set_hard_limit_bytes(self, limit_bytes: int | None) -> None:
        """See ``StoreWriter.set_hard_limit_bytes``; applied by the writer thread before its next batch."""
        with self._lock:
            self._hard_limit = (True, limit_bytes)
        self._wake.set()

    # -- state

    @property
    def pending_count(self) -> int:
        """Records submitted and not yet committed (waiting in memory)."""
        with self._lock:
            return self._submitted - self._committed - self._dropped

    @property
    def committed_batches(self) -> int:
        """Transactions committed so far (each holds one batch)."""
        with self._lock:
            return self._batches

    @property
    def dropped_count(self) -> int:
        """Records SQLite refused as invalid (not for lack of space); each is logged."""
        with self._lock:
            return self._dropped

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until everything submitted before this call is committed. False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            target = self._submitted
            if self._committed + self._dropped < target:
                self._queue.put(_FLUSH)
                self._wake.set()
            while self._committed + self._dropped < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._done.wait(min(left, 0.1))
        return True

    def close(self, timeout_s: float = 10.0) -> bool:
        """Write everything still queued, then stop. False if the store would not take it within ``timeout_s``."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._give_up_at = time.monotonic() + timeout_s
                self._queue.put(None)
        self._wake.set()
        self._thread.join(timeout_s + 5.0)
        drained = self.pending_count == 0
        if not drained:
            log.error("store writer closed with %d records not written: %s", self.pending_count, self.last_error)
        return drained

    # -- the thread

    def _run(self) -> None:
        batch: list[Op] = []
        stop = False
        backoff_s = 0.05
        try:
            while True:
                if not batch and not stop:
                    item = self._queue.get()  # idle: block until there is work
                    stop = self._take(item, batch)
                # Gather what arrives within one batch interval; a flush or close ends the wait early.
                deadline = time.monotonic() + self._batch_interval_s
                hurry = stop or self._wake.is_set()
                while True:
                    left = 0.0 if hurry else deadline - time.monotonic()
                    try:
                        item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _FLUSH:
                        hurry = True
                    if self._take(item, batch):
                        stop = hurry = True
                self._wake.clear()
                if batch:
                    if self._write(batch):
                        batch = []
                        backoff_s = 0.05
                    else:
                        give_up = self._give_up_at
                        if stop and give_up is not None and time.monotonic() >= give_up:
                            return
                        self._wake.wait(backoff_s)
                        backoff_s = min(backoff_s * 2, self._max_backoff_s)
                        continue
                if stop:
                    return
        finally:
            self._writer.close()
            with self._lock:
                self._done.notify_all()

    @staticmethod
    def _take(item: Op | None, batch: list[Op]) -> bool:
        """Add a queue item to the batch; True for the stop marker."""
        if item is None:
            return True
        if item is not _FLUSH:
            batch.append(item)
        return False

    def _write(self, batch: list[Op]) -> bool:
        """One transaction for the batch. True when it is committed (or its bad records were dropped)."""
        with self._lock:
            set_limit, limit = self._hard_limit
            self._hard_limit = (False, limit)
        weight = sum(_weight(op) for op in batch)
        try:
            if set_limit:
                self._writer.set_hard_limit_bytes(limit)
            self._writer.apply(batch)
        except sqlite3.OperationalError as exc:
            # Disk full, locked, I/O: keep the batch, retry later. Progress rows that a later row of the
            # same request replaces need not wait in memory (a long outage would otherwise pile them up).
            kept = _drop_superseded(batch)
            superseded = weight - sum(_weight(op) for op in kept)
            batch[:] = kept
            with self._lock:
                self._committed += superseded
                waiting = self._submitted - self._committed - self._dropped
            self.last_error = f"{exc}: {waiting} records waiting"
            log.warning("store write failed, will retry: %s", self.last_error)
            return False
        except Exception as exc:
            # A record SQLite refuses for itself (not for lack of space): write the others one by one.
            log.exception("store batch failed (%s); retrying record by record", exc)
            return self._write_one_by_one(batch)
        with self._lock:
            self._committed += weight
            self._batches += 1
            self._done.notify_all()
        self.last_error = None
        return True

    def _write_one_by_one(self, batch: list[Op]) -> bool:
        for i, op in enumerate(batch):
            try:
                self._writer.apply([op])
            except sqlite3.OperationalError as exc:
                self.last_error = f"{exc}: records waiting"
                del batch[:i]  # those before i are committed; keep the rest for the retry
                return False
            except Exception as exc:
                log.error("dropped one %s record the store refused: %s", op[0], exc)
                with self._lock:
                    self._dropped += _weight(op)
                    self._done.notify_all()
                self.last_error = f"dropped one {op[0]} record: {exc}"
                continue
            with self._lock:
                self._committed += _weight(op)
                self._done.notify_all()
        return True

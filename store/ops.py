"""Every write to the store is an operation object with one method, ``apply(tx)``.

The writer runs a batch of operations in one transaction (``store.writer``); an
operation only says what it writes, through the table declarations of
``store.tables``. ``weight`` is how many records an operation carries (what a
background writer counts as waiting).
"""

from __future__ import annotations

import copy
import json
import math
import sqlite3
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from analysis.phases import Flag, Phases, PhaseSource
from analysis.records import (
    CollectorInfo,
    GpuSample,
    HostBandwidth,
    HostSample,
    InstalledModel,
    LoadedModel,
    OllamaStatus,
    Outcome,
    ProgressSample,
    ProgressSource,
    RequestRecord,
    RunnerFlags,
    SeenFrom,
)
from analysis.runner_fill import split_with_readings, wants_readings
from analysis.runner_load_rows import RunnerDeviceRow
from analysis.runner_wait_tasks import RequestWaitsRow
from analysis.running_gaps import RunningReplies
from store.queries import join_token_pieces
from store.rows import encode_token_times, record_of, request_row
from store.schema import GPU_ROLLUP_SQL, HOST_ROLLUP_SQL, ROLLUP_S
from store.tables import (
    COLLECTOR_HEARTBEAT,
    EXPERIMENTS,
    GPU_SAMPLES,
    HOST_BANDWIDTH,
    HOST_SAMPLES,
    INSTALLED_MODELS,
    LOADED_MODELS,
    MODEL_INFO,
    OLLAMA_EVENTS,
    OLLAMA_LAST_POLL,
    OLLAMA_SETTINGS,
    PHASES_VERSION,
    PROGRESS_SAMPLES,
    PS_SNAPSHOTS,
    REQUEST_TOKEN_PIECES,
    REQUEST_TOKENS,
    REQUEST_WAITS,
    REQUESTS,
    RUNNER_DEVICES,
    RUNNERS,
    ExperimentRow,
    ModelInfoRow,
    OllamaSettingRow,
    PsSnapshotRow,
    RequestRow,
    RequestTokenPieceRow,
    RequestTokensRow,
    SqlValue,
)

T = TypeVar("T")
DAY_S = 86_400.0
# /api/show keys that are long, user-facing text and carry no architecture facts.
SHOW_KEYS_DROPPED = ("license", "modelfile", "template")
INT_IN_LIST_BYTES = 40  # a list slot (8) and the int object (32) of a nanosecond time
OP_BYTES = 512  # a row with its index entries, about; the text and token times of a request come on top
# Prompt sizes the server itself counted (Ollama's prompt_eval_count, the /v1 usage block).
EXACT_PROMPT_SOURCES = (PhaseSource.OLLAMA, PhaseSource.USAGE)
_EXACT_PROMPT_SQL = (
    "SELECT id, CASE WHEN outcome <> 'in_flight' AND prompt_tokens_source IN "
    f"({', '.join(repr(s.value) for s in EXACT_PROMPT_SOURCES)}) THEN prompt_tokens END FROM requests WHERE id = ?"
)
REDERIVE_BATCH = 200  # rows re-derived per transaction: short enough not to hold up the collector's writes


@dataclass(frozen=True)
class RetentionPolicy:
    """How long rows are kept, and the most the store may use on disk."""

    samples_max_age_s: float = 7 * DAY_S  # GPU/host samples, /api/ps snapshots, Ollama events
    requests_max_age_s: float = 90 * DAY_S  # requests, their token times, experiments
    max_bytes: int = 2 * 1024**3
    # Once over max_bytes, shed down to this fraction of it, so that the next shed is a while away.
    shed_to_fraction: float = 0.8


@dataclass
class RetentionResult:
    deleted: dict[str, int] = field(default_factory=dict)
    used_bytes_before: int = 0
    used_bytes_after: int = 0


@dataclass
class Tx:
    """One open write transaction: the connection, the write time, and what the writer was set up with."""

    conn: sqlite3.Connection
    now_unix_s: float
    retention: RetentionPolicy
    page_size: int
    # The sorted token gaps of the running requests the writer follows (kept across transactions by its writer).
    running: RunningReplies = field(default_factory=RunningReplies)

    def used_bytes(self) -> int:
        """Bytes of the main file that hold data (free pages excluded)."""
        pages = int(self.conn.execute("PRAGMA page_count").fetchone()[0])
        free = int(self.conn.execute("PRAGMA freelist_count").fetchone()[0])
        return (pages - free) * self.page_size


class Op(Generic[T]):
    """A write: ``apply`` runs inside the writer's transaction and returns its result."""

    vacuum_after: ClassVar[bool] = False  # give freed pages back to the file system after the commit

    @property
    def weight(self) -> int:
        return 1

    @property
    def size_bytes(self) -> int:
        """About how many bytes it adds to the store (what a batch's size is counted in)."""
        return OP_BYTES

    @property
    def held_bytes(self) -> int:
        """About how much memory it holds while it waits (what the writer's backlog is bounded in)."""
        return self.size_bytes

    def apply(self, tx: Tx) -> T:
        raise NotImplementedError


def _rollup_params(values: dict[str, SqlValue], **extra: SqlValue) -> dict[str, SqlValue]:
    """Named parameters for a rollup upsert: the sample's columns plus its minute."""
    ts = values["ts_unix_s"]
    assert isinstance(ts, float | int)
    values.update(extra, minute_unix_s=int(ts // ROLLUP_S) * ROLLUP_S)
    return values


R = TypeVar("R")


@dataclass(frozen=True, init=False)
class RowsOp(Op[None], Generic[R]):
    """A write of a batch of rows, taken from any iterable and kept as a tuple: the op may wait in the writer's
    queue, where a generator would be spent and a list could change under it.

    It carries one record per row (at least one: an empty batch still replaces what was there); an op whose batch is
    one reading (an /api/ps snapshot, Ollama's settings) says ``per_row = False`` and weighs one record.
    """

    per_row: ClassVar[bool] = True
    rows: tuple[R, ...]

    def __init__(self, rows: Iterable[R]) -> None:
        object.__setattr__(self, "rows", tuple(rows))

    @property
    def weight(self) -> int:
        return max(1, len(self.rows)) if self.per_row else 1

    @property
    def size_bytes(self) -> int:
        return OP_BYTES * self.weight


# ---------------------------------------------------------------- requests


def _readings(conn: sqlite3.Connection, rec: RequestRecord) -> list[ProgressSample]:
    """The runner's stored readings of a finished request whose reply sends no durations (else none: not needed)."""
    if Outcome(rec.outcome) is Outcome.IN_FLIGHT or not wants_readings(rec):
        return []
    sql = f"SELECT {PROGRESS_SAMPLES.select_list()} FROM progress_samples WHERE request_id = ? ORDER BY ts_unix_s"
    return [PROGRESS_SAMPLES.from_values(v) for v in conn.execute(sql, (rec.id,)).fetchall()]


def _split(conn: sqlite3.Connection, rec: RequestRecord, sorted_gaps_ns: Sequence[int] | None = None) -> Phases:
    """The record's phases, with what the runner's readings of it bound (analysis.runner_fill)."""
    return split_with_readings(rec, _readings(conn, rec), sorted_gaps_ns)


_LAST_PIECE = "SELECT first_chunk + n_chunks FROM request_token_pieces WHERE request_id = ? ORDER BY first_chunk DESC LIMIT 1"


def _append_token_piece(conn: sqlite3.Connection, rec: RequestRecord) -> None:
    """A running request's chunk times since its last write, as one more piece (schema v22): what is new only."""
    stored = conn.execute(_LAST_PIECE, (rec.id,)).fetchone()
    n_stored, chunks = (int(stored[0]) if stored else 0), rec.token_chunk_ns
    if n_stored > len(chunks):  # never seen: a record's chunks only grow; write them again whole rather than wrong
        conn.execute("DELETE FROM request_token_pieces WHERE request_id = ?", (rec.id,))
        n_stored = 0
    if n_stored == len(chunks):
        return
    prev_ns = chunks[n_stored - 1] if n_stored else rec.received_ns
    piece = encode_token_times(prev_ns, chunks[n_stored:])
    row = RequestTokenPieceRow(rec.id, n_stored, len(chunks) - n_stored, piece)
    conn.execute(REQUEST_TOKEN_PIECES.insert_sql(), REQUEST_TOKEN_PIECES.params(row))


@dataclass(frozen=True)
class PutRequest(Op[RequestRow | None]):
    """Insert or update one request with its phases (split here, at write time) and token times.

    Keeps a snapshot: the proxy goes on changing a running request while the writer's thread writes it.
    A late in-flight progress row never replaces a finished one. Returns the row written (None: a stale
    in-flight row, not written).
    """

    record: RequestRecord

    _UPSERT: ClassVar[str] = REQUESTS.upsert_sql("id", "requests.outcome = 'in_flight' OR excluded.outcome <> 'in_flight'")

    def __post_init__(self) -> None:
        snap = copy.copy(self.record)
        snap.token_chunk_ns = list(self.record.token_chunk_ns)
        object.__setattr__(self, "record", snap)

    @property
    def size_bytes(self) -> int:
        rec = self.record
        texts = (rec.prompt_text, rec.response_text, rec.error, rec.model)
        return OP_BYTES + sum(len(t) for t in texts if t) + 8 * len(rec.token_chunk_ns)

    @property
    def held_bytes(self) -> int:
        rec = self.record
        texts = (rec.prompt_text, rec.response_text, rec.error, rec.model)
        # A str's own size (1-4 bytes a character); a token time is a list slot and an int object.
        return OP_BYTES + sum(sys.getsizeof(t) for t in texts if t) + INT_IN_LIST_BYTES * len(rec.token_chunk_ns)

    def apply(self, tx: Tx) -> RequestRow | None:
        rec = self.record
        running = Outcome(rec.outcome) is Outcome.IN_FLIGHT
        # A running request's gaps are kept sorted as they grow; a finished one's are sorted once (None), or taken
        # from what was kept while it ran.
        chunks = rec.token_chunk_ns
        gaps = tx.running.sorted_gaps(rec.id, chunks) if running else tx.running.finish(rec.id, chunks)
        row = request_row(rec, _split(tx.conn, rec, gaps), tx.now_unix_s, PHASES_VERSION)
        if tx.conn.execute(f"{self._UPSERT} RETURNING id", REQUESTS.params(row)).fetchone() is None:
            tx.running.forget(rec.id)  # a stale in-flight row for a request already finished: not followed
            return None
        if running:
            _append_token_piece(tx.conn, rec)  # what is new since its last write
        else:
            tokens = RequestTokensRow(rec.id, len(chunks), encode_token_times(rec.received_ns, chunks))
            tx.conn.execute(REQUEST_TOKENS.insert_sql("INSERT OR REPLACE"), REQUEST_TOKENS.params(tokens))
            tx.conn.execute("DELETE FROM request_token_pieces WHERE request_id = ?", (rec.id,))
        exact = row.prompt_tokens is not None and row.prompt_tokens_source in EXACT_PROMPT_SOURCES
        if exact and row.outcome != Outcome.IN_FLIGHT:
            # The runner's readings sized the prompt from a log fraction, or not at all when decoding ended between
            # two polls: the server's own count is exact.
            tx.conn.execute(
                "UPDATE progress_samples SET prompt_tokens = ? WHERE request_id = ? AND source <> ?",
                (row.prompt_tokens, rec.id, ProgressSource.ESTIMATE.value),
            )
        return row


@dataclass(frozen=True)
class DeleteDirect(Op[int]):
    """Direct rows written while their runner task ran, found to be a proxied request's after all (it showed up,
    or its figures matched): deleted, with their readings. Only rows seen from the runner. Returns how many."""

    ids: tuple[str, ...]

    def apply(self, tx: Tx) -> int:
        deleted = 0
        for rid in self.ids:
            cur = tx.conn.execute("DELETE FROM requests WHERE id = ? AND seen_from = ?", (rid, SeenFrom.RUNNER.value))
            deleted += cur.rowcount
        return deleted


@dataclass(frozen=True)
class MarkInterrupted(Op[int]):
    """At collector start: in-flight rows left by a killed collector become upstream_failed. Returns how many."""

    reason: str

    def apply(self, tx: Tx) -> int:
        # Their token times as last written, joined from their pieces into request_tokens, where every reader of a
        # finished row looks.
        ids = [
            r[0]
            for r in tx.conn.execute(
                "SELECT DISTINCT p.request_id FROM request_token_pieces p JOIN requests r ON r.id = p.request_id "
                "WHERE r.outcome = ?",
                (Outcome.IN_FLIGHT.value,),
            ).fetchall()
        ]
        for rid in ids:
            blob = join_token_pieces(tx.conn, rid)
            if blob is not None:
                tx.conn.execute(
                    "INSERT OR REPLACE INTO request_tokens (request_id, n_chunks, gaps_le_i64) VALUES (?, ?, ?)",
                    (rid, len(blob) // 8, blob),
                )
        tx.conn.execute("DELETE FROM request_token_pieces")
        cur = tx.conn.execute(
            "UPDATE requests SET outcome = ?, error = ?, updated_at_unix_s = ?, "
            "ended_at_unix_s = COALESCE(ended_at_unix_s, last_token_unix_s, ?) WHERE outcome = ?",
            (Outcome.UPSTREAM_FAILED.value, self.reason, tx.now_unix_s, tx.now_unix_s, Outcome.IN_FLIGHT.value),
        )
        return cur.rowcount


@dataclass(frozen=True)
class RederivePhases(Op[int]):
    """Derive the phases again for up to ``limit`` rows split by an older ``analysis.phases`` (oldest version first).

    Returns how many rows it re-derived; 0 when every row is current. ``updated_at_unix_s`` is kept: the
    request itself did not change.
    """

    limit: int = REDERIVE_BATCH

    def apply(self, tx: Tx) -> int:
        rows = tx.conn.execute(
            f"SELECT {REQUESTS.select_list('r.')}, t.gaps_le_i64 FROM requests r "
            "LEFT JOIN request_tokens t ON t.request_id = r.id "
            "WHERE r.phases_version < ? AND r.outcome <> 'in_flight' ORDER BY r.phases_version, r.rowid LIMIT ?",
            (PHASES_VERSION, int(self.limit)),
        ).fetchall()
        for values in rows:
            _rederive(tx.conn, values)
        return len(rows)


_REDERIVE_UPDATE = f"UPDATE requests SET {', '.join(f'{n} = :{n}' for n in REQUESTS.column_names if n != 'id')} WHERE id = :id"


# Flags the row, not the split, sets: a row read back holds the changed values and gives no reason to set them again.
_STORED_VALUE_FLAGS = (Flag.CLAMPED, Flag.INVALID_TEXT)


def _rederive(conn: sqlite3.Connection, values: Sequence[Any]) -> None:
    """Split one stored row again (its columns, then its token gaps), keeping its write time and any clamp or repair."""
    old = REQUESTS.from_values(values[:-1])
    rec = record_of(old, values[-1])
    new = request_row(rec, _split(conn, rec), old.updated_at_unix_s, PHASES_VERSION)
    for flag in _STORED_VALUE_FLAGS:  # the stored values are the clamped or repaired ones: the flag stays
        if flag in old.flags and flag not in new.flags:
            text = {**new.flag_text, flag.value: old.flag_text.get(flag.value, "")}
            new = replace(new, flags=(*new.flags, flag.value), flag_text=text)
    conn.execute(_REDERIVE_UPDATE, REQUESTS.params(new))


# ---------------------------------------------------------------- samples and polls


@dataclass(frozen=True, init=False)
class PutGpuSamples(RowsOp[GpuSample]):
    """One poll of every GPU: the raw samples and their per-minute rollups."""

    def apply(self, tx: Tx) -> None:
        params = [GPU_SAMPLES.params(s) for s in self.rows]
        tx.conn.executemany(GPU_SAMPLES.insert_sql(), params)
        tx.conn.executemany(GPU_ROLLUP_SQL, [_rollup_params(dict(p)) for p in params])


@dataclass(frozen=True)
class PutHostSample(Op[None]):
    sample: HostSample

    def apply(self, tx: Tx) -> None:
        params = HOST_SAMPLES.params(self.sample)
        tx.conn.execute(HOST_SAMPLES.insert_sql(), params)
        tx.conn.execute(HOST_ROLLUP_SQL, _rollup_params(dict(params)))


@dataclass(frozen=True, init=False)
class PutLoadedModels(RowsOp[LoadedModel]):
    """One /api/ps poll: the snapshot (also when nothing is loaded) and its models (one reading: one record)."""

    per_row = False
    ts_unix_s: float

    def __init__(self, ts_unix_s: float, models: Iterable[LoadedModel]) -> None:
        super().__init__(models)
        object.__setattr__(self, "ts_unix_s", ts_unix_s)

    def apply(self, tx: Tx) -> None:
        conn = tx.conn
        conn.execute(
            PS_SNAPSHOTS.insert_sql("INSERT OR REPLACE"), PS_SNAPSHOTS.params(PsSnapshotRow(self.ts_unix_s, len(self.rows)))
        )
        conn.execute("DELETE FROM loaded_models WHERE ts_unix_s = ?", (self.ts_unix_s,))
        # The snapshot's time, whatever the models say: one snapshot, one time.
        conn.executemany(
            LOADED_MODELS.insert_sql(), [{**LOADED_MODELS.params(m), "ts_unix_s": self.ts_unix_s} for m in self.rows]
        )


@dataclass(frozen=True, init=False)
class PutInstalledModels(RowsOp[InstalledModel]):
    """One /api/tags poll: the installed models, replacing the whole previous list (a removed model disappears)."""

    def apply(self, tx: Tx) -> None:
        tx.conn.execute("DELETE FROM installed_models")
        tx.conn.executemany(INSTALLED_MODELS.insert_sql(), [INSTALLED_MODELS.params(m) for m in self.rows])


@dataclass(frozen=True, init=False)
class PutRunners(RowsOp[RunnerFlags]):
    """The runner processes found now, with the settings on their command lines. A runner that has exited keeps
    its row (the settings that served its requests, and when they were last read); a pid used again replaces it."""

    def apply(self, tx: Tx) -> None:
        tx.conn.executemany(RUNNERS.insert_sql("INSERT OR REPLACE"), [RUNNERS.params(r) for r in self.rows])


@dataclass(frozen=True, init=False)
class PutOllamaSettings(RowsOp[OllamaSettingRow]):
    """The settings Ollama's start lines said (``collectors.ollama.prompt_fit``), replacing the previous set (one
    reading: one record)."""

    per_row = False

    def apply(self, tx: Tx) -> None:
        tx.conn.execute("DELETE FROM ollama_settings")
        tx.conn.executemany(OLLAMA_SETTINGS.insert_sql("INSERT OR REPLACE"), [OLLAMA_SETTINGS.params(r) for r in self.rows])


@dataclass(frozen=True, init=False)
class PutRunnerPlacement(RowsOp[RunnerDeviceRow]):
    """Where one runner (by port) put its model, per device, from its own load lines: replaces that port's rows."""

    port: int

    def __init__(self, port: int, rows: Iterable[RunnerDeviceRow]) -> None:
        super().__init__(rows)
        object.__setattr__(self, "port", port)

    def apply(self, tx: Tx) -> None:
        tx.conn.execute("DELETE FROM runner_devices WHERE port = ?", (self.port,))
        tx.conn.executemany(RUNNER_DEVICES.insert_sql(), [RUNNER_DEVICES.params(r) for r in self.rows])


@dataclass(frozen=True, init=False)
class PutRequestWaits(RowsOp[RequestWaitsRow]):
    """The runner's own waits before requests' prompts were read (one row per request, replaced)."""

    def apply(self, tx: Tx) -> None:
        # A row whose request is not written yet waits for the next change of its task (the reader sends it again).
        known = [r for r in self.rows if tx.conn.execute("SELECT 1 FROM requests WHERE id = ?", (r.request_id,)).fetchone()]
        tx.conn.executemany(REQUEST_WAITS.insert_sql("INSERT OR REPLACE"), [REQUEST_WAITS.params(r) for r in known])


@dataclass(frozen=True)
class PutModelInfo(Op[None]):
    """The /api/show answer of a digest (long licence and template text dropped)."""

    digest: str
    name: str
    show: Mapping[str, Any]

    def apply(self, tx: Tx) -> None:
        kept = {k: v for k, v in self.show.items() if k not in SHOW_KEYS_DROPPED}
        row = ModelInfoRow(self.digest, self.name, json.dumps(kept, default=str, sort_keys=True), tx.now_unix_s)
        tx.conn.execute(MODEL_INFO.insert_sql("INSERT OR REPLACE"), MODEL_INFO.params(row))


@dataclass(frozen=True)
class PutOllamaStatus(Op[None]):
    """The last poll of Ollama; an event row only when up/down, URL or version changed."""

    status: OllamaStatus

    def apply(self, tx: Tx) -> None:
        conn, s = tx.conn, self.status
        conn.execute(OLLAMA_LAST_POLL.insert_sql("INSERT OR REPLACE", {"id": "1"}), OLLAMA_LAST_POLL.params(s))
        last = conn.execute("SELECT up, base_url, version FROM ollama_events ORDER BY ts_unix_s DESC LIMIT 1").fetchone()
        if last is None or (bool(last[0]), last[1], last[2]) != (s.up, s.base_url, s.version):
            conn.execute(OLLAMA_EVENTS.insert_sql(), OLLAMA_EVENTS.params(s))


@dataclass(frozen=True)
class PutHeartbeat(Op[None]):
    info: CollectorInfo

    def apply(self, tx: Tx) -> None:
        tx.conn.execute(COLLECTOR_HEARTBEAT.insert_sql("INSERT OR REPLACE", {"id": "1"}), COLLECTOR_HEARTBEAT.params(self.info))


@dataclass(frozen=True)
class PutHostBandwidth(Op[None]):
    """The host's memory bandwidth as measured by the collector (the Why page reads the latest)."""

    measurement: HostBandwidth

    def apply(self, tx: Tx) -> None:
        tx.conn.execute(HOST_BANDWIDTH.insert_sql("INSERT OR REPLACE"), HOST_BANDWIDTH.params(self.measurement))


@dataclass(frozen=True, init=False)
class PutProgress(RowsOp[ProgressSample]):
    """Progress readings of running generations. A reading of a request not stored (yet) is dropped: the
    request row is written on the same collector tick, before its readings."""

    def apply(self, tx: Tx) -> None:
        sql = PROGRESS_SAMPLES.insert_sql("INSERT OR REPLACE")
        conn = tx.conn
        for sample in self.rows:
            found = conn.execute(_EXACT_PROMPT_SQL, (sample.request_id,)).fetchone()
            if found is None:
                continue
            exact = found[1]
            if exact is not None and sample.source is not ProgressSource.ESTIMATE:
                sample = replace(sample, prompt_tokens=exact)  # the finished request's own count beats a reading's
            conn.execute(sql, PROGRESS_SAMPLES.params(sample))
        # Readings drained after their request finished (the last polls, the prompt's size known once decoding
        # began): a finished /v1 row is split again with them.
        ids = sorted({s.request_id for s in self.rows if s.source is not ProgressSource.ESTIMATE})
        for rid in ids:
            values = conn.execute(
                f"SELECT {REQUESTS.select_list('r.')}, t.gaps_le_i64 FROM requests r "
                "LEFT JOIN request_tokens t ON t.request_id = r.id "
                "WHERE r.id = ? AND r.outcome <> 'in_flight' AND r.endpoint LIKE '/v1/%'",
                (rid,),
            ).fetchone()
            if values is not None:
                _rederive(conn, values)


@dataclass(frozen=True)
class PutExperiment(Op[None]):
    """Insert or replace one Lab experiment (``params`` and ``results`` are stored as JSON)."""

    id: str
    kind: str
    params: Mapping[str, Any]
    started_at_unix_s: float
    status: str
    ended_at_unix_s: float | None = None
    results: Any = None

    def apply(self, tx: Tx) -> None:
        row = ExperimentRow(
            id=self.id,
            kind=self.kind,
            params_json=json.dumps(dict(self.params), default=str),
            started_at_unix_s=self.started_at_unix_s,
            ended_at_unix_s=self.ended_at_unix_s,
            status=self.status,
            results_json=None if self.results is None else json.dumps(self.results, default=str),
        )
        tx.conn.execute(EXPERIMENTS.insert_sql("INSERT OR REPLACE"), EXPERIMENTS.params(row))


# ---------------------------------------------------------------- retention


@dataclass(frozen=True)
class ApplyRetention(Op[RetentionResult]):
    """Delete rows past their age, then the oldest rows while the store is over ``max_bytes``; then give the
    freed pages back to the file system (the hourly pass, and at start)."""

    now_unix_s: float
    vacuum_after: ClassVar[bool] = True

    def apply(self, tx: Tx) -> RetentionResult:
        conn, policy = tx.conn, tx.retention
        result = RetentionResult(used_bytes_before=tx.used_bytes())
        _delete_samples_before(conn, self.now_unix_s - policy.samples_max_age_s, result.deleted)
        _delete_requests_before(conn, self.now_unix_s - policy.requests_max_age_s, result.deleted)
        # model_info of models no longer installed, runners that exited, and host bandwidth measurements age like
        # requests (the runner that served a request stays as long as the request).
        cutoff = self.now_unix_s - policy.requests_max_age_s
        _count(result.deleted, "runners", conn.execute("DELETE FROM runners WHERE ts_unix_s < ?", (cutoff,)).rowcount)
        _count(
            result.deleted,
            "model_info",
            conn.execute(f"DELETE FROM model_info WHERE updated_at_unix_s < ? AND {_NOT_INSTALLED}", (cutoff,)).rowcount,
        )
        _count(
            result.deleted,
            "host_bandwidth",
            conn.execute(
                "DELETE FROM host_bandwidth WHERE measured_unix_s < ? AND measured_unix_s < "
                "(SELECT MAX(measured_unix_s) FROM host_bandwidth)",
                (cutoff,),
            ).rowcount,
        )
        over = tx.used_bytes() > policy.max_bytes
        _shed_to(tx, int(policy.max_bytes * policy.shed_to_fraction) if over else policy.max_bytes, result.deleted)
        result.used_bytes_after = tx.used_bytes()
        return result


@dataclass(frozen=True)
class ShedToBound(Op[RetentionResult]):
    """The size bound alone, after a commit took the store near it: the oldest rows go until the data takes
    ``shed_to_fraction`` of ``max_bytes``. Freed pages stay in the file for the next rows (no vacuum: giving them
    back only for the file to grow again cost every commit a vacuum under a flood)."""

    now_unix_s: float

    def apply(self, tx: Tx) -> RetentionResult:
        result = RetentionResult(used_bytes_before=tx.used_bytes())
        _shed_to(tx, int(tx.retention.max_bytes * tx.retention.shed_to_fraction), result.deleted)
        result.used_bytes_after = tx.used_bytes()
        return result


KEEP_NEWEST_REQUESTS = 100  # the size bound never sheds these: a store full of metadata keeps its latest requests
_NOT_INSTALLED = (
    "digest NOT IN (SELECT digest FROM installed_models) AND digest NOT IN (SELECT digest FROM loaded_models "
    "WHERE ts_unix_s = (SELECT MAX(ts_unix_s) FROM ps_snapshots))"
)
SAMPLE_TABLES = ("gpu_samples", "host_samples", "loaded_models", "ps_snapshots", "ollama_events")


def _count(deleted: dict[str, int], table: str, n: int) -> None:
    deleted[table] = deleted.get(table, 0) + n


def _delete_samples_before(conn: sqlite3.Connection, cutoff: float, deleted: dict[str, int]) -> None:
    for table in SAMPLE_TABLES:
        _count(deleted, table, conn.execute(f"DELETE FROM {table} WHERE ts_unix_s < ?", (cutoff,)).rowcount)
    for table in ("gpu_minutes", "host_minutes"):  # minutes wholly before the cutoff
        _count(deleted, table, conn.execute(f"DELETE FROM {table} WHERE minute_unix_s + ? <= ?", (ROLLUP_S, cutoff)).rowcount)


def _delete_requests_before(conn: sqlite3.Connection, cutoff: float, deleted: dict[str, int]) -> None:
    # request_tokens and progress_samples go with their rows (ON DELETE CASCADE).
    _count(deleted, "requests", conn.execute("DELETE FROM requests WHERE started_at_unix_s < ?", (cutoff,)).rowcount)
    _count(deleted, "experiments", conn.execute("DELETE FROM experiments WHERE started_at_unix_s < ?", (cutoff,)).rowcount)


def _shed_to(tx: Tx, target_bytes: int, deleted: dict[str, int]) -> None:
    """Size bound: oldest samples first, then the /api/show answers of models no longer installed, then the oldest
    requests (a tenth of the time span at a time), never the newest ``KEEP_NEWEST_REQUESTS``."""
    conn = tx.conn
    for _ in range(200):
        if tx.used_bytes() <= target_bytes:
            return
        span = conn.execute(
            "SELECT MIN(t), MAX(t) FROM (SELECT MIN(ts_unix_s) AS t FROM gpu_samples UNION ALL "
            "SELECT MAX(ts_unix_s) FROM gpu_samples UNION ALL SELECT MIN(ts_unix_s) FROM host_samples UNION ALL "
            "SELECT MAX(ts_unix_s) FROM host_samples UNION ALL SELECT MIN(ts_unix_s) FROM ps_snapshots UNION ALL "
            "SELECT MAX(ts_unix_s) FROM ps_snapshots)"
        ).fetchone()
        if span[0] is not None:
            _delete_samples_before(conn, _next_cutoff(span[0], span[1]), deleted)
            continue
        if (n := conn.execute(f"DELETE FROM model_info WHERE {_NOT_INSTALLED}").rowcount) > 0:
            _count(deleted, "model_info", n)
            continue
        span = conn.execute("SELECT MIN(started_at_unix_s), MAX(started_at_unix_s) FROM requests").fetchone()
        newest = conn.execute(
            "SELECT started_at_unix_s FROM requests ORDER BY started_at_unix_s DESC LIMIT 1 OFFSET ?",
            (KEEP_NEWEST_REQUESTS - 1,),
        ).fetchone()
        if span[0] is None or newest is None or span[0] >= newest[0]:
            return  # only the newest requests are left: what is over the bound is not theirs to pay for
        _delete_requests_before(conn, min(_next_cutoff(span[0], span[1]), newest[0]), deleted)


def _next_cutoff(t_min: float, t_max: float) -> float:
    """Cut the oldest tenth of a time span; always past the oldest row, so every step deletes something."""
    return max(t_min + (t_max - t_min) / 10.0, math.nextafter(t_min, math.inf))


def drop_superseded(ops: Sequence[Op[Any]]) -> list[Op[Any]]:
    """Within a batch, one upsert per request: the last finished one, else the last progress row.

    (A progress row snapshotted before the request finished may be queued after its final row.)
    """
    kept: dict[str, int] = {}
    for i, op in enumerate(ops):
        if isinstance(op, PutRequest):
            before = kept.get(op.record.id)
            finished_before = before is not None and _finished(ops[before])
            if not finished_before or _finished(op):
                kept[op.record.id] = i
    return [op for i, op in enumerate(ops) if not isinstance(op, PutRequest) or kept[op.record.id] == i]


def _finished(op: Op[Any]) -> bool:
    return isinstance(op, PutRequest) and Outcome(op.record.outcome) is not Outcome.IN_FLIGHT

"""Read-only queries for the pages: short, indexed, and downsampled in SQL for long windows.

Open the store with ``open_reader`` (read-only, ``mode=ro``: a reader can never write, even
by mistake); it handles every state a store can be in. Results are typed rows: the row
classes of ``store.tables`` (``RequestSummary``), ``StoredRequest`` (a record
with the phases stored for it), ``ModelInfoRow``, ``ExperimentRow``, and the record types of
``analysis.records``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from analysis.model_names import same_model
from analysis.phases import Phases
from analysis.records import (
    CollectorInfo,
    HostBandwidth,
    InstalledModel,
    LoadedModel,
    OllamaStatus,
    Outcome,
    ProgressSample,
    RequestRecord,
    RunnerFlags,
)
from analysis.reloads import LoadInput, PsRow, client_host
from analysis.runner_load_rows import placement_from_rows
from analysis.runner_placement import RunnerPlacement
from analysis.runner_wait_tasks import TaskWaits
from store.rows import phases_of, record_of
from store.schema import (
    DB_FILENAME,
    REQUEST_MINUTE_S,
    REQUEST_MINUTE_SQL,
    SCHEMA_VERSION,
    StoreError,
    StoreNotFoundError,
    schema_version,
)
from store.tables import (
    COLLECTOR_HEARTBEAT,
    EXPERIMENTS,
    HOST_BANDWIDTH,
    INSTALLED_MODELS,
    LOADED_MODELS,
    MODEL_INFO,
    OLLAMA_EVENTS,
    OLLAMA_LAST_POLL,
    OLLAMA_SETTINGS,
    PROGRESS_SAMPLES,
    REQUEST_SUMMARIES,
    REQUEST_WAITS,
    REQUESTS,
    RUNNER_DEVICES,
    RUNNERS,
    ExperimentRow,
    ModelInfoRow,
    OllamaSettingRow,
    RequestSummary,
    Table,
)

T = TypeVar("T")


def resolve_db(path: str | Path) -> Path:
    """The store file for a data folder or a file path."""
    p = Path(path)
    return p / DB_FILENAME if p.is_dir() else p


class StoreState(StrEnum):
    """What a reader finds where a store should be."""

    READY = "ready"  # this code's schema
    MISSING = "missing"  # no file yet: the collector creates it on start
    CREATING = "creating"  # a file whose schema is not written yet (v0): the collector is creating it
    OLDER = "older"  # an older schema: the collector migrates it on start
    NEWER = "newer"  # written by a newer Phasewatch
    CORRUPT = "corrupt"  # not a readable SQLite store


def folder_writable(folder: Path) -> bool:
    """Whether files can be created in ``folder`` (a WAL reader needs to create the -shm file there)."""
    return os.access(folder, os.W_OK)


def _wal_is_empty(db: Path) -> bool:
    try:
        return Path(f"{db}-wal").stat().st_size == 0
    except FileNotFoundError:
        return True


def _connect(db: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A read-only connection (``mode=ro``).

    On read-only media (a folder where the -shm file cannot be created) a WAL store cannot be opened
    that way: when no write is pending in a -wal file, the file is opened ``immutable=1`` (no -shm, no
    locks: nothing may change it meanwhile, and on read-only media nothing can).
    """
    uri = f"{db.resolve().as_uri()}?mode=ro"
    if not folder_writable(db.parent) and _wal_is_empty(db):
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    conn.row_factory = sqlite3.Row  # for ad-hoc SQL (tests, tools); the queries here read plain tuples
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return conn


def store_state(path: str | Path, *, busy_timeout_ms: int = 2000) -> StoreState:
    """The state of the store at a data folder or file, without keeping it open."""
    db = resolve_db(path)
    if not db.is_file():
        return StoreState.MISSING
    try:
        with contextlib.closing(_connect(db, busy_timeout_ms)) as conn:
            version = schema_version(conn)
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError:
        return StoreState.CORRUPT
    if version == 0:
        return StoreState.CREATING
    if version < SCHEMA_VERSION:
        return StoreState.OLDER
    return StoreState.NEWER if version > SCHEMA_VERSION else StoreState.READY


def open_readonly(path: str | Path, *, busy_timeout_ms: int = 2000) -> sqlite3.Connection:
    """A read-only connection to a store of this code's schema (a data folder or the file itself).

    Raises StoreNotFoundError when there is no store (or its schema is not written yet), StoreError
    when it cannot be read as one. The connection may be shared across threads (Streamlit reruns),
    one query at a time. ``open_reader`` is the one to use where "no store yet" is an ordinary state.
    """
    db = resolve_db(path)
    if not db.is_file():
        raise StoreNotFoundError(
            f"no Phasewatch store at {db}: the collector creates it on start (python -m collectors --data {db.parent})"
        )
    try:
        conn = _connect(db, busy_timeout_ms)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{db} is not a readable Phasewatch store: {exc}") from exc
    try:
        version = schema_version(conn)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{db} is not a readable Phasewatch store: {exc}") from exc
    if version != SCHEMA_VERSION:
        conn.close()
        if version == 0:
            raise StoreNotFoundError(f"the store at {db} is being created (its schema is not written yet)")
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"{db} has schema v{version}; this Phasewatch reads v{SCHEMA_VERSION}: start the collector to migrate"
            )
        raise StoreError(f"{db} has schema v{version}, newer than this Phasewatch (v{SCHEMA_VERSION}): upgrade Phasewatch")
    return conn


@contextlib.contextmanager
def open_reader(path: str | Path, *, busy_timeout_ms: int = 2000) -> Iterator[sqlite3.Connection | None]:
    """The one way to read the store: a read-only connection, closed on leaving.

    Yields None while there is no store yet (no file, or a file the collector has not given its
    schema yet), so that a page can show its empty state. An older schema (the collector has not
    migrated it yet), a newer one, or a file that is not a store raise StoreError, which says what to do.
    """
    try:
        conn = open_readonly(path, busy_timeout_ms=busy_timeout_ms)
    except StoreNotFoundError:
        yield None
        return
    try:
        yield conn
    finally:
        conn.close()


# ---------------------------------------------------------------- requests


@dataclass(frozen=True)
class StoredRequest:
    """A request as the proxy recorded it, with the phases stored for it (never split again by a reader)."""

    record: RequestRecord
    phases: Phases
    phases_version: int


def _rows(conn: sqlite3.Connection, sql: str, args: Sequence[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    """Plain tuples: several times cheaper than sqlite3.Row for long results."""
    cur = conn.cursor()
    cur.row_factory = None
    return cur.execute(sql, args).fetchall()


def recent_requests(
    conn: sqlite3.Connection,
    since_unix_s: float,
    model: str | None = None,
    endpoint: str | None = None,
    outcome: str | Outcome | None = None,
    limit: int = 5000,
    until_unix_s: float | None = None,
    program: str | None = None,
) -> list[RequestSummary]:
    """Requests started since ``since_unix_s``, newest first, with their phases and rates (``program``: the
    User-Agent's product, ``client_program``)."""
    where = ["started_at_unix_s >= ?"]
    args: list[Any] = [since_unix_s]
    if until_unix_s is not None:
        where.append("started_at_unix_s <= ?")
        args.append(until_unix_s)
    if model is not None:
        where.append("model = ?")
        args.append(model)
    if endpoint is not None:
        where.append("endpoint = ?")
        args.append(endpoint)
    if outcome is not None:
        where.append("outcome = ?")
        args.append(Outcome(outcome).value)
    if program is not None:
        where.append("client_program = ?")
        args.append(program)
    sql = (
        f"SELECT {REQUEST_SUMMARIES.select_list()} FROM requests WHERE {' AND '.join(where)} "
        "ORDER BY started_at_unix_s DESC LIMIT ?"
    )
    return [REQUEST_SUMMARIES.from_values(r) for r in _rows(conn, sql, [*args, int(limit)])]


# Each distinct model, one index seek apiece on requests_model_started (model, started_at_unix_s): a GROUP BY
# model read every request of the window (0.5 s for a day of 1M requests), this reads one entry per model.
_MODELS_CTE = (
    "WITH RECURSIVE m(model) AS (SELECT MIN(model) FROM requests UNION ALL "
    "SELECT (SELECT MIN(model) FROM requests WHERE model > m.model) FROM m WHERE m.model IS NOT NULL) "
)


def request_models(conn: sqlite3.Connection, since_unix_s: float = 0.0) -> list[str]:
    """Models that have requests since a moment (for filters), by name."""
    rows = conn.execute(
        f"{_MODELS_CTE} SELECT model FROM m WHERE model IS NOT NULL AND EXISTS "
        "(SELECT 1 FROM requests r WHERE r.model = m.model AND r.started_at_unix_s >= ?) ORDER BY model",
        (since_unix_s,),
    )
    return [r[0] for r in rows]


MAX_PROGRAMS_LISTED = 200  # programs a filter offers at most: each client names its own, a hostile one any number


def request_programs(conn: sqlite3.Connection, since_unix_s: float = 0.0) -> list[str]:
    """The programs (User-Agent products) that sent requests since a moment, by name, for filters; one index seek
    apiece on requests_program_started, at most ``MAX_PROGRAMS_LISTED``."""
    rows = conn.execute(
        "WITH RECURSIVE p(program) AS (SELECT MIN(client_program) FROM requests UNION ALL "
        "SELECT (SELECT MIN(client_program) FROM requests WHERE client_program > p.program) FROM p "
        "WHERE p.program IS NOT NULL) "
        "SELECT program FROM p WHERE program IS NOT NULL AND EXISTS (SELECT 1 FROM requests r "
        "WHERE r.client_program = p.program AND r.started_at_unix_s >= ?) ORDER BY program LIMIT ?",
        (since_unix_s, MAX_PROGRAMS_LISTED),
    )
    return [r[0] for r in rows]


def models_by_last_use(conn: sqlite3.Connection) -> list[str]:
    """Every model with recorded requests, the most recently used first."""
    rows = conn.execute(
        f"{_MODELS_CTE} SELECT model, (SELECT MAX(r.started_at_unix_s) FROM requests r WHERE r.model = m.model) "
        "FROM m WHERE model IS NOT NULL ORDER BY 2 DESC, 1"
    )
    return [str(r[0]) for r in rows]


_RECORD_SQL = (
    f"SELECT {REQUESTS.select_list('r.')}, t.gaps_le_i64 FROM requests r LEFT JOIN request_tokens t ON t.request_id = r.id"
)
_RECORD_SQL_NO_TOKENS = f"SELECT {REQUESTS.select_list('r.')}, NULL FROM requests r"


def join_token_pieces(conn: sqlite3.Connection, request_id: str) -> bytes | None:
    """A running request's token times as written so far, joined from its pieces (schema v22) into request_tokens'
    format; None: none written."""
    rows = conn.execute(
        "SELECT gaps_le_i64 FROM request_token_pieces WHERE request_id = ? ORDER BY first_chunk", (request_id,)
    ).fetchall()
    return b"".join(r[0] for r in rows) if rows else None


def _stored(values: Sequence[Any], conn: sqlite3.Connection | None = None) -> StoredRequest:
    """A row of ``_RECORD_SQL`` (``conn``: where a running request's token pieces are read) or of the same columns."""
    row = REQUESTS.from_values(values[:-1])
    blob = values[-1]
    if blob is None and conn is not None and Outcome(row.outcome) is Outcome.IN_FLIGHT:
        blob = join_token_pieces(conn, row.id)  # a running request's times are written piece by piece
    return StoredRequest(record_of(row, blob), phases_of(row), row.phases_version)


def request_detail(conn: sqlite3.Connection, id: str) -> StoredRequest | None:
    """One request rebuilt as the proxy recorded it, token times included, with its phases; None if unknown."""
    rows = _rows(conn, f"{_RECORD_SQL} WHERE r.id = ?", (id,))
    return _stored(rows[0], conn) if rows else None


def stored_requests(
    conn: sqlite3.Connection,
    since_unix_s: float = 0.0,
    until_unix_s: float | None = None,
    model: str | None = None,
    endpoint: str | None = None,
    outcome: str | Outcome | None = None,
    program: str | None = None,
) -> Iterator[StoredRequest]:
    """Every request started in [since, until] that matches the filters (None = any, as ``recent_requests``),
    oldest first, token times included (for export)."""
    where: list[str] = ["r.started_at_unix_s >= ?"]
    args: list[Any] = [since_unix_s]
    filters = (
        ("started_at_unix_s <=", until_unix_s),
        ("model =", model),
        ("endpoint =", endpoint),
        ("client_program =", program),
    )
    for column, value in filters:
        if value is not None:
            where.append(f"r.{column} ?")
            args.append(value)
    if outcome is not None:
        where.append("r.outcome = ?")
        args.append(Outcome(outcome).value)
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(f"{_RECORD_SQL} WHERE {' AND '.join(where)} ORDER BY r.started_at_unix_s, r.id", args)
    for values in cur:
        yield _stored(values, conn)


def in_flight_requests(conn: sqlite3.Connection, now_unix_s: float, stale_after_s: float = 30.0) -> list[RequestRecord]:
    """Requests still running, with token times so far. Rows not updated for ``stale_after_s`` are left out
    (their collector died; the next collector start marks them upstream_failed)."""
    rows = _rows(
        conn,
        f"{_RECORD_SQL} WHERE r.outcome = 'in_flight' AND r.updated_at_unix_s >= ? ORDER BY r.started_at_unix_s",
        (now_unix_s - stale_after_s,),
    )
    return [_stored(r, conn).record for r in rows]


def requests_in_window(
    conn: sqlite3.Connection,
    t0_unix_s: float,
    t1_unix_s: float,
    *,
    with_tokens: bool = False,
    limit: int = 2000,
) -> list[StoredRequest]:
    """Requests alive at some point in [t0, t1] (for phase bands under the GPU timeline), oldest first.

    Without ``with_tokens`` the records carry no ``token_chunk_ns`` (cheaper). Beyond
    ``limit`` the newest are kept.
    """
    base = _RECORD_SQL if with_tokens else _RECORD_SQL_NO_TOKENS
    args = {"t0": t0_unix_s, "t1": t1_unix_s, "limit": int(limit)}
    # Pick the newest ``limit`` rowids first, then read only those rows whole (token times included):
    # reading every row of a busy day first took seconds. Requests that started inside the window come
    # first, newest first, straight off the start-time index; when they fill ``limit``, any request that
    # started before t0 is older than all of them and would be cut anyway.
    picked = [
        r[0]
        for r in _rows(
            conn,
            "SELECT rowid FROM requests WHERE started_at_unix_s BETWEEN :t0 AND :t1 "
            "AND (ended_at_unix_s >= :t0 OR outcome = 'in_flight') ORDER BY started_at_unix_s DESC LIMIT :limit",
            args,
        )
    ]
    if len(picked) < limit:
        # Two index range scans: finished requests that ended after t0, and those still in flight.
        picked = [
            r[0]
            for r in _rows(
                conn,
                "SELECT rowid FROM ("
                "SELECT rowid, started_at_unix_s FROM requests WHERE ended_at_unix_s >= :t0 AND started_at_unix_s <= :t1 "
                "UNION ALL SELECT rowid, started_at_unix_s FROM requests WHERE outcome = 'in_flight' AND started_at_unix_s <= :t1"
                ") ORDER BY started_at_unix_s DESC LIMIT :limit",
                args,
            )
        ]
    if not picked:
        return []
    rows = _rows(
        conn,
        f"{base} WHERE r.rowid IN (SELECT value FROM json_each(?)) ORDER BY r.started_at_unix_s DESC",
        (json.dumps(picked),),
    )
    return [_stored(r, conn if with_tokens else None) for r in reversed(rows)]


# A direct record timed from /slots readings alone enters the rate charts and medians only when both its prefill
# and its decode time are known this closely (their bounds over their values): a poll interval over a short
# prefill would be a guess. Proxied records and direct ones timed by the runner's log are exact.
RATE_BOUND_MAX_FRACTION = 0.05


def rate_rows(conn: sqlite3.Connection, model: str, since_unix_s: float, limit: int = 5000) -> list[RequestSummary]:
    """Each finished request of a model with final metrics, newest first (the Why page's rate charts): proxied,
    and direct ones with exact figures (or bounded within RATE_BOUND_MAX_FRACTION)."""
    return [
        REQUEST_SUMMARIES.from_values(r)
        for r in _rows(
            conn,
            f"SELECT {REQUEST_SUMMARIES.select_list()} FROM requests "
            "WHERE model = ? AND started_at_unix_s >= ? AND outcome = 'ok' AND has_metrics = 1 "
            "AND (seen_from = 'proxy' OR runner_source = 'log' OR (prefill_bound_s <= ? * prefill_s "
            "AND decode_bound_s <= ? * decode_s)) "
            "ORDER BY started_at_unix_s DESC LIMIT ?",
            (model, since_unix_s, RATE_BOUND_MAX_FRACTION, RATE_BOUND_MAX_FRACTION, int(limit)),
        )
    ]


# ---------------------------------------------------------------- Ollama and the collector


def latest_loaded_models(conn: sqlite3.Connection) -> list[LoadedModel]:
    """Models in the latest /api/ps snapshot ([] when nothing is loaded or nothing was polled yet)."""
    rows = _rows(
        conn,
        f"SELECT {LOADED_MODELS.select_list()} FROM loaded_models "
        "WHERE ts_unix_s = (SELECT MAX(ts_unix_s) FROM ps_snapshots) ORDER BY name",
        (),
    )
    return [LOADED_MODELS.from_values(r) for r in rows]


def loaded_since(conn: sqlite3.Connection, since_unix_s: float) -> dict[str, float]:
    """Each model /api/ps listed since ``since_unix_s`` → the first snapshot that listed it (both spellings)."""
    out: dict[str, float] = {}
    for name, model, first in _rows(
        conn, "SELECT name, model, MIN(ts_unix_s) FROM loaded_models WHERE ts_unix_s >= ? GROUP BY name, model", (since_unix_s,)
    ):
        for key in (name, model):
            out[key] = min(out.get(key, first), first)
    return out


def installed_models(conn: sqlite3.Connection) -> list[InstalledModel]:
    """Models Ollama has installed as /api/tags last listed them, newest first ([] before the first poll)."""
    rows = _rows(
        conn,
        f"SELECT {INSTALLED_MODELS.select_list()} FROM installed_models "
        "ORDER BY modified_at_unix_s IS NULL, modified_at_unix_s DESC, name",
        (),
    )
    return [INSTALLED_MODELS.from_values(r) for r in rows]


def runners(conn: sqlite3.Connection) -> list[RunnerFlags]:
    """The runner processes the collector has read, running or exited since, with their command lines' settings,
    the most recently read first ([] before any)."""
    rows = _rows(conn, f"SELECT {RUNNERS.select_list()} FROM runners ORDER BY ts_unix_s DESC, pid", ())
    return [RUNNERS.from_values(r) for r in rows]


def ollama_settings(conn: sqlite3.Connection) -> list[OllamaSettingRow]:
    """The settings Ollama's start lines said (collectors.ollama.prompt_fit), by name; [] when none was read."""
    try:
        got = conn.execute(f"SELECT {OLLAMA_SETTINGS.select_list()} FROM ollama_settings ORDER BY name").fetchall()
    except sqlite3.OperationalError:  # a store older than v15, opened read-only
        return []
    return [OLLAMA_SETTINGS.from_values(v) for v in got]


def runner_for(conn: sqlite3.Connection, model: str, digest: str | None) -> RunnerFlags | None:
    """The runner that served this model most recently read, running now or exited since: by its blob's digest,
    else by the /api/ps name it was matched to."""
    found = runners(conn)
    bare = digest.removeprefix("sha256:") if digest else None
    by_digest = [r for r in found if bare and r.digest and r.digest.removeprefix("sha256:") == bare]
    by_name = [r for r in found if r.model and same_model(r.model, model)]
    return next(iter(by_digest or by_name), None)


def runner_placement(
    conn: sqlite3.Connection, model: str, digest: str | None, port: int | None = None
) -> tuple[RunnerPlacement, float, str] | None:
    """Where the runner of this model put it, from its own load lines: (placement, when read, source).

    ``port``: the runner serving it now; only its own lines count (an earlier load's may have had other settings).
    Without one (none running, or none found), the newest load of the model: by digest, else by the /api/ps name."""
    rows = [RUNNER_DEVICES.from_values(r) for r in _rows(conn, f"SELECT {RUNNER_DEVICES.select_list()} FROM runner_devices", ())]
    bare = digest.removeprefix("sha256:") if digest else None
    if port is not None:
        mine = [r for r in rows if r.port == port]
    else:
        mine = [r for r in rows if bare and r.digest and r.digest.removeprefix("sha256:") == bare] or [
            r for r in rows if r.model and same_model(r.model, model)
        ]
    if not mine:
        return None
    newest = max(mine, key=lambda r: r.ts_unix_s)
    one = [r for r in mine if r.port == newest.port]
    placement = placement_from_rows(one)
    return (placement, newest.ts_unix_s, newest.source) if placement is not None else None


def loaded_model(conn: sqlite3.Connection, name: str) -> LoadedModel | None:
    """The model of that name (any spelling of it) in the latest /api/ps snapshot; None when not loaded."""
    return next((m for m in latest_loaded_models(conn) if same_model(m.name, name) or same_model(m.model, name)), None)


def model_choices(conn: sqlite3.Connection) -> list[str]:
    """Models with recorded requests (the most recently used first), then loaded ones not among them."""
    names = models_by_last_use(conn)
    for m in latest_loaded_models(conn):
        if not any(same_model(m.name, n) or same_model(m.model, n) for n in names):
            names.append(m.name)
    return names


def _one(conn: sqlite3.Connection, table: Table[T], tail: str) -> T | None:
    """The first row of ``SELECT <table's row columns> FROM <table> <tail>``, or None."""
    rows = _rows(conn, f"SELECT {table.select_list()} FROM {table.name} {tail}", ())
    return table.from_values(rows[0]) if rows else None


def latest_ps_snapshot_unix_s(conn: sqlite3.Connection) -> float | None:
    """When /api/ps was last polled successfully (None: never)."""
    (ts,) = conn.execute("SELECT MAX(ts_unix_s) FROM ps_snapshots").fetchone()
    return None if ts is None else float(ts)


def latest_ollama_status(conn: sqlite3.Connection) -> OllamaStatus | None:
    """The last poll of Ollama (None: the collector never polled)."""
    return _one(conn, OLLAMA_LAST_POLL, "WHERE id = 1")


def ollama_events(conn: sqlite3.Connection, t0_unix_s: float, t1_unix_s: float) -> list[OllamaStatus]:
    """Up/down (and version) changes in [t0, t1], oldest first, led by the state in force at t0."""
    cols = OLLAMA_EVENTS.select_list()
    rows = _rows(
        conn,
        f"SELECT * FROM (SELECT {cols} FROM ollama_events WHERE ts_unix_s < ? ORDER BY ts_unix_s DESC LIMIT 1) "
        f"UNION ALL SELECT {cols} FROM ollama_events WHERE ts_unix_s BETWEEN ? AND ? ORDER BY ts_unix_s",
        (t0_unix_s, t0_unix_s, t1_unix_s),
    )
    return [OLLAMA_EVENTS.from_values(r) for r in rows]


def ollama_down_since(conn: sqlite3.Connection) -> float | None:
    """When Ollama went down: the first failed poll after the last one that answered (None: it is up, or
    never went down as far as the kept events reach)."""
    row = conn.execute(
        "SELECT MIN(ts_unix_s) FROM ollama_events WHERE up = 0 "
        "AND ts_unix_s > COALESCE((SELECT MAX(ts_unix_s) FROM ollama_events WHERE up = 1), -1e300)"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def latest_heartbeat(conn: sqlite3.Connection) -> CollectorInfo | None:
    """The collector's last heartbeat (compare ``ts_unix_s`` with now to tell whether it is alive)."""
    return _one(conn, COLLECTOR_HEARTBEAT, "WHERE id = 1")


def latest_host_bandwidth(conn: sqlite3.Connection) -> HostBandwidth | None:
    """The collector's latest measurement of this host's memory bandwidth (None: not measured yet)."""
    return _one(conn, HOST_BANDWIDTH, "ORDER BY measured_unix_s DESC LIMIT 1")


def model_infos(conn: sqlite3.Connection) -> list[ModelInfoRow]:
    """Every stored /api/show answer (one per digest), newest first."""
    sql = f"SELECT {MODEL_INFO.select_list()} FROM model_info ORDER BY updated_at_unix_s DESC"
    return [MODEL_INFO.from_values(r) for r in _rows(conn, sql, ())]


def model_info(conn: sqlite3.Connection, name: str) -> ModelInfoRow | None:
    """The /api/show answer for a model name (any spelling: ``llama3.2`` finds ``llama3.2:latest``).

    None when the collector has not fetched it yet.
    """
    # One row per digest: a handful of rows, so the names are compared here, by the one rule.
    rows = model_infos(conn)
    hit = next((r for r in rows if same_model(r.name, name)), None)
    if hit is None:
        # One row per digest keeps one name; an alias of the same weights is found through /api/ps or /api/tags.
        digests = _rows(conn, "SELECT name, model, digest FROM loaded_models ORDER BY ts_unix_s DESC", ())
        digests += _rows(conn, "SELECT name, model, digest FROM installed_models", ())
        digest = next((d for n, m, d in digests if same_model(n, name) or same_model(m, name)), None)
        hit = next((r for r in rows if r.digest == digest), None)
    return hit


def experiment_rows(conn: sqlite3.Connection, kind: str | None = None, limit: int = 500) -> list[ExperimentRow]:
    """Lab experiments, newest first."""
    sql = f"SELECT {EXPERIMENTS.select_list()} FROM experiments"
    args: list[Any] = []
    if kind is not None:
        sql += " WHERE kind = ?"
        args.append(kind)
    return [
        EXPERIMENTS.from_values(r) for r in _rows(conn, f"{sql} ORDER BY started_at_unix_s DESC LIMIT ?", [*args, int(limit)])
    ]


def progress_samples(conn: sqlite3.Connection, request_ids: Sequence[str]) -> dict[str, list[ProgressSample]]:
    """The progress readings of these requests, oldest first, by request id (a request without any: absent)."""
    out: dict[str, list[ProgressSample]] = {}
    ids = list(dict.fromkeys(request_ids))
    for start in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        sql = f"SELECT {PROGRESS_SAMPLES.select_list()} FROM progress_samples WHERE request_id IN ({marks}) ORDER BY ts_unix_s"
        for values in _rows(conn, sql, chunk):
            sample = PROGRESS_SAMPLES.from_values(values)
            out.setdefault(sample.request_id, []).append(sample)
    return out


@dataclass(frozen=True)
class PromptHistoryRow:
    """One finished request's prompt: its characters, tokens and prefill rate (for the live prefill estimate)."""

    prompt_chars: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    prefill_tok_s: float | None


def prompt_history(conn: sqlite3.Connection, model: str, limit: int = 200) -> list[PromptHistoryRow]:
    """The newest finished requests of a model that have Ollama's prompt count, newest first."""
    rows = _rows(
        conn,
        "SELECT prompt_chars, prompt_tokens, cached_tokens, prefill_tok_s FROM requests "
        "WHERE model = ? AND outcome = 'ok' AND prompt_tokens IS NOT NULL ORDER BY started_at_unix_s DESC LIMIT ?",
        (model, int(limit)),
    )
    return [PromptHistoryRow(*r) for r in rows]


def requests_started_count(conn: sqlite3.Connection, since_unix_s: float, until_unix_s: float) -> int:
    """How many requests started in ``[since, until]`` (in flight included).

    The minutes wholly inside come from ``request_minutes`` (kept by the store's triggers as rows are written and
    deleted); only the two minutes at the ends are counted row by row: a day of 1M requests read every index
    entry of the day (0.2 s), this reads ~1,440 summary rows and two minutes of requests.
    """
    if until_unix_s < since_unix_s:
        return 0
    minute = REQUEST_MINUTE_SQL.format(t="?")
    m0, m1 = conn.execute(f"SELECT {minute}, {minute}", (float(since_unix_s), float(until_unix_s))).fetchone()
    # Every start in [since, until] has a minute from m0 to m1 (the minute of a time never falls as the time grows),
    # and every start whose minute lies strictly between them is inside: those are summed, the ends' are counted.
    (n,) = conn.execute(
        "SELECT (SELECT TOTAL(n) FROM request_minutes WHERE minute_unix_s > :m0 AND minute_unix_s < :m1) "
        "+ (SELECT COUNT(*) FROM requests WHERE started_at_unix_s BETWEEN :a AND MIN(:b, :m0 + :slack) "
        f"AND {REQUEST_MINUTE_SQL.format(t='started_at_unix_s')} = :m0) "
        "+ (SELECT COUNT(*) FROM requests WHERE :m1 > :m0 AND started_at_unix_s BETWEEN MAX(:a, :m1 - 1) AND :b "
        f"AND {REQUEST_MINUTE_SQL.format(t='started_at_unix_s')} = :m1)",
        {"a": since_unix_s, "b": until_unix_s, "m0": m0, "m1": m1, "slack": REQUEST_MINUTE_S + 1},
    ).fetchone()
    return int(n)


def last_load_s(conn: sqlite3.Connection, model: str, min_load_s: float = 0.1) -> float | None:
    """How long the model's latest real load took (a load shorter than ``min_load_s`` found it in memory)."""
    row = conn.execute(
        "SELECT load_s FROM requests WHERE model = ? AND load_s >= ? ORDER BY started_at_unix_s DESC LIMIT 1",
        (model, min_load_s),
    ).fetchone()
    return None if row is None else float(row[0])


@dataclass(frozen=True)
class ProgramCounts:
    """Finished requests per program (User-Agent product) in a window: the most frequent named, the rest counted."""

    named: list[tuple[str, int]]  # (program, requests), most requests first, at most the ``most`` asked for
    others: int  # programs not named, beyond ``most``
    others_requests: int
    unknown_requests: int  # requests naming no program (no User-Agent with a product, or direct)


def program_counts(conn: sqlite3.Connection, since_unix_s: float, most: int) -> ProgramCounts:
    """Finished requests since ``since_unix_s`` per program; each group read once, never all kept in memory."""
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(
        "SELECT client_program, COUNT(*) FROM requests WHERE started_at_unix_s >= ? AND outcome != 'in_flight' "
        "GROUP BY client_program ORDER BY 2 DESC, 1",
        (since_unix_s,),
    )
    named: list[tuple[str, int]] = []
    others = others_requests = unknown = 0
    for program, n in cur:
        if program is None:
            unknown = int(n)
        elif len(named) < most:
            named.append((str(program), int(n)))
        else:
            others += 1
            others_requests += int(n)
    return ProgramCounts(named, others, others_requests, unknown)


def load_inputs(conn: sqlite3.Connection, since_unix_s: float) -> list[LoadInput]:
    """Finished requests since ``since_unix_s`` as ``analysis.reloads`` reads them (no text)."""
    rows = _rows(
        conn,
        "SELECT id, model, started_at_unix_s, ended_at_unix_s, client_addr, num_ctx, load_s, kind, status_code, error "
        "FROM requests WHERE started_at_unix_s >= ? AND outcome != 'in_flight' ORDER BY started_at_unix_s",
        (since_unix_s,),
    )
    return [
        LoadInput(id_, model, start, end, client_host(client), num_ctx, load_s, kind, status, error)
        for id_, model, start, end, client, num_ctx, load_s, kind, status, error in rows
    ]


def ps_history(conn: sqlite3.Connection, since_unix_s: float) -> tuple[list[PsRow], list[float]]:
    """The /api/ps snapshots since ``since_unix_s``: (one row per listed model, every poll's time, empty ones too)."""
    ps = [
        PsRow(ts, name, ctx, expires)
        for ts, name, ctx, expires in _rows(
            conn,
            "SELECT ts_unix_s, name, context_length, expires_at_unix_s FROM loaded_models WHERE ts_unix_s >= ? "
            "ORDER BY ts_unix_s",
            (since_unix_s,),
        )
    ]
    times = [t for (t,) in _rows(conn, "SELECT ts_unix_s FROM ps_snapshots WHERE ts_unix_s >= ? ORDER BY 1", (since_unix_s,))]
    return ps, times


def flag_counts(conn: sqlite3.Connection, since_unix_s: float) -> dict[str, int]:
    """Each request flag code → how many finished requests since ``since_unix_s`` carry it."""
    rows = _rows(
        conn,
        "SELECT j.value, COUNT(*) FROM requests r, json_each(r.flags) j "
        "WHERE r.started_at_unix_s >= ? AND r.outcome != 'in_flight' GROUP BY j.value ORDER BY 2 DESC",
        (since_unix_s,),
    )
    return {str(code): int(n) for code, n in rows}


def request_waits(conn: sqlite3.Connection, request_ids: Sequence[str]) -> dict[str, TaskWaits]:
    """The runner's own waits before each of these requests' prompts was read, by request id (absent: none stored)."""
    out: dict[str, TaskWaits] = {}
    ids = list(dict.fromkeys(request_ids))
    for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT {REQUEST_WAITS.select_list()} FROM request_waits WHERE request_id IN ({marks})"
        for r in _rows(conn, sql, tuple(chunk)):
            row = REQUEST_WAITS.from_values(r)
            try:
                out[row.request_id] = row.waits
            except (ValueError, TypeError, KeyError):
                continue  # a row this version cannot read: as if none were stored
    return out

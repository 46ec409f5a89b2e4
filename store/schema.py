"""SQLite schema of the store: DDL, ordered migrations, connection settings.

One file ``<data_dir>/phasewatch.sqlite3`` in WAL mode: one writer (the collector),
many short read-only readers (the pages). ``PRAGMA user_version`` holds the schema
version; ``migrate`` applies every missing step in order, each in one transaction.

Times: ``*_unix_s`` are wall-clock seconds (REAL) and carry every index used for
windows; ``*_ns`` are the collector's monotonic nanoseconds, kept to rebuild records.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DB_FILENAME = "phasewatch.sqlite3"


class StoreError(RuntimeError):
    """The store cannot be used as asked (missing, too new, not a Phasewatch store)."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store file where one was expected."""


def db_path(data_dir: str | Path) -> Path:
    """The store's file inside a data folder."""
    return Path(data_dir) / DB_FILENAME


_V1 = """
CREATE TABLE gpu_samples (
    ts_unix_s REAL NOT NULL,
    gpu_index INTEGER NOT NULL,
    name TEXT NOT NULL,
    uuid TEXT NOT NULL,
    util_gpu_pct REAL, util_mem_pct REAL,
    mem_used_bytes INTEGER, mem_total_bytes INTEGER,
    power_w REAL, power_limit_w REAL, energy_j REAL, temperature_c REAL,
    sm_clock_mhz INTEGER, sm_clock_max_mhz INTEGER, mem_clock_mhz INTEGER, mem_clock_max_mhz INTEGER,
    mem_bus_width_bits INTEGER, pcie_tx_bytes_s REAL, pcie_rx_bytes_s REAL,
    pstate INTEGER, throttle_reasons INTEGER, ollama_mem_bytes INTEGER,
    simulated INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX gpu_samples_ts ON gpu_samples(ts_unix_s);

CREATE TABLE host_samples (
    ts_unix_s REAL NOT NULL,
    cpu_pct REAL NOT NULL,
    mem_used_bytes INTEGER NOT NULL,
    mem_total_bytes INTEGER NOT NULL,
    ollama_cpu_pct REAL, ollama_rss_bytes INTEGER, disk_read_bytes_s REAL
);
CREATE INDEX host_samples_ts ON host_samples(ts_unix_s);

-- One row per /api/ps poll (also when nothing is loaded), models in loaded_models.
CREATE TABLE ps_snapshots (
    ts_unix_s REAL PRIMARY KEY,
    n_models INTEGER NOT NULL
);
CREATE TABLE loaded_models (
    ts_unix_s REAL NOT NULL,
    name TEXT NOT NULL, model TEXT NOT NULL, digest TEXT NOT NULL,
    size_bytes INTEGER NOT NULL, size_vram_bytes INTEGER NOT NULL,
    context_length INTEGER, expires_at_unix_s REAL,
    parameter_size TEXT, quantization_level TEXT, family TEXT
);
CREATE INDEX loaded_models_ts ON loaded_models(ts_unix_s);

CREATE TABLE model_info (
    digest TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    show_json TEXT NOT NULL,  -- /api/show minus license, modelfile, template
    updated_at_unix_s REAL NOT NULL
);
CREATE INDEX model_info_name ON model_info(name);

-- Up/down (and version) changes only; the last poll is in ollama_last_poll.
CREATE TABLE ollama_events (
    ts_unix_s REAL NOT NULL,
    up INTEGER NOT NULL,
    base_url TEXT NOT NULL,
    version TEXT,
    error TEXT
);
CREATE INDEX ollama_events_ts ON ollama_events(ts_unix_s);
CREATE TABLE ollama_last_poll (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    ts_unix_s REAL NOT NULL, up INTEGER NOT NULL, base_url TEXT NOT NULL, version TEXT, error TEXT
);

CREATE TABLE collector_heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    ts_unix_s REAL NOT NULL, pid INTEGER NOT NULL, listen TEXT NOT NULL, ollama_url TEXT NOT NULL,
    data_dir TEXT NOT NULL, gpu_state TEXT NOT NULL, gpu_message TEXT,
    demo INTEGER NOT NULL, record_text INTEGER NOT NULL
);

CREATE TABLE requests (
    id TEXT PRIMARY KEY,
    started_at_unix_s REAL NOT NULL,
    client_addr TEXT NOT NULL, endpoint TEXT NOT NULL, model TEXT NOT NULL, stream INTEGER NOT NULL,
    num_ctx INTEGER, num_predict INTEGER, keep_alive TEXT,
    received_ns INTEGER NOT NULL, forwarded_ns INTEGER, first_byte_ns INTEGER, first_token_ns INTEGER,
    final_chunk_ns INTEGER, closed_ns INTEGER,
    status_code INTEGER, outcome TEXT NOT NULL, error TEXT,
    has_metrics INTEGER NOT NULL DEFAULT 0,
    total_duration_ns INTEGER, load_duration_ns INTEGER, prompt_eval_count INTEGER,
    prompt_eval_cached_count INTEGER, prompt_eval_duration_ns INTEGER,
    eval_count INTEGER, eval_duration_ns INTEGER, done_reason TEXT,
    prompt_text TEXT, response_text TEXT,
    -- Derived by analysis.phases.split_record at write time, for fast page queries.
    updated_at_unix_s REAL NOT NULL,      -- wall clock of the last write of this row
    ended_at_unix_s REAL,                 -- final chunk, else close
    last_token_unix_s REAL,
    tokens_so_far INTEGER NOT NULL DEFAULT 0,
    total_s REAL, load_s REAL, prefill_s REAL, decode_s REAL, queue_s REAL, transport_s REAL,
    ttft_s REAL, client_s REAL,
    prompt_tokens INTEGER, cached_tokens INTEGER, output_tokens INTEGER,
    prefill_tok_s REAL, decode_tok_s REAL, ollama_prefill_tok_s REAL, ollama_decode_tok_s REAL,
    itl_p50_ms REAL, itl_p99_ms REAL, itl_max_ms REAL,
    flags TEXT NOT NULL DEFAULT '[]'      -- JSON list of analysis.phases flag codes
);
CREATE INDEX requests_started ON requests(started_at_unix_s);
CREATE INDEX requests_model_started ON requests(model, started_at_unix_s);
CREATE INDEX requests_in_flight ON requests(outcome) WHERE outcome = 'in_flight';

-- Token chunk times, compact: little-endian int64 gaps (ns); the first is from received_ns.
CREATE TABLE request_tokens (
    request_id TEXT PRIMARY KEY REFERENCES requests(id) ON DELETE CASCADE,
    n_chunks INTEGER NOT NULL,
    gaps_le_i64 BLOB NOT NULL
);
"""

# v2: the Lab's experiments, and phase boundaries in wall time for the GPU timeline bands.
_V2 = """
CREATE TABLE experiments (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    params_json TEXT NOT NULL,
    started_at_unix_s REAL NOT NULL,
    ended_at_unix_s REAL,
    status TEXT NOT NULL,
    results_json TEXT
);
CREATE INDEX experiments_started ON experiments(started_at_unix_s);
ALTER TABLE requests ADD COLUMN load_start_unix_s REAL;
ALTER TABLE requests ADD COLUMN prefill_start_unix_s REAL;
ALTER TABLE requests ADD COLUMN decode_start_unix_s REAL;
ALTER TABLE requests ADD COLUMN decode_end_unix_s REAL;
CREATE INDEX requests_ended ON requests(ended_at_unix_s);
"""


# How per-minute rollups (v3) summarise each sample field: the mean for rates and levels,
# the peak for memory, limits, counters and states (pstate: the highest number = the lowest
# performance state seen; throttle_reasons: the largest mask, SQLite has no bitwise-OR aggregate).
GPU_MEAN_FIELDS = (
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "temperature_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
)
GPU_PEAK_FIELDS = (
    "mem_used_bytes",
    "mem_total_bytes",
    "power_limit_w",
    "energy_j",
    "sm_clock_max_mhz",
    "mem_clock_max_mhz",
    "mem_bus_width_bits",
    "pstate",
    "throttle_reasons",
    "ollama_mem_bytes",
)
HOST_MEAN_FIELDS = ("cpu_pct", "ollama_cpu_pct", "disk_read_bytes_s")
HOST_PEAK_FIELDS = ("mem_used_bytes", "mem_total_bytes", "ollama_rss_bytes")
ROLLUP_S = 60  # one rollup row per minute (per GPU)


def _rollup_columns(mean_fields: tuple[str, ...], peak_fields: tuple[str, ...]) -> str:
    cols = [f"{f}_sum REAL NOT NULL DEFAULT 0, {f}_n INTEGER NOT NULL DEFAULT 0" for f in mean_fields]
    cols += [f"{f}_peak REAL" for f in peak_fields]
    return ",\n    ".join(cols)


# v3: per-minute rollups of the samples, so that a day-long chart reads 1,440 rows, not 86,400.
_V3 = f"""
CREATE TABLE gpu_minutes (
    minute_unix_s INTEGER NOT NULL,
    gpu_index INTEGER NOT NULL,
    name TEXT NOT NULL,
    uuid TEXT NOT NULL,
    n INTEGER NOT NULL,
    ts_sum REAL NOT NULL,
    simulated INTEGER NOT NULL DEFAULT 0,
    {_rollup_columns(GPU_MEAN_FIELDS, GPU_PEAK_FIELDS)},
    PRIMARY KEY (minute_unix_s, gpu_index)
) WITHOUT ROWID;
CREATE TABLE host_minutes (
    minute_unix_s INTEGER PRIMARY KEY,
    n INTEGER NOT NULL,
    ts_sum REAL NOT NULL,
    {_rollup_columns(HOST_MEAN_FIELDS, HOST_PEAK_FIELDS)}
);
"""


def rollup_upsert_sql(
    table: str, keys: tuple[str, ...], mean_fields: tuple[str, ...], peak_fields: tuple[str, ...], extra: tuple[str, ...] = ()
) -> str:
    """INSERT … ON CONFLICT that folds one sample (named parameters = sample fields) into its minute row."""
    cols = [*keys, *extra, "n", "ts_sum"]
    vals = [f":{k}" for k in (*keys, *extra)] + ["1", ":ts_unix_s"]
    sets = ["n = n + 1", "ts_sum = ts_sum + excluded.ts_sum"] + [f"{e} = excluded.{e}" for e in extra]
    for f in mean_fields:
        cols += [f"{f}_sum", f"{f}_n"]
        vals += [f"COALESCE(:{f}, 0)", f"(:{f} IS NOT NULL)"]
        sets += [f"{f}_sum = {f}_sum + excluded.{f}_sum", f"{f}_n = {f}_n + excluded.{f}_n"]
    for f in peak_fields:
        cols.append(f"{f}_peak")
        vals.append(f":{f}")
        # Two-argument MAX is NULL when either side is: compare only what is known.
        sets.append(f"{f}_peak = MAX(COALESCE({f}_peak, excluded.{f}_peak), COALESCE(excluded.{f}_peak, {f}_peak))")
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(vals)}) "
        f"ON CONFLICT({', '.join(keys)}) DO UPDATE SET {', '.join(sets)}"
    )


GPU_ROLLUP_SQL = rollup_upsert_sql(
    "gpu_minutes", ("minute_unix_s", "gpu_index"), GPU_MEAN_FIELDS, GPU_PEAK_FIELDS, extra=("name", "uuid", "simulated")
)
HOST_ROLLUP_SQL = rollup_upsert_sql("host_minutes", ("minute_unix_s",), HOST_MEAN_FIELDS, HOST_PEAK_FIELDS)


def _v3_backfill() -> tuple[str, ...]:
    """The v3 statements that fill the new minute rows from the samples already stored."""
    minute = f"CAST(ts_unix_s / {ROLLUP_S} AS INTEGER) * {ROLLUP_S}"
    out = []
    for table, src, keys, extra, means, peaks in (
        ("gpu_minutes", "gpu_samples", ("gpu_index",), ("name", "uuid", "simulated"), GPU_MEAN_FIELDS, GPU_PEAK_FIELDS),
        ("host_minutes", "host_samples", (), (), HOST_MEAN_FIELDS, HOST_PEAK_FIELDS),
    ):
        cols = ["minute_unix_s", *keys, *extra, "n", "ts_sum"]
        sel = [minute, *keys, *(f"MAX({e})" for e in extra), "COUNT(*)", "SUM(ts_unix_s)"]
        for f in means:
            cols += [f"{f}_sum", f"{f}_n"]
            sel += [f"TOTAL({f})", f"COUNT({f})"]
        for f in peaks:
            cols.append(f"{f}_peak")
            sel.append(f"MAX({f})")
        out.append(
            f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(sel)} FROM {src} GROUP BY {', '.join([minute, *keys])}"
        )
    return tuple(out)


def _run_steps(*steps: str) -> Callable[[sqlite3.Connection], None]:
    def step(conn: sqlite3.Connection) -> None:
        # executescript would COMMIT first; run statement by statement inside our transaction.
        for sql in steps:
            for stmt in _statements(sql):
                conn.execute(stmt)

    return step


@dataclass(frozen=True)
class Migration:
    """One schema step: a name that says what it does, the SQL text it runs, and how it runs it.

    ``steps`` is what identifies a shipped migration (``sha256``): a store already past it never runs it again, so
    its text must never change; tests/store/test_store_migrations_frozen.py holds the recorded checksums.
    """

    name: str
    steps: tuple[str, ...]
    run: Callable[[sqlite3.Connection], None]

    def __call__(self, conn: sqlite3.Connection) -> None:
        self.run(conn)

    @property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for text in self.steps:
            digest.update(text.encode())
            digest.update(b"\0")  # so that moving text from one step to the next changes the sum
        return digest.hexdigest()


def _sql(name: str, *steps: str) -> Migration:
    """A migration that is its SQL alone, run statement by statement."""
    return Migration(name, steps, _run_steps(*steps))


def _statements(sql: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf)
            buf = ""
    if buf.strip() and not buf.strip().startswith("--"):
        out.append(buf)
    return out


# v4: the version of the phase split a requests row was derived with (0: before versions were kept; the
# collector re-derives such rows in the background) and the rest of the split (boundaries on the record's
# clock, the flags' text), so that readers never split again; and the host's memory bandwidth the collector
# measured.
_V4 = """
ALTER TABLE requests ADD COLUMN phases_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN load_start_ns INTEGER;
ALTER TABLE requests ADD COLUMN load_end_ns INTEGER;
ALTER TABLE requests ADD COLUMN prefill_start_ns INTEGER;
ALTER TABLE requests ADD COLUMN decode_start_ns INTEGER;
ALTER TABLE requests ADD COLUMN decode_end_ns INTEGER;
ALTER TABLE requests ADD COLUMN phases_done_reason TEXT;
ALTER TABLE requests ADD COLUMN flag_text TEXT NOT NULL DEFAULT '{}';
CREATE INDEX requests_phases_version ON requests(phases_version);
CREATE TABLE host_bandwidth (
    measured_unix_s REAL PRIMARY KEY,
    bandwidth_bytes_s REAL NOT NULL,
    buffer_bytes INTEGER NOT NULL,
    threads INTEGER NOT NULL,
    runs INTEGER NOT NULL,
    cpu_count INTEGER NOT NULL,
    mem_total_bytes INTEGER NOT NULL,
    method TEXT NOT NULL
);
"""

# v5: progress readings of running generations (the runner's /slots, Ollama's log, or an estimate), so the
# Live page can draw a prompt being read and Requests can show how prefill went. Rows go with their request.
_V5 = """
CREATE TABLE progress_samples (
    request_id TEXT NOT NULL REFERENCES requests(id) ON DELETE CASCADE,
    ts_unix_s REAL NOT NULL,
    source TEXT NOT NULL,
    processed_tokens INTEGER NOT NULL,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    decoded_tokens INTEGER,
    ctx_used_tokens INTEGER,
    n_ctx INTEGER,
    PRIMARY KEY (request_id, source, ts_unix_s)
);
"""

# v6: what each request did (kind: generate, embed, load, unload; old load/unload replies are found by their
# done_reason), thinking kept apart from the answer, the server-side and first-answer waits, and where each
# phase's value came from (NULL where it is not known, never 0). The collector re-derives the old rows' phases.
_V6 = """
ALTER TABLE requests ADD COLUMN kind TEXT NOT NULL DEFAULT 'generate';
UPDATE requests SET kind = done_reason WHERE done_reason IN ('load', 'unload');
ALTER TABLE requests ADD COLUMN batch_size INTEGER;
ALTER TABLE requests ADD COLUMN thinking_chunks INTEGER;
ALTER TABLE requests ADD COLUMN last_thinking_ns INTEGER;
ALTER TABLE requests ADD COLUMN first_answer_ns INTEGER;
ALTER TABLE requests ADD COLUMN server_ttft_s REAL;
ALTER TABLE requests ADD COLUMN ttfa_s REAL;
ALTER TABLE requests ADD COLUMN thinking_tokens INTEGER;
ALTER TABLE requests ADD COLUMN thinking_s REAL;
ALTER TABLE requests ADD COLUMN thinking_tok_s REAL;
ALTER TABLE requests ADD COLUMN answer_tokens INTEGER;
ALTER TABLE requests ADD COLUMN answer_s REAL;
ALTER TABLE requests ADD COLUMN answer_tok_s REAL;
ALTER TABLE requests ADD COLUMN load_source TEXT;
ALTER TABLE requests ADD COLUMN queue_source TEXT;
ALTER TABLE requests ADD COLUMN prefill_source TEXT;
ALTER TABLE requests ADD COLUMN decode_source TEXT;
ALTER TABLE requests ADD COLUMN prompt_tokens_source TEXT;
ALTER TABLE requests ADD COLUMN output_tokens_source TEXT;
ALTER TABLE requests ADD COLUMN thinking_source TEXT;
"""

# v7: the prompt's size in characters, counted by the proxy whether or not the text is
# kept, so the collector can estimate a running prompt's tokens (× the model's measured tokens per character).
_V7 = """
ALTER TABLE requests ADD COLUMN prompt_chars INTEGER;
"""

# v8: the models Ollama has installed (/api/tags), loaded or not, as the latest poll listed them: the whole list
# is replaced on each poll, so a removed model disappears. Their /api/show answers go to model_info like a
# loaded model's. NULL where Ollama gave no value, never 0.
_V8 = """
CREATE TABLE installed_models (
    ts_unix_s REAL NOT NULL,
    name TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    digest TEXT NOT NULL,
    size_bytes INTEGER,
    parameter_size TEXT,
    quantization_level TEXT,
    family TEXT,
    modified_at_unix_s REAL,
    capabilities TEXT NOT NULL DEFAULT '[]'
);
"""

# v9: generations clients sent Ollama directly, recorded from its runner (seen_from 'runner'; 'proxy' for every
# older row): the runner's port and task, where the figures came from (log or slots) and how far each can be off.
# What a direct record cannot know (route, client address, streamed or not) is NULL, so those three columns lose
# NOT NULL: a change of the stored schema text alone (no row changes; SQLite's documented way for dropping a
# NOT NULL constraint), checked by PRAGMA integrity_check before it commits.
_V9 = """
ALTER TABLE requests ADD COLUMN seen_from TEXT NOT NULL DEFAULT 'proxy';
ALTER TABLE requests ADD COLUMN runner_port INTEGER;
ALTER TABLE requests ADD COLUMN runner_task_id INTEGER;
ALTER TABLE requests ADD COLUMN runner_source TEXT;
ALTER TABLE requests ADD COLUMN ends_bound_s REAL;
ALTER TABLE requests ADD COLUMN prefill_bound_s REAL;
ALTER TABLE requests ADD COLUMN decode_bound_s REAL;
ALTER TABLE requests ADD COLUMN output_tokens_bound INTEGER;
CREATE INDEX requests_seen_from_started ON requests(seen_from, started_at_unix_s);
"""
_NULLABLE_V9 = (
    (
        "client_addr TEXT NOT NULL, endpoint TEXT NOT NULL, model TEXT NOT NULL, stream INTEGER NOT NULL,",
        "client_addr TEXT, endpoint TEXT, model TEXT NOT NULL, stream INTEGER,",
    ),
)


def _v9(conn: sqlite3.Connection) -> None:
    for statement in _statements(_V9):
        conn.execute(statement)
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'requests'").fetchone()
    for old, new in _NULLABLE_V9:
        if old not in sql:
            raise StoreError("the requests table is not as v1 created it: cannot make its route columns nullable")
        sql = sql.replace(old, new)
    (schema_version_before,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'requests'", (sql,))
        conn.execute(f"PRAGMA schema_version = {int(schema_version_before) + 1}")  # other connections re-read it
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    problems = [row[0] for row in conn.execute("PRAGMA integrity_check")]
    if problems != ["ok"]:
        raise StoreError(f"v9 left the store inconsistent: {'; '.join(problems[:3])}")


# v10: how the collector found Ollama's runners (or why it did not) and why Ollama's log is not read, for the
# sidebar: each says what to do. NULL: nothing to say.
_V10 = """
ALTER TABLE collector_heartbeat ADD COLUMN runners_found TEXT;
ALTER TABLE collector_heartbeat ADD COLUMN runners_problem TEXT;
ALTER TABLE collector_heartbeat ADD COLUMN log_problem TEXT;
"""

# v11: the runner processes found now and the settings each was started with, read from its command line
# (at first replaced whole at each change; a runner that exits now keeps its row, see PutRunners). NULL where a
# flag was not given: the runner's default holds, which its command line does not tell.
_V11 = """
CREATE TABLE runners (
    ts_unix_s REAL NOT NULL,
    pid INTEGER PRIMARY KEY,
    port INTEGER NOT NULL,
    kind TEXT NOT NULL,
    digest TEXT,
    model TEXT,
    ctx_size_tokens INTEGER,
    parallel INTEGER,
    batch_tokens INTEGER,
    ubatch_tokens INTEGER,
    cache_type_k TEXT,
    cache_type_v TEXT,
    flash_attn TEXT,
    gpu_layers TEXT,
    threads INTEGER
);
"""

# v12: the requests the proxy refused itself in the last hour (its own 400s, 408s, 503s…), in words, for the sidebar.
# NULL: none.
_V12 = """
ALTER TABLE collector_heartbeat ADD COLUMN proxy_refused TEXT;
"""

# v13: where each runner put its model, per device, in its own words (its load lines in Ollama's log,
# analysis.runner_load_lines): one row per (runner port, device), replaced at each load; device 'CPU' is what stayed in
# system memory. NULL where the runner did not say.
_V13 = """
CREATE TABLE runner_devices (
    ts_unix_s REAL NOT NULL,
    port INTEGER NOT NULL,
    model TEXT,
    digest TEXT,
    device TEXT NOT NULL,
    description TEXT,
    layers_offloaded INTEGER,
    layers_total INTEGER,
    layers INTEGER,
    layers_estimated INTEGER NOT NULL,
    model_bytes INTEGER,
    kv_bytes INTEGER,
    compute_bytes INTEGER,
    free_bytes_at_load INTEGER,
    total_bytes INTEGER,
    source TEXT NOT NULL,
    PRIMARY KEY (port, device)
);
CREATE INDEX runner_devices_model ON runner_devices(model, ts_unix_s);
"""

# v14: the Apple chip and its GPU cores, read by the collector beside the host's bandwidth (NULL elsewhere), so
# that no page runs sysctl or system_profiler.
_V14 = """
ALTER TABLE host_bandwidth ADD COLUMN apple_chip TEXT;
ALTER TABLE host_bandwidth ADD COLUMN apple_gpu_cores INTEGER;
"""

# v15: a prompt that did not fit (analysis.prompt_fit): its size as sent and where that size comes from, the tokens
# kept, and the context the request ran with and who set it; and the settings Ollama's start lines said, by name.
_V15 = """
ALTER TABLE requests ADD COLUMN prompt_sent_tokens INTEGER;
ALTER TABLE requests ADD COLUMN prompt_sent_source TEXT;
ALTER TABLE requests ADD COLUMN prompt_kept_tokens INTEGER;
ALTER TABLE requests ADD COLUMN num_ctx_in_force INTEGER;
ALTER TABLE requests ADD COLUMN num_ctx_source TEXT;
CREATE TABLE ollama_settings (
    ts_unix_s REAL NOT NULL,
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    source TEXT NOT NULL
);
"""

# v16: the runner's own waits before each request's prompt was read (prompt-cache saves and loads, context checkpoints,
# a forced re-processing: analysis.runner_wait_lines), from its lines in Ollama's log, one row per request, replaced as
# more of its task's lines are read; they go with their request. No row: the log was not read, or named none.
_V16 = """
CREATE TABLE request_waits (
    request_id TEXT PRIMARY KEY REFERENCES requests(id) ON DELETE CASCADE,
    ts_unix_s REAL NOT NULL,
    port INTEGER,
    task_id INTEGER NOT NULL,
    waits_json TEXT NOT NULL
);
"""

# v17: a direct record's client and route came from Ollama's access line, text in a log that anyone who can reach
# a runner can make it write into: unverified (1), unlike an address a proxy's socket showed (0). The direct rows
# stored before with a client got it so.
_V17 = """
ALTER TABLE requests ADD COLUMN client_unverified INTEGER NOT NULL DEFAULT 0;
UPDATE requests SET client_unverified = 1 WHERE seen_from = 'runner' AND client_addr IS NOT NULL;
"""

# v18: the log is read but the runner's per-request lines never come (Ollama writing them only with OLLAMA_DEBUG),
# in words with the fix, for the sidebar and Why. NULL: nothing to say. And Ollama's own queue gauge, where its
# /metrics serves one (JSON {model: requests waiting}), for Live. NULL: not served.
_V18 = """
ALTER TABLE collector_heartbeat ADD COLUMN runner_lines_missing TEXT;
ALTER TABLE collector_heartbeat ADD COLUMN ollama_queued TEXT;
"""

# v19: how many requests started in each minute, kept by triggers in the transaction that inserts, moves or deletes a
# request (the proxy's upserts, retention, the size bound, deleted direct rows alike), so that a page counts a day of
# 1M requests from ~1,440 rows instead of reading every request (store.queries.requests_started_count). A minute with
# no request left has no row.
REQUEST_MINUTE_S = 60
# The minute of a start time (seconds, positive): never falls as the time grows, which the counts rely on.
REQUEST_MINUTE_SQL = f"(CAST({{t}} / {REQUEST_MINUTE_S}.0 AS INTEGER) * {REQUEST_MINUTE_S})"
_MINUTE_OF_NEW = REQUEST_MINUTE_SQL.format(t="NEW.started_at_unix_s")
_MINUTE_OF_OLD = REQUEST_MINUTE_SQL.format(t="OLD.started_at_unix_s")
_ADD_NEW = (
    f"INSERT INTO request_minutes (minute_unix_s, n) VALUES ({_MINUTE_OF_NEW}, 1) "
    "ON CONFLICT(minute_unix_s) DO UPDATE SET n = n + 1;"
)
_REMOVE_OLD = (
    f"UPDATE request_minutes SET n = n - 1 WHERE minute_unix_s = {_MINUTE_OF_OLD}; "
    f"DELETE FROM request_minutes WHERE minute_unix_s = {_MINUTE_OF_OLD} AND n <= 0;"
)
_V19 = f"""
CREATE TABLE request_minutes (
    minute_unix_s INTEGER PRIMARY KEY,
    n INTEGER NOT NULL
);
INSERT INTO request_minutes (minute_unix_s, n)
    SELECT {REQUEST_MINUTE_SQL.format(t="started_at_unix_s")} AS minute, COUNT(*) FROM requests GROUP BY minute;
CREATE TRIGGER request_minutes_insert AFTER INSERT ON requests BEGIN {_ADD_NEW} END;
CREATE TRIGGER request_minutes_delete AFTER DELETE ON requests BEGIN {_REMOVE_OLD} END;
CREATE TRIGGER request_minutes_move AFTER UPDATE OF started_at_unix_s ON requests
    WHEN {_MINUTE_OF_OLD} IS NOT {_MINUTE_OF_NEW} BEGIN {_REMOVE_OLD} {_ADD_NEW} END;
"""
request_minutes_step = _sql("request_minutes", _V19)

# v20: which program sent each request (NULL: not known): its User-Agent's first product and version
# (analysis.client_program), and the local process behind a loopback client's socket: name, pid and user
# (collectors.proxy.client_process). The index lets the Requests page list the programs of a window one index seek
# apiece, as it lists models (store.queries.request_programs).
_V20 = """
ALTER TABLE requests ADD COLUMN client_program TEXT;
ALTER TABLE requests ADD COLUMN client_program_version TEXT;
ALTER TABLE requests ADD COLUMN client_process TEXT;
ALTER TABLE requests ADD COLUMN client_pid INTEGER;
ALTER TABLE requests ADD COLUMN client_user TEXT;
CREATE INDEX requests_program_started ON requests(client_program, started_at_unix_s);
"""

# applied_migrations: which migration took the store to each version, by name and sha256 as it ran, so that a store
# made by another build (a branch whose "v21" was some other step) is refused on open instead of being migrated on
# from a schema this code never wrote (check_applied). applied_at_unix_s NULL: applied before this table existed
# (recorded when it was made, with this code's name and checksum: shipped steps never change).
APPLIED_MIGRATIONS_SQL = """
CREATE TABLE applied_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    applied_at_unix_s REAL
);
"""

# v22 (running_token_pieces): a running request's token times, written by what is new: each in-flight write appends
# the gaps of the chunks since the last one as a piece (first_chunk: the index of its first chunk), so that a second's
# write costs the same at token 50 and token 50,000. The finished row's times go to request_tokens whole, as before,
# and its pieces are deleted; a collector that starts after a crash joins the pieces of what it marks interrupted into
# request_tokens (store.ops.MarkInterrupted), so the tokens up to the last write are kept.
_V22 = """
CREATE TABLE request_token_pieces (
    request_id TEXT NOT NULL REFERENCES requests(id) ON DELETE CASCADE,
    first_chunk INTEGER NOT NULL,
    n_chunks INTEGER NOT NULL,
    gaps_le_i64 BLOB NOT NULL,  -- as request_tokens: the first gap is from the chunk before (or from received_ns)
    PRIMARY KEY (request_id, first_chunk)
) WITHOUT ROWID;
"""

# v23 (usage_days): the Requests page's usage totals per UTC day × model × client host × program, of finished requests
# (ended_at set): requests, embed calls, and per figure (prompt tokens, output tokens, GPU seconds) the requests it
# applies to, those that gave it and its sum, so a total of no known value stays unknown, never 0
# (pages.requests.usage). Kept by triggers as rows are inserted, finished, corrected (the log's figures arrive after the
# reply) and deleted, so 30 days read a bounded number of rows whatever the store holds. Energy is not here: it comes
# from the GPU samples over each request's GPU time, which a trigger on requests cannot read.
USAGE_DAY_S = 86_400
# The client's host: the address without ":port" (digits after the last colon) and without IPv6 brackets, as
# pages.requests.usage.client_of; NULL or '' (a direct record) is its own group.
_USAGE_KEY = {
    "day": f"(CAST({{r}}.started_at_unix_s / {USAGE_DAY_S}.0 AS INTEGER) * {USAGE_DAY_S})",
    "model": "{r}.model",
    "client": (
        "CASE WHEN {r}.client_addr IS NULL OR {r}.client_addr = '' THEN '' "
        "WHEN rtrim({r}.client_addr, '0123456789') LIKE '%:' "
        "AND length(rtrim({r}.client_addr, '0123456789')) < length({r}.client_addr) "
        "THEN trim(substr({r}.client_addr, 1, length(rtrim({r}.client_addr, '0123456789')) - 1), '[]') "
        "ELSE {r}.client_addr END"
    ),
    "program": "COALESCE({r}.client_program, '')",
}
_GPU_KNOWN = (
    "(({r}.kind = 'embed' AND {r}.prefill_s IS NOT NULL) "
    "OR ({r}.kind = 'generate' AND {r}.prefill_s IS NOT NULL AND {r}.decode_s IS NOT NULL))"
)
_USAGE_VALUES = {
    "requests": "1",
    "embeddings": "({r}.kind = 'embed')",
    "prompt_n": "({r}.kind IN ('generate', 'embed'))",
    "prompt_known": "({r}.kind IN ('generate', 'embed') AND {r}.prompt_tokens IS NOT NULL)",
    "prompt_tokens": "(CASE WHEN {r}.kind IN ('generate', 'embed') THEN COALESCE({r}.prompt_tokens, 0) ELSE 0 END)",
    "output_n": "({r}.kind = 'generate')",
    "output_known": "({r}.kind = 'generate' AND {r}.output_tokens IS NOT NULL)",
    "output_tokens": "(CASE WHEN {r}.kind = 'generate' THEN COALESCE({r}.output_tokens, 0) ELSE 0 END)",
    "gpu_n": "({r}.kind IN ('generate', 'embed'))",
    "gpu_known": _GPU_KNOWN,
    "gpu_s": f"(CASE WHEN {_GPU_KNOWN} THEN {{r}}.prefill_s + (CASE WHEN {{r}}.kind = 'generate' THEN {{r}}.decode_s ELSE 0 END) "
    "ELSE 0 END)",
}


def _usage_add(r: str) -> str:
    """Add row ``r``'s (NEW) figures to its day's group, when it is finished."""
    keys, values = ", ".join(_USAGE_KEY), ", ".join(_USAGE_VALUES)
    select = ", ".join(e.format(r=r) for e in (*_USAGE_KEY.values(), *_USAGE_VALUES.values()))
    sums = ", ".join(f"{v} = {v} + excluded.{v}" for v in _USAGE_VALUES)
    return (
        f"INSERT INTO usage_days ({keys}, {values}) SELECT {select} WHERE {r}.ended_at_unix_s IS NOT NULL "
        f"ON CONFLICT({keys}) DO UPDATE SET {sums};"
    )


def _usage_remove(r: str) -> str:
    """Take row ``r``'s (OLD) figures off its day's group, when it was finished; a group with no request left goes."""
    where = " AND ".join(f"{k} = {e.format(r=r)}" for k, e in _USAGE_KEY.items())
    less = ", ".join(f"{v} = {v} - {e.format(r=r)}" for v, e in _USAGE_VALUES.items())
    return (
        f"UPDATE usage_days SET {less} WHERE {where} AND {r}.ended_at_unix_s IS NOT NULL; "
        f"DELETE FROM usage_days WHERE {where} AND requests <= 0;"
    )


_USAGE_COLUMNS = (
    "started_at_unix_s, ended_at_unix_s, model, client_addr, client_program, kind, prompt_tokens, output_tokens, "
    "prefill_s, decode_s"
)
_USAGE_NAMES = ", ".join((*_USAGE_KEY, *_USAGE_VALUES))
_USAGE_OF_ROW = ", ".join(f"{e.format(r='requests')} AS {k}" for k, e in (*_USAGE_KEY.items(), *_USAGE_VALUES.items()))
_USAGE_SUMS = ", ".join(f"SUM({v})" for v in _USAGE_VALUES)
_V23 = f"""
CREATE TABLE usage_days (
    day INTEGER NOT NULL,
    model TEXT NOT NULL,
    client TEXT NOT NULL,
    program TEXT NOT NULL,
    requests INTEGER NOT NULL,
    embeddings INTEGER NOT NULL,
    prompt_n INTEGER NOT NULL,
    prompt_known INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    output_n INTEGER NOT NULL,
    output_known INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    gpu_n INTEGER NOT NULL,
    gpu_known INTEGER NOT NULL,
    gpu_s REAL NOT NULL,
    PRIMARY KEY (day, model, client, program)
);
INSERT INTO usage_days ({_USAGE_NAMES})
    SELECT day, model, client, program, {_USAGE_SUMS} FROM (
        SELECT {_USAGE_OF_ROW} FROM requests WHERE ended_at_unix_s IS NOT NULL
    ) GROUP BY day, model, client, program;
CREATE TRIGGER usage_days_insert AFTER INSERT ON requests BEGIN {_usage_add("NEW")} END;
CREATE TRIGGER usage_days_delete AFTER DELETE ON requests BEGIN {_usage_remove("OLD")} END;
CREATE TRIGGER usage_days_update AFTER UPDATE OF {_USAGE_COLUMNS} ON requests
    WHEN OLD.ended_at_unix_s IS NOT NULL OR NEW.ended_at_unix_s IS NOT NULL
    BEGIN {_usage_remove("OLD")} {_usage_add("NEW")} END;
"""

# MIGRATIONS[i] takes a store from version i to version i + 1. Append only; never edit a shipped step: a store
# already past it would never run the new text (tests/store/test_store_migrations_frozen.py checks their checksums).
MIGRATIONS: list[Migration] = [
    _sql("base", _V1),
    _sql("lab_experiments_and_phase_times", _V2),
    _sql("minute_rollups", _V3, *_v3_backfill()),
    _sql("phase_split_version_and_host_bandwidth", _V4),
    _sql("progress_samples", _V5),
    _sql("request_kinds_thinking_and_sources", _V6),
    _sql("prompt_chars", _V7),
    _sql("installed_models", _V8),
    # Its Python part rewrites the requests table's schema text: the pairs it swaps are part of what it is.
    Migration("direct_records", (_V9, *(f"{old}\n{new}" for old, new in _NULLABLE_V9)), _v9),
    _sql("heartbeat_runner_and_log_problems", _V10),
    _sql("runners", _V11),
    _sql("heartbeat_proxy_refused", _V12),
    _sql("runner_devices", _V13),
    _sql("host_apple_chip", _V14),
    _sql("prompt_fit_and_ollama_settings", _V15),
    _sql("request_waits", _V16),
    _sql("client_unverified", _V17),
    _sql("heartbeat_runner_lines_missing_and_ollama_queued", _V18),
    request_minutes_step,
    _sql("client_program", _V20),
    _sql("applied_migrations", APPLIED_MIGRATIONS_SQL),
    _sql("running_token_pieces", _V22),
    _sql("usage_days", _V23),
]
SCHEMA_VERSION = len(MIGRATIONS)
# The first version whose stores record their migrations (found by name: the lead may renumber at merge).
RECORDED_FROM_VERSION = next(v for v, m in enumerate(MIGRATIONS, start=1) if m.name == "applied_migrations")


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the store up to ``target``; returns the version it had before.

    ``conn`` must be in autocommit mode (``isolation_level=None``). A store newer than
    this code is refused rather than touched.
    """
    before = schema_version(conn)
    if before > SCHEMA_VERSION:
        raise StoreError(f"store schema v{before} is newer than this Phasewatch (v{SCHEMA_VERSION}); upgrade Phasewatch")
    check_applied(conn)
    applied_now: set[int] = set()
    # A new store is created in one transaction: a page reading meanwhile sees no store, then the whole schema,
    # never a part it would take for an older Phasewatch's. An existing one moves a step per transaction.
    steps = [range(0, target)] if before == 0 else [range(v, v + 1) for v in range(before, target)]
    for step in steps:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-check under the write lock: another process may have migrated meanwhile.
            if schema_version(conn) != step.start:
                conn.execute("ROLLBACK")
                continue
            for version in step:
                MIGRATIONS[version](conn)
            applied_now.update(v + 1 for v in step)
            if step.stop >= RECORDED_FROM_VERSION:
                _record_applied(conn, step.stop, applied_now)
            conn.execute(f"PRAGMA user_version = {step.stop}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    if schema_version(conn) < target:  # another process created it meanwhile, to a lower version: step on from there
        migrate(conn, target)
    return before


def _record_applied(conn: sqlite3.Connection, version: int, applied_now: set[int]) -> None:
    """One row for each version up to ``version`` not yet recorded; those run before this call have no time."""
    now = time.time()
    conn.executemany(
        "INSERT OR IGNORE INTO applied_migrations (version, name, sha256, applied_at_unix_s) VALUES (?, ?, ?, ?)",
        [(v, MIGRATIONS[v - 1].name, MIGRATIONS[v - 1].sha256, now if v in applied_now else None) for v in range(1, version + 1)],
    )


def applied_problem(conn: sqlite3.Connection) -> str | None:
    """Why this code must not migrate or write the store: a version recorded under another step's name or checksum,
    or a store past the version that records them with no record (made by another build). None: all agree."""
    version = schema_version(conn)
    if version < RECORDED_FROM_VERSION or version > SCHEMA_VERSION:
        return None  # older: nothing recorded yet (migrate records it); newer: refused as newer
    try:
        rows = conn.execute("SELECT version, name, sha256 FROM applied_migrations ORDER BY version").fetchall()
    except sqlite3.OperationalError:
        rows = []
    recorded = {int(v): (str(name), str(sha)) for v, name, sha in rows}
    for v in range(1, version + 1):
        ours = MIGRATIONS[v - 1]
        if v not in recorded:
            return f"its schema v{version} has no record of step v{v} (this Phasewatch's {ours.name!r})"
        name, sha = recorded[v]
        if (name, sha) != (ours.name, ours.sha256):
            return (
                f"its step v{v} was applied as {name!r} (sha256 {sha[:12]}…), "
                f"but this Phasewatch's v{v} is {ours.name!r} (sha256 {ours.sha256[:12]}…)"
            )
    return None


def check_applied(conn: sqlite3.Connection) -> None:
    """Refuse a store another build's migrations made, saying what to do (never migrate on from a schema we did not write)."""
    problem = applied_problem(conn)
    if problem is None:
        return
    (_, _, file) = conn.execute("PRAGMA database_list").fetchone()
    folder = Path(file).parent if file else "DIR"
    raise StoreError(
        f"{file or 'the store'} was made by another build of Phasewatch: {problem}. This build would read and write "
        f"tables it did not make. Run the build that made it; or keep its data (python -m store export --data {folder}) "
        f"and move {DB_FILENAME} out of the data folder so that this build starts a new store"
    )


def connect_writer(path: str | Path, *, busy_timeout_ms: int = 5000) -> sqlite3.Connection:
    """The writer's connection: WAL, incremental auto-vacuum, schema migrated.

    ``check_same_thread=False`` because the background writer hands the connection to its
    own thread; it is still used by one thread at a time.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if schema_version(conn) == 0 and not conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone():
            # Must precede the first table: lets retention give pages back to the file system.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"could not switch {path} to WAL mode (got {mode})")
        # NORMAL in WAL: a committed transaction survives a killed process; only power loss may drop the last ones.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path} is not a usable Phasewatch store: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn

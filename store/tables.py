"""Every table of the store, declared once: its columns' names, SQL types and Python types.

A table is declared by a frozen dataclass (its row class): each field is a column, and
the SQL type follows from the field's type (``int``/``bool`` INTEGER, ``float`` REAL,
``str``/``StrEnum`` TEXT, ``tuple[str, ...]``/``dict[str, str]`` JSON TEXT, ``bytes`` BLOB; ``X | None`` may be NULL).
Records of ``analysis.records`` that are stored as they are (GPU and host samples,
loaded models, Ollama polls, heartbeats) declare their tables themselves. INSERT and
UPSERT statements, parameters and typed rows all come from these declarations, and
``tests/store/test_store_tables.py`` holds them equal to the migrated schema (``PRAGMA
table_info``). The DDL in ``store.schema`` stays append-only: a new column is a new
migration step there and a new field here.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar, Union, get_args, get_origin, get_type_hints

from analysis.phases import PhaseSource
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
    RequestKind,
    RunnerFlags,
    SeenFrom,
)
from analysis.runner_load_rows import RunnerDeviceRow
from analysis.runner_wait_tasks import RequestWaitsRow

SqlValue = int | float | str | bytes | None
R = TypeVar("R")

# The version of analysis.phases' split that the derived columns of a requests row come from.
# Bump it when split_record changes what it computes: the collector re-derives older rows.
# 2: per-phase sources, /v1 decode from the stream, no client TTFT for whole bodies, embed/load/unload, thinking.
# 3: /v1 generations: prompt, cached tokens and prefill from the runner's /slots or log readings of them.
# 4: prompt_truncated and num_ctx_ignored (analysis.prompt_fit).
PHASES_VERSION = 4


@dataclass(frozen=True)
class Column:
    """One column: its name in SQL, its SQL type, whether it may be NULL, and how values cross."""

    name: str
    sql_type: str  # INTEGER, REAL, TEXT, BLOB
    not_null: bool
    attr: str | None = None  # the row class's field; None for a column the row does not carry
    to_sql: Callable[[Any], SqlValue] | None = None  # None: stored as it is
    from_sql: Callable[[Any], Any] | None = None


def _json_tuple(value: Any) -> tuple[str, ...]:
    return () if not value or value == "[]" else tuple(json.loads(value))


def _enum_from_sql(enum_type: type[StrEnum]) -> Callable[[Any], Any]:
    """A stored value → its member by a dict lookup (calling the enum costs ~5 µs, a dozen times per request row);
    a value no member has still raises as the enum's own call does."""
    members: dict[Any, StrEnum] = {m.value: m for m in enum_type}

    def member(value: Any) -> Any:
        found = members.get(value)
        return found if found is not None else enum_type(value)

    return member


def _column(name: str, attr: str, annotation: Any) -> Column:
    """The column a field of this type makes."""
    not_null = True
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"{attr}: a column holds one type, not {annotation}")
        annotation, not_null = args[0], False
    if annotation is bool:
        return Column(name, "INTEGER", not_null, attr, int, bool)
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return Column(name, "TEXT", not_null, attr, str, _enum_from_sql(annotation))
    if get_origin(annotation) is tuple and get_args(annotation) == (str, ...):
        return Column(name, "TEXT", not_null, attr, lambda v: json.dumps(list(v)), _json_tuple)
    if get_origin(annotation) is dict and get_args(annotation) == (str, str):
        return Column(name, "TEXT", not_null, attr, lambda v: json.dumps(v, sort_keys=True), json.loads)
    sql_type = {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}.get(annotation)
    if sql_type is None:
        raise TypeError(f"{attr}: no SQL type for {annotation}")
    return Column(name, sql_type, not_null, attr)


@dataclass(frozen=True)
class Table(Generic[R]):
    """A table and the Python type of its rows.

    ``columns`` lists every column of the table; those with an ``attr`` are the row's
    fields, in the row class's field order (``select_list`` reads them in that order).
    """

    name: str
    row_type: type[R]
    columns: tuple[Column, ...]

    @classmethod
    def of(
        cls,
        name: str,
        row_type: type[R],
        *,
        rename: Mapping[str, str] | None = None,
        key: Sequence[Column] = (),
    ) -> Table[R]:
        """The table whose columns are ``row_type``'s fields (``rename``: field → column), after ``key`` columns
        the row does not carry (e.g. the ``id = 1`` of a one-row table)."""
        hints = get_type_hints(row_type)
        rename = rename or {}
        cols = [_column(rename.get(f.name, f.name), f.name, hints[f.name]) for f in fields(row_type)]  # type: ignore[arg-type]
        return cls(name, row_type, (*key, *cols))

    @cached_property
    def row_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.attr is not None)

    @cached_property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.row_columns)

    def select_list(self, prefix: str = "") -> str:
        """The row's columns for a SELECT, in the order ``from_values`` takes them."""
        return ", ".join(prefix + n for n in self.column_names)

    def insert_sql(self, verb: str = "INSERT", constants: Mapping[str, str] | None = None) -> str:
        """``INSERT`` (or ``INSERT OR REPLACE``) of one row with named parameters; ``constants``: column → SQL."""
        key = (verb, tuple((constants or {}).items()))
        sql = self._insert_sql.get(key)
        if sql is None:
            names = [*(constants or {}), *self.column_names]
            values = [*(constants or {}).values(), *(f":{n}" for n in self.column_names)]
            sql = self._insert_sql[key] = f"{verb} INTO {self.name} ({', '.join(names)}) VALUES ({', '.join(values)})"
        return sql

    def upsert_sql(self, key: str, where: str = "") -> str:
        """INSERT … ON CONFLICT(key) DO UPDATE of every other column, optionally only ``where`` it holds."""
        sets = ", ".join(f"{n} = excluded.{n}" for n in self.column_names if n != key)
        tail = f" WHERE {where}" if where else ""
        return f"{self.insert_sql()} ON CONFLICT({key}) DO UPDATE SET {sets}{tail}"

    def params(self, row: R) -> dict[str, SqlValue]:
        """Named parameters of one row."""
        out: dict[str, SqlValue] = {name: getattr(row, attr) for name, attr in self._as_is}
        for name, attr, to_sql in self._to_sql:
            value = getattr(row, attr)
            out[name] = None if value is None else to_sql(value)
        return out

    def from_values(self, values: Sequence[Any]) -> R:
        """A row from values read in ``select_list`` order."""
        conv = self._converters
        if conv:
            values = list(values)
            for i, f in conv:
                if values[i] is not None:
                    values[i] = f(values[i])
        names = self._field_names
        if names is not None and len(values) == len(names):
            # The frozen dataclass's __init__ sets each field through object.__setattr__: for a 62-column request
            # summary that is most of the cost of reading one. Every field is given here, so its __dict__ is filled
            # at once (``_field_names`` is None for a class whose construction does more than set its fields).
            row = object.__new__(self.row_type)
            row.__dict__.update(zip(names, values, strict=True))
            return row
        return self.row_type(*values)

    # Worked out once per table: the per-row paths above run for every sample and request.

    @cached_property
    def _as_is(self) -> tuple[tuple[str, str], ...]:
        return tuple((c.name, c.attr) for c in self.row_columns if c.attr is not None and c.to_sql is None)

    @cached_property
    def _to_sql(self) -> tuple[tuple[str, str, Callable[[Any], SqlValue]], ...]:
        return tuple((c.name, c.attr, c.to_sql) for c in self.row_columns if c.attr is not None and c.to_sql is not None)

    @cached_property
    def _field_names(self) -> tuple[str, ...] | None:
        """The row class's fields in order, when building a row is only setting them: every field is in __init__,
        and the class has no __post_init__ and no __slots__ (else None: rows are built by calling the class)."""
        cls = self.row_type
        all_fields = fields(cls)  # type: ignore[arg-type]
        if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or not all(f.init for f in all_fields):
            return None
        names = tuple(f.name for f in all_fields)
        return names if names == tuple(c.attr for c in self.row_columns) else None

    @cached_property
    def _converters(self) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
        return tuple((i, c.from_sql) for i, c in enumerate(self.row_columns) if c.from_sql is not None)

    @cached_property
    def _insert_sql(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], str]:
        return {}


# ---------------------------------------------------------------- row classes of the store's own tables


@dataclass(frozen=True)
class RequestSummary:
    """A request without its text or raw monotonic stamps: history tables, timelines, rate charts.

    Its fields are columns of ``requests``; ``RequestRow`` is the whole row.
    """

    id: str
    started_at_unix_s: float
    ended_at_unix_s: float | None  # final chunk, else close
    updated_at_unix_s: float  # wall clock of the last write of this row
    client_addr: str | None  # None: not known (a direct record, v9)
    endpoint: str | None
    model: str
    stream: bool | None
    num_ctx: int | None
    num_predict: int | None
    keep_alive: str | None
    status_code: int | None
    outcome: Outcome
    error: str | None
    done_reason: str | None
    tokens_so_far: int
    # Derived by analysis.phases.split_record at write time (version: RequestRow.phases_version).
    total_s: float | None
    load_s: float | None
    prefill_s: float | None
    decode_s: float | None
    queue_s: float | None
    transport_s: float | None
    ttft_s: float | None
    client_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    output_tokens: int | None
    prefill_tok_s: float | None
    decode_tok_s: float | None
    ollama_prefill_tok_s: float | None
    ollama_decode_tok_s: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    itl_max_ms: float | None
    flags: tuple[str, ...]  # analysis.phases flag codes
    load_start_unix_s: float | None
    prefill_start_unix_s: float | None
    decode_start_unix_s: float | None
    decode_end_unix_s: float | None
    # v6: what the request did, the time to the first answer token, thinking apart from the answer, and where
    # each phase's value came from (an analysis.phases.PhaseSource; NULL where the value is not known).
    kind: RequestKind
    batch_size: int | None  # embed: inputs in the request
    server_ttft_s: float | None  # queue + load + prefill from Ollama's durations (not what the client saw)
    ttfa_s: float | None
    thinking_tokens: int | None
    thinking_s: float | None
    thinking_tok_s: float | None
    answer_tokens: int | None
    answer_s: float | None
    answer_tok_s: float | None
    load_source: PhaseSource | None
    queue_source: PhaseSource | None
    prefill_source: PhaseSource | None
    decode_source: PhaseSource | None
    prompt_tokens_source: PhaseSource | None
    output_tokens_source: PhaseSource | None
    thinking_source: PhaseSource | None
    # v9: proxied, or sent to Ollama directly and seen from its runner; for a direct record, where its figures
    # come from (log: the runner's own timings; slots: readings of /slots) and how far each can be off.
    seen_from: SeenFrom
    runner_source: PhaseSource | None
    ends_bound_s: float | None
    prefill_bound_s: float | None
    decode_bound_s: float | None
    output_tokens_bound: int | None
    # v15: a prompt that did not fit, and the context the request ran with (analysis.prompt_fit; NULL: not known).
    prompt_sent_tokens: int | None
    prompt_sent_source: str | None  # "log", "tokenize" or "estimate"
    prompt_kept_tokens: int | None
    num_ctx_in_force: int | None
    num_ctx_source: str | None  # an analysis.prompt_fit.CtxSource
    # v17: the client address and route came from Ollama's access line (a direct record's), not a socket: unverified
    client_unverified: bool
    # v20: which program sent it (NULL: not known): its User-Agent's first product and version, and the local process
    # behind the client's socket where the OS showed it (name, pid, user). Client text, shown as text.
    client_program: str | None
    client_program_version: str | None
    client_process: str | None
    client_pid: int | None
    client_user: str | None

    @property
    def direct(self) -> bool:
        """Sent to Ollama directly (not through the proxy): recorded from the runner."""
        return self.seen_from == SeenFrom.RUNNER

    @property
    def computed_prompt_tokens(self) -> int | None:
        """Prompt tokens the model computed (the cached ones were not)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - (self.cached_tokens or 0)

    @property
    def decode_context_tokens(self) -> float | None:
        """The mean context during decode: the prompt plus half the reply."""
        return None if self.prompt_tokens is None else self.prompt_tokens + (self.output_tokens or 0) / 2


@dataclass(frozen=True)
class RequestRow(RequestSummary):
    """One whole ``requests`` row: the summary, the proxy's clock stamps, Ollama's final metrics, the text
    (when recorded), and the rest of the phase split.

    The derived columns come from ``analysis.phases.split_record`` of version ``phases_version``; readers
    use them as they are.
    """

    received_ns: int
    forwarded_ns: int | None
    first_byte_ns: int | None
    first_token_ns: int | None
    final_chunk_ns: int | None
    closed_ns: int | None
    last_token_unix_s: float | None
    has_metrics: bool
    total_duration_ns: int | None
    load_duration_ns: int | None
    prompt_eval_count: int | None
    prompt_eval_cached_count: int | None
    prompt_eval_duration_ns: int | None
    eval_count: int | None
    eval_duration_ns: int | None
    prompt_text: str | None
    response_text: str | None
    phases_version: int  # PHASES_VERSION of the split the derived columns come from; 0: unknown (older store)
    load_start_ns: int | None  # phase boundaries on the record's monotonic clock
    load_end_ns: int | None
    prefill_start_ns: int | None
    decode_start_ns: int | None
    decode_end_ns: int | None
    phases_done_reason: str | None  # the split's: None where the metrics were refused as impossible
    flag_text: dict[str, str]  # flag code → sentence
    thinking_chunks: int | None  # NULL: recorded before v6, when thinking was not kept apart
    last_thinking_ns: int | None
    first_answer_ns: int | None
    prompt_chars: int | None  # the prompt's characters, counted by the proxy (None: unknown, or an older row)
    runner_port: int | None  # v9, direct records: the runner's port and its task (id_task, "task N" in the log)
    runner_task_id: int | None


@dataclass(frozen=True)
class OllamaSettingRow:
    """One setting Ollama runs with, as its start lines said (``analysis.prompt_fit.ServerSettings``)."""

    ts_unix_s: float  # when the line was read
    name: str  # OLLAMA_CONTEXT_LENGTH, …, "vram-based default context", "inference compute 0"
    value: str
    source: str  # in words: which of Ollama's lines said it


@dataclass(frozen=True)
class RequestTokensRow:
    """Token chunk times, compact: little-endian int64 gaps (ns); the first is from ``received_ns``."""

    request_id: str
    n_chunks: int
    gaps_le_i64: bytes


@dataclass(frozen=True)
class RequestTokenPieceRow:
    """A running request's chunk times written since its last write: int64 gaps as in ``request_tokens``, the first
    from the chunk before (``received_ns`` for the first piece). Joined in ``first_chunk`` order they are its times."""

    request_id: str
    first_chunk: int  # index of the piece's first chunk
    n_chunks: int
    gaps_le_i64: bytes


@dataclass(frozen=True)
class PsSnapshotRow:
    """One /api/ps poll (also when nothing is loaded); its models are in ``loaded_models``."""

    ts_unix_s: float
    n_models: int


@dataclass(frozen=True)
class ModelInfoRow:
    """Ollama's /api/show answer for a model (long licence and template text dropped)."""

    digest: str
    name: str
    show_json: str
    updated_at_unix_s: float

    @property
    def show(self) -> dict[str, Any]:
        show: dict[str, Any] = json.loads(self.show_json)
        return show


@dataclass(frozen=True)
class ExperimentRow:
    """One Lab experiment; ``params`` and ``results`` are kept as JSON."""

    id: str
    kind: str
    params_json: str
    started_at_unix_s: float
    ended_at_unix_s: float | None
    status: str
    results_json: str | None

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = json.loads(self.params_json)
        return params

    @property
    def results(self) -> Any:
        return None if self.results_json is None else json.loads(self.results_json)


@dataclass(frozen=True)
class AppliedMigrationRow:
    """Which migration took the store to ``version``, as it ran (store.schema.check_applied reads it on open)."""

    version: int
    name: str
    sha256: str
    applied_at_unix_s: float | None  # None: applied before the store recorded its migrations


_ONE_ROW_ID = Column("id", "INTEGER", True)  # the CHECK (id = 1) key of a one-row table

REQUESTS = Table.of("requests", RequestRow)
REQUEST_TOKENS = Table.of("request_tokens", RequestTokensRow)
REQUEST_TOKEN_PIECES = Table.of("request_token_pieces", RequestTokenPieceRow)
GPU_SAMPLES = Table.of("gpu_samples", GpuSample, rename={"index": "gpu_index"})
HOST_SAMPLES = Table.of("host_samples", HostSample)
PS_SNAPSHOTS = Table.of("ps_snapshots", PsSnapshotRow)
LOADED_MODELS = Table.of("loaded_models", LoadedModel)
INSTALLED_MODELS = Table.of("installed_models", InstalledModel)
RUNNERS = Table.of("runners", RunnerFlags)
RUNNER_DEVICES = Table.of("runner_devices", RunnerDeviceRow)
OLLAMA_SETTINGS = Table.of("ollama_settings", OllamaSettingRow)
REQUEST_WAITS = Table.of("request_waits", RequestWaitsRow)
MODEL_INFO = Table.of("model_info", ModelInfoRow)
OLLAMA_EVENTS = Table.of("ollama_events", OllamaStatus)
OLLAMA_LAST_POLL = Table.of("ollama_last_poll", OllamaStatus, key=(_ONE_ROW_ID,))
COLLECTOR_HEARTBEAT = Table.of("collector_heartbeat", CollectorInfo, key=(_ONE_ROW_ID,))
EXPERIMENTS = Table.of("experiments", ExperimentRow)
HOST_BANDWIDTH = Table.of("host_bandwidth", HostBandwidth)
PROGRESS_SAMPLES = Table.of("progress_samples", ProgressSample)
APPLIED_MIGRATIONS = Table.of("applied_migrations", AppliedMigrationRow)

TABLES: tuple[Table[Any], ...] = (
    REQUESTS,
    REQUEST_TOKENS,
    GPU_SAMPLES,
    HOST_SAMPLES,
    PS_SNAPSHOTS,
    LOADED_MODELS,
    MODEL_INFO,
    OLLAMA_EVENTS,
    OLLAMA_LAST_POLL,
    COLLECTOR_HEARTBEAT,
    EXPERIMENTS,
    HOST_BANDWIDTH,
    PROGRESS_SAMPLES,
    INSTALLED_MODELS,
    RUNNERS,
    RUNNER_DEVICES,
    OLLAMA_SETTINGS,
    REQUEST_WAITS,
    APPLIED_MIGRATIONS,
    REQUEST_TOKEN_PIECES,
)


REQUEST_SUMMARIES = Table.of("requests", RequestSummary)
VIEWS: tuple[Table[Any], ...] = (REQUEST_SUMMARIES,)  # subsets of a declared table's columns

"""Why each model load happened, and which models are loaded again and again (docs/ollama-api.md §5).

Ollama logs no cause for a load. It is found from what the collector keeps: each request's ``load_duration``
(a load is a request whose load took at least ``LOAD_MIN_S``; requests that waited on the same load are one
load), its ``num_ctx`` and client, and the ``/api/ps`` snapshots (which models were loaded, until when).

* **first use**: the model had no request before it in the data;
* **options changed**: the request's ``num_ctx`` differs from the one the model was loaded with;
* **unloaded**: a client sent ``keep_alive: 0`` meanwhile;
* **keep_alive expired**: the last snapshot that listed it said it expires before it left;
* **evicted**: it left the snapshots while another model was loaded (beyond ``OLLAMA_MAX_LOADED_MODELS`` or
  beyond memory), that model named.

A model loaded again more than ``CHURN_RELOADS`` times within ``CHURN_WINDOW_S`` is flagged ``reload_churn``
with the seconds its loads took and the setting that stops it. Everything here is a pure function of its
arguments.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from analysis import wording as w

LOAD_MIN_S = 0.1  # a shorter load_duration found the model in memory (store.queries.last_load_s uses the same)
SAME_LOAD_SLACK_S = 0.5  # a request that started while the model was loading waited on that load
EXPIRY_SLACK_S = 2.0  # a model gone within this of its expires_at left because it expired
EVICTOR_LOOKAHEAD_S = 120.0  # how long after a model left a load may still be the one that evicted it
CHURN_RELOADS = 3  # more reloads than this within the window is churn
CHURN_WINDOW_S = 3600.0
RELOAD_CHURN = "reload_churn"  # the flag's stable code
QUEUE_FULL = "queue_full"  # a request refused with 503 at OLLAMA_MAX_QUEUE (docs/ollama-api.md §7)
QUEUE_FULL_MESSAGE = "maximum pending requests exceeded"  # in Ollama's 503 body


class Cause(StrEnum):
    FIRST_USE = "first_use"
    OPTIONS_CHANGED = "options_changed"
    UNLOADED = "unloaded"
    KEEP_ALIVE_EXPIRED = "keep_alive_expired"
    EVICTED = "evicted"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LoadInput:
    """One finished request as the cause finder needs it (from the store)."""

    id: str
    model: str
    started_at_unix_s: float
    ended_at_unix_s: float | None
    client: str | None  # the client's address, port dropped; None where unknown
    num_ctx: int | None  # the request's options.num_ctx; None: it sent none
    load_s: float | None
    kind: str  # analysis.records.RequestKind value
    status_code: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class PsRow:
    """One model in one /api/ps snapshot."""

    ts_unix_s: float
    model: str
    context_length: int | None
    expires_at_unix_s: float | None


@dataclass(frozen=True)
class Load:
    model: str
    at_unix_s: float
    load_s: float
    request_id: str
    client: str | None
    cause: Cause
    option: str | None = None  # options changed: "num_ctx 2,048 → 4,096"
    expired_at_unix_s: float | None = None  # keep_alive expired: when
    evicted_by: str | None = None  # evicted: the model whose load pushed it out
    evicted: tuple[str, ...] = ()  # the models this load pushed out
    requests_waited: int = 1  # requests that waited on this load


@dataclass(frozen=True)
class Churn:
    """``reload_churn``: a model loaded again more than CHURN_RELOADS times within an hour."""

    model: str
    reloads: int  # in the worst hour
    lost_s: float  # the load time of those reloads
    window_start_unix_s: float
    causes: dict[str, int]  # cause value → count, in that hour
    sentence: str
    fix: str
    code: str = RELOAD_CHURN


@dataclass(frozen=True)
class Reloads:
    loads: list[Load] = field(default_factory=list)
    churn: list[Churn] = field(default_factory=list)


def client_host(addr: str | None) -> str | None:
    """``127.0.0.1:50000`` → ``127.0.0.1``; ``[::1]:5`` → ``::1``."""
    if not addr:
        return None
    if addr.startswith("["):
        return addr[1 : addr.find("]")] if "]" in addr else addr
    host, sep, port = addr.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else addr


def is_queue_full(status_code: int | None, error: str | None) -> bool:
    """Ollama refused the request because too many waited for a load (503 at OLLAMA_MAX_QUEUE)."""
    return status_code == 503 and error is not None and QUEUE_FULL_MESSAGE in error


@dataclass
class _Gone:
    """A model that left the /api/ps snapshots between two polls."""

    model: str
    at_unix_s: float  # the first snapshot without it
    last_seen_unix_s: float
    expires_at_unix_s: float | None
    new_models: tuple[str, ...]  # models in that snapshot that the one before lacked


def _departures(ps: Sequence[PsRow], snapshot_ts: Sequence[float]) -> list[_Gone]:
    by_ts: dict[float, dict[str, PsRow]] = {t: {} for t in snapshot_ts}
    for row in ps:
        by_ts.setdefault(row.ts_unix_s, {})[row.model] = row
    times = sorted(by_ts)
    out: list[_Gone] = []
    for i, (a, b) in enumerate(itertools.pairwise(times)):
        before, after = by_ts[a], by_ts[b]
        # A poll during the evicting model's load sees neither: the newcomer is in the first later one that has one.
        new: tuple[str, ...] = ()
        for t in times[i + 1 :]:
            if t > b + EVICTOR_LOOKAHEAD_S:
                break
            if added := set(by_ts[t]) - set(before):
                new = tuple(sorted(added))
                break
        for name, row in before.items():
            if name not in after:
                out.append(_Gone(name, b, a, row.expires_at_unix_s, new))
    return out


def _runner_ctx(ps: Sequence[PsRow], model: str, before_unix_s: float) -> int | None:
    """The context the model was loaded with, as the last snapshot before ``before_unix_s`` listed it."""
    seen = [r for r in ps if r.model == model and r.ts_unix_s < before_unix_s and r.context_length]
    return max(seen, key=lambda r: r.ts_unix_s).context_length if seen else None


def _loaded_ctx(ps: Sequence[PsRow], model: str, after_unix_s: float) -> int | None:
    """The context the model was loaded with, as the first snapshot after ``after_unix_s`` listed it."""
    seen = [r for r in ps if r.model == model and r.ts_unix_s > after_unix_s and r.context_length]
    return min(seen, key=lambda r: r.ts_unix_s).context_length if seen else None


def find_loads(requests: Sequence[LoadInput], ps: Sequence[PsRow] = (), snapshot_ts: Sequence[float] = ()) -> list[Load]:
    """Each load in ``requests`` (any order) with its cause; ``snapshot_ts``: every /api/ps poll, empty ones too."""
    reqs = sorted(requests, key=lambda r: r.started_at_unix_s)
    gone = _departures(ps, sorted(set(snapshot_ts) | {r.ts_unix_s for r in ps}))
    loads: list[Load] = []
    last: dict[str, LoadInput] = {}  # model → its latest request so far
    ctx_of: dict[str, int | None] = {}  # model → the num_ctx of its latest load (None: Ollama's default)
    open_load: dict[str, tuple[int, float, int | None]] = {}  # model → (index in loads, end of the load, its ctx)
    unloads: dict[str, list[float]] = {}
    for r in reqs:
        if r.kind == "unload":
            unloads.setdefault(r.model, []).append(r.started_at_unix_s)
        loaded = r.load_s is not None and r.load_s >= LOAD_MIN_S
        if loaded and r.load_s is not None:
            ongoing = open_load.get(r.model)
            if ongoing is not None and r.started_at_unix_s <= ongoing[1] + SAME_LOAD_SLACK_S and ongoing[2] == r.num_ctx:
                i = ongoing[0]
                loads[i] = _with_waiter(loads[i])
            else:
                load = _cause(r, last.get(r.model), ctx_of.get(r.model), r.model in ctx_of, ps, gone, unloads)
                loads.append(load)
                open_load[r.model] = (len(loads) - 1, r.started_at_unix_s + r.load_s, r.num_ctx)
                ctx_of[r.model] = r.num_ctx
        elif r.model not in ctx_of:
            ctx_of[r.model] = r.num_ctx
        last[r.model] = r
    return _attach_evictions(loads)


def _with_waiter(load: Load) -> Load:
    return Load(**{**load.__dict__, "requests_waited": load.requests_waited + 1})


def _option_change(r: LoadInput, prev_ctx: int | None, ctx_known: bool, ps: Sequence[PsRow]) -> str | None:
    """``num_ctx OLD → NEW`` when this request's context differs from the one the model was loaded with."""
    old_ctx = prev_ctx if ctx_known and prev_ctx is not None else _runner_ctx(ps, r.model, r.started_at_unix_s)
    # A request without num_ctx gets Ollama's default: the snapshot after its load says which.
    new_ctx = r.num_ctx if r.num_ctx is not None else _loaded_ctx(ps, r.model, r.started_at_unix_s)
    if new_ctx is None or old_ctx is None or new_ctx == old_ctx:
        return None
    default = "" if r.num_ctx is not None else " (Ollama's default)"
    return f"num_ctx {w.count(old_ctx)} → {w.count(new_ctx)}{default}"


def _departure(r: LoadInput, since_unix_s: float, gone: Sequence[_Gone]) -> dict[str, object] | None:
    """Why the snapshots saw the model leave since ``since_unix_s``: expired, or evicted by a newcomer."""
    left = [g for g in gone if g.model == r.model and since_unix_s <= g.at_unix_s <= r.started_at_unix_s + SAME_LOAD_SLACK_S]
    if not left:
        return None
    g = left[-1]
    if g.expires_at_unix_s is not None and g.expires_at_unix_s <= g.at_unix_s + EXPIRY_SLACK_S:
        return {"cause": Cause.KEEP_ALIVE_EXPIRED, "expired_at_unix_s": g.expires_at_unix_s}
    others = [m for m in g.new_models if m != r.model]
    return {"cause": Cause.EVICTED, "evicted_by": others[0]} if others else None


def _cause(
    r: LoadInput,
    prev: LoadInput | None,
    prev_ctx: int | None,
    ctx_known: bool,
    ps: Sequence[PsRow],
    gone: Sequence[_Gone],
    unloads: dict[str, list[float]],
) -> Load:
    assert r.load_s is not None
    base = {"model": r.model, "at_unix_s": r.started_at_unix_s, "load_s": r.load_s, "request_id": r.id, "client": r.client}
    if prev is None:
        return Load(**base, cause=Cause.FIRST_USE)  # type: ignore[arg-type]
    if (option := _option_change(r, prev_ctx, ctx_known, ps)) is not None:
        return Load(**base, cause=Cause.OPTIONS_CHANGED, option=option)  # type: ignore[arg-type]
    if any(prev.started_at_unix_s <= t <= r.started_at_unix_s for t in unloads.get(r.model, ())):
        return Load(**base, cause=Cause.UNLOADED)  # type: ignore[arg-type]
    found = _departure(r, prev.started_at_unix_s, gone)
    return Load(**base, **(found or {"cause": Cause.UNKNOWN}))  # type: ignore[arg-type]


def _attach_evictions(loads: list[Load]) -> list[Load]:
    """Name, on the load that evicted them, the models it pushed out (the latest load of the evicting model before)."""
    out = list(loads)
    for victim in loads:
        if victim.cause is not Cause.EVICTED or victim.evicted_by is None:
            continue
        culprits = [i for i, ld in enumerate(out) if ld.model == victim.evicted_by and ld.at_unix_s <= victim.at_unix_s]
        if culprits:
            i = culprits[-1]
            if victim.model not in out[i].evicted:
                out[i] = Load(**{**out[i].__dict__, "evicted": (*out[i].evicted, victim.model)})
    return out


def mark_evictions(loads: list[Load], ps: Sequence[PsRow], snapshot_ts: Sequence[float] = ()) -> list[Load]:
    """Name the models each load pushed out as the snapshots show them (before the evicted model returns)."""
    gone = _departures(ps, sorted(set(snapshot_ts) | {r.ts_unix_s for r in ps}))
    out = list(loads)
    for g in gone:
        if g.expires_at_unix_s is not None and g.expires_at_unix_s <= g.at_unix_s + EXPIRY_SLACK_S:
            continue
        for i, ld in enumerate(out):
            during = g.last_seen_unix_s - SAME_LOAD_SLACK_S <= ld.at_unix_s <= g.at_unix_s + SAME_LOAD_SLACK_S
            if ld.model in g.new_models and during:
                if g.model not in ld.evicted:
                    out[i] = Load(**{**ld.__dict__, "evicted": (*ld.evicted, g.model)})
                break
    return out


def describe_load(load: Load, max_loaded_models: int | None = None) -> str:
    """One plain sentence: which model loaded, how long it took and why."""
    head = f"{load.model} loaded in {w.secs(load.load_s)}"
    who = f" by {load.client}" if load.client else ""
    tail = f"; it evicted {', '.join(load.evicted)}" if load.evicted else ""
    match load.cause:
        case Cause.FIRST_USE:
            why = "first use"
        case Cause.OPTIONS_CHANGED:
            why = f"options changed ({load.option}){who}"
        case Cause.UNLOADED:
            why = "a client unloaded it (keep_alive 0)"
        case Cause.KEEP_ALIVE_EXPIRED:
            at = load.expired_at_unix_s
            when = f" at {datetime.fromtimestamp(at, UTC).strftime('%H:%M:%S')} UTC" if at is not None else ""
            why = f"its keep_alive expired{when}"
        case Cause.EVICTED:
            limit = (
                f"OLLAMA_MAX_LOADED_MODELS is {max_loaded_models}"
                if max_loaded_models
                else "OLLAMA_MAX_LOADED_MODELS (default 3 per GPU) or memory"
            )
            why = f"evicted by {load.evicted_by} ({limit})"
        case _:
            why = "cause unknown"
    return f"{head}: {why}{tail}"


_FIXES = {
    Cause.OPTIONS_CHANGED: "send the same num_ctx from every client (or none, and set OLLAMA_CONTEXT_LENGTH once)",
    Cause.KEEP_ALIVE_EXPIRED: "keep it loaded longer: OLLAMA_KEEP_ALIVE=30m (or -1), or keep_alive in the requests",
    Cause.EVICTED: "raise OLLAMA_MAX_LOADED_MODELS if memory holds the models together, or use fewer models",
    Cause.UNLOADED: "stop the client that sends keep_alive 0",
    Cause.UNKNOWN: "compare the clients' options and keep_alive",
}


def _worst_hour(reloads: Sequence[Load]) -> list[Load]:
    """The most reloads within CHURN_WINDOW_S of each other (``reloads`` sorted by time)."""
    best: list[Load] = []
    for i, first in enumerate(reloads):
        window = [ld for ld in reloads[i:] if ld.at_unix_s < first.at_unix_s + CHURN_WINDOW_S]
        if len(window) > len(best):
            best = window
    return best


def _churn(model: str, best: Sequence[Load]) -> Churn:
    causes = Counter(ld.cause.value for ld in best)
    lost_s = sum(ld.load_s for ld in best)
    top = Cause(causes.most_common(1)[0][0])
    options = sorted({ld.option for ld in best if ld.option})
    clients = sorted({ld.client for ld in best if ld.client and ld.cause is Cause.OPTIONS_CHANGED})
    detail = ""
    if top is Cause.OPTIONS_CHANGED and options:
        detail = f": {'; '.join(options)}" + (f", from {', '.join(clients)}" if clients else "")
    why = ", ".join(f"{n} × {c.replace('_', ' ')}" for c, n in causes.most_common())
    sentence = (
        f"{model} was loaded {len(best)} times within an hour ({why}{detail}): "
        f"{w.secs(lost_s)} spent loading instead of answering."
    )
    return Churn(model, len(best), lost_s, best[0].at_unix_s, dict(causes), sentence, _FIXES[top])


def find_churn(loads: Sequence[Load]) -> list[Churn]:
    """``reload_churn`` per model: more than CHURN_RELOADS reloads (first use excluded) within CHURN_WINDOW_S."""
    out: list[Churn] = []
    for model in sorted({ld.model for ld in loads}):
        reloads = sorted((ld for ld in loads if ld.model == model and ld.cause is not Cause.FIRST_USE), key=lambda x: x.at_unix_s)
        best = _worst_hour(reloads)
        if len(best) > CHURN_RELOADS:
            out.append(_churn(model, best))
    return out


def reloads(requests: Sequence[LoadInput], ps: Sequence[PsRow] = (), snapshot_ts: Sequence[float] = ()) -> Reloads:
    """Loads with their causes and the models that churn."""
    loads = mark_evictions(find_loads(requests, ps, snapshot_ts), ps, snapshot_ts)
    return Reloads(loads, find_churn(loads))

"""Where one request's time went while it shared a runner: queue, the runner's own wait, and interference.

One pure function, ``split_wait``, from measured intervals only (never from log wording):

* **queue**: before its prompt was read, every slot of the runner held another request's task; the holders are
  named (each slot is held from that request's prefill start to its last token).
* **batch wait** (interference): before its prompt was read a slot was free, but another request's prompt was
  being read on the same runner, so its task waited for that batch to end (llama-server fills a batch with the
  prompt of the slot before it and starts the next task between batches).
* **the runner's own wait**: what is left before its prompt (a slot free, no other prompt being read) when the
  runner's own lines named work for this task before it (a prompt-cache save, checkpoints), and no more than those
  lines span where their timestamps are known (``runner_span_s``); the rest is unexplained. Ollama's log carries
  no timestamps on the runner's lines, so today the span is that remainder: on the H200 run it grew with the state
  saved (0.22 s for 198 MiB, 0.71 s for 402 MiB, 1.65 s for 1,362 MiB).
* **interference during its own work**: another request's prefill overlapping this one's prefill or decode. The time
  lost is measured against this request's own rate without the overlap: its prompt at the runner's rate for the
  other prompt (the same model and runner), its gaps between tokens against the median of its gaps that overlap no
  prefill (those before and after).

All times are wall-clock seconds. Requests, Live, Why, the report and ``/metrics`` take the split from here.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from analysis.model_names import ModelName, parse_model_name
from analysis.phases import Phases
from analysis.records import RequestRecord, SeenFrom

# Neighbours considered for one request, the closest in time first: a flood of requests must not make a page
# slow; a slot holder further off than this many requests cannot matter to a runner's handful of slots.
MAX_NEIGHBOURS = 64
MIN_CLEAN_GAPS = 3  # fewer gaps outside every prefill than this: the decode rate without the overlap is unknown

Interval = tuple[float, float]


@dataclass(frozen=True)
class Busy:
    """One request's measured intervals on a runner (wall-clock seconds; None: not measured)."""

    id: str
    model: str
    client: str | None
    prompt_tokens: int | None  # tokens computed by its prefill (cache hits excluded)
    wait_start_s: float  # when it could start: its arrival, after any load it waited for
    prefill: Interval | None  # its prompt being read: prefill start → first token
    held: Interval | None  # its slot held: prefill start → last token
    tokens_s: tuple[float, ...] = ()  # when each token arrived (streamed replies)
    started_s: float = 0.0  # when it arrived

    @property
    def prefill_tok_s(self) -> float | None:
        if self.prefill is None or not self.prompt_tokens or self.prefill[1] <= self.prefill[0]:
            return None
        return self.prompt_tokens / (self.prefill[1] - self.prefill[0])


def busy_of(rec: RequestRecord, ph: Phases) -> Busy:
    """A stored request's intervals as the split reads them."""
    computed = None
    if ph.prompt_tokens is not None:
        computed = max(ph.prompt_tokens - (ph.cached_tokens or 0), 0)
    p0, p1, end = ph.prefill_start_ns, ph.decode_start_ns, ph.decode_end_ns
    prefill = (rec.wall_s(p0), rec.wall_s(p1)) if p0 is not None and p1 is not None and p1 >= p0 else None
    held = (rec.wall_s(p0), rec.wall_s(end)) if p0 is not None and end is not None and end >= p0 else None
    if held is None:
        held = _direct_task_held(rec)
    wait_start = rec.wall_s(ph.load_end_ns) if ph.load_end_ns is not None else rec.started_at_unix_s
    arrived = direct_arrival_s(rec, ph)
    if arrived is not None:
        wait_start = min(wait_start, arrived)
    return Busy(
        id=rec.id,
        model=rec.model,
        client=rec.client_addr,
        prompt_tokens=computed,
        wait_start_s=wait_start,
        prefill=prefill,
        held=held,
        tokens_s=tuple(rec.wall_s(t) for t in rec.token_chunk_ns),
        started_s=min(rec.started_at_unix_s, arrived) if arrived is not None else rec.started_at_unix_s,
    )


def _direct_task_held(rec: RequestRecord) -> Interval | None:
    """A direct task /slots saw but whose phases are unknown (no poll saw it decode, no log line confirmed them):
    its slot was still held from the runner taking it (the record's start) to its release (its end)."""
    end = rec.final_chunk_ns
    if rec.seen_from is not SeenFrom.RUNNER or end is None or end < rec.received_ns:
        return None
    return (rec.wall_s(rec.received_ns), rec.wall_s(end))


def direct_arrival_s(rec: RequestRecord, ph: Phases) -> float | None:
    """When a direct request reached Ollama (wall-clock s; None: not a direct record, or not known). A direct
    record begins when the runner took its task; when Ollama's access line gave its whole latency
    (``total_duration_ns``) and it loaded nothing, it arrived that long before its end. The latency is gin's own
    (Go's duration to the nanosecond; gin truncates it to the second past a minute); the end is the runner's
    release as read (within the record's ``ends_bound_s``: a log read or a poll), so its time before the runner
    took its task is known to that bound plus Ollama's time to send the reply."""
    m = rec.metrics
    if rec.seen_from is not SeenFrom.RUNNER or m is None or not m.total_duration_ns or m.load_duration_ns:
        return None
    if ph.decode_end_ns is None:
        return None
    return rec.wall_s(ph.decode_end_ns) - m.total_duration_ns / 1e9


@dataclass(frozen=True)
class Hit:
    """One other request's prefill on the same runner, as it weighed on this request."""

    other: Busy
    batch_wait_s: float  # before this request's prompt, a slot free, while the other's prompt was read
    prefill_overlap_s: float  # this request's own prefill while the other's ran
    decode_overlap_s: float  # this request's decode while the other's prefill ran
    prefill_lost_s: float  # this prefill's time beyond its own tokens at the runner's rate
    decode_lost_s: float | None  # the overlapping gaps beyond this request's usual gap (None: no gaps to measure)

    @property
    def lost_s(self) -> float:
        """What the other request cost this one: what is measured (a decode without token times adds nothing)."""
        return self.batch_wait_s + self.prefill_lost_s + (self.decode_lost_s or 0.0)


@dataclass(frozen=True)
class WaitSplit:
    """The time before one request's prompt, and what other requests cost it after (seconds)."""

    wait_s: float  # load end (or arrival) → prefill start
    queue_s: float | None  # every slot held another request's task (None: the slot count is not known)
    holders: tuple[Busy, ...]  # the requests that held the slots while it queued, longest first
    batch_wait_s: float  # a slot free, another request's prompt being read
    runner_wait_s: float  # the runner's own work, as far as its own lines span
    unexplained_s: float  # what nothing measured explains
    hits: tuple[Hit, ...] = field(default_factory=tuple)  # other prefills that weighed on it, costliest first
    # The wait before its prompt in time order: (QUEUE | BATCH | RUNNER | UNEXPLAINED, start, end), wall-clock s.
    pieces: tuple[tuple[str, float, float], ...] = ()

    @property
    def interference_s(self) -> float:
        return sum(h.lost_s for h in self.hits)


def _overlap(a: Interval, b: Interval) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _inside(t: float, iv: Interval | None) -> bool:
    return iv is not None and iv[0] <= t < iv[1]


def _neighbours(me: Busy, others: Sequence[Busy], limit: int) -> list[Busy]:
    """The others that could touch ``me``'s span, the closest in start time first, at most ``limit``."""
    end = me.held[1] if me.held is not None else me.prefill[1] if me.prefill is not None else me.wait_start_s
    span = (min(me.wait_start_s, me.started_s or me.wait_start_s), end)
    near = [
        o for o in others if o.id != me.id and o.held is not None and (_overlap(o.held, span) > 0 or _inside(span[0], o.held))
    ]
    near.sort(key=lambda o: abs((o.held[0] if o.held else 0.0) - span[0]))
    return near[:limit]


@dataclass
class _Sweep:
    """The time before one prompt, swept over the pieces between every boundary of the others' intervals."""

    queue: float = 0.0
    free: float = 0.0
    held_by: dict[str, float] = field(default_factory=dict)  # seconds each holder held a slot while it queued
    batch_by: dict[str, float] = field(default_factory=dict)  # seconds each other prompt was read, a slot free
    pieces: list[tuple[str, float, float]] = field(default_factory=list)  # (QUEUE | BATCH | FREE, start, end)

    def add(self, kind: str, t0: float, t1: float) -> None:
        if self.pieces and self.pieces[-1][0] == kind and self.pieces[-1][2] == t0:
            self.pieces[-1] = (kind, self.pieces[-1][1], t1)
        else:
            self.pieces.append((kind, t0, t1))


QUEUE, BATCH, RUNNER, UNEXPLAINED = "queue", "batch", "runner", "unexplained"  # the kinds of a piece of the wait


def _before_prefill(me: Busy, others: Sequence[Busy], n_slots: int | None) -> _Sweep:
    sweep = _Sweep()
    if me.prefill is None or me.prefill[0] <= me.wait_start_s:
        return sweep
    a, b = me.wait_start_s, me.prefill[0]
    cuts = {a, b}
    for o in others:
        for iv in (o.held, o.prefill):
            if iv is not None:
                cuts.update(t for t in iv if a < t < b)
    edges = sorted(cuts)
    for t0, t1 in itertools.pairwise(edges):
        mid, d = (t0 + t1) / 2, t1 - t0
        holders = [o for o in others if _inside(mid, o.held)]
        reading = [o for o in others if _inside(mid, o.prefill)]
        if n_slots and len(holders) >= n_slots:
            sweep.queue += d
            for o in holders:
                sweep.held_by[o.id] = sweep.held_by.get(o.id, 0.0) + d
            sweep.add(QUEUE, t0, t1)
        elif reading and (n_slots or not holders):  # slots unknown and some held: a queue cannot be ruled out
            sweep.batch_by[reading[0].id] = sweep.batch_by.get(reading[0].id, 0.0) + d
            sweep.add(BATCH, t0, t1)
        else:
            sweep.free += d
            sweep.add(UNEXPLAINED, t0, t1)
    return sweep


def _name_runner(pieces: list[tuple[str, float, float]], runner_s: float) -> list[tuple[str, float, float]]:
    """The free pieces nearest the prompt, ``runner_s`` of them, named the runner's (its work comes just before it)."""
    out: list[tuple[str, float, float]] = []
    left = runner_s
    for kind, t0, t1 in reversed(pieces):
        if kind == UNEXPLAINED and left > 0:
            cut = max(t0, t1 - left)
            left -= t1 - cut
            out += [(RUNNER, cut, t1)] + ([(UNEXPLAINED, t0, cut)] if cut > t0 else [])
        else:
            out.append((kind, t0, t1))
    return out[::-1]


def _decode_lost(me: Busy, prefills: Sequence[tuple[str, Interval]]) -> dict[str, float] | None:
    """Each other prefill's cost to ``me``'s gaps between tokens: (gap − usual gap) summed over the gaps it overlaps
    most; the usual gap is the median of those that overlap no prefill. None without enough gaps to tell."""
    ts = me.tokens_s
    gaps = list(itertools.pairwise(ts))
    clean: list[float] = []
    charged: dict[str, list[float]] = {}
    for g in gaps:
        best = max(prefills, key=lambda p: _overlap(g, p[1]), default=None)
        if best is not None and _overlap(g, best[1]) > 0:
            charged.setdefault(best[0], []).append(g[1] - g[0])
        else:
            clean.append(g[1] - g[0])
    if len(clean) < MIN_CLEAN_GAPS:
        return None
    usual = statistics.median(clean)
    return {oid: sum(max(g - usual, 0.0) for g in gs) for oid, gs in charged.items()}


def _hit(
    me: Busy, other: Busy, p: Interval, decode: Interval | None, batch: float, decode_lost: dict[str, float] | None
) -> Hit | None:
    """What ``other``'s prefill ``p`` cost ``me``: the batch wait before its prompt, the part of its own prefill beyond
    its tokens at the runner's rate for the other prompt, and its decode gaps beyond its usual gap."""
    in_prefill = _overlap(me.prefill, p) if me.prefill is not None else 0.0
    in_decode = _overlap(decode, p) if decode is not None else 0.0
    if in_prefill <= 0 and in_decode <= 0 and batch <= 0:
        return None
    rate = other.prefill_tok_s
    own_s = (me.prompt_tokens or 0) / rate if rate else None
    prefill_lost = max(in_prefill - own_s, 0.0) if own_s is not None else 0.0
    lost = decode_lost.get(other.id, 0.0) if decode_lost is not None else None
    return Hit(other, batch, in_prefill, in_decode, prefill_lost, lost if in_decode > 0 else 0.0)


def split_wait(
    me: Busy,
    others: Sequence[Busy],
    *,
    n_slots: int | None,
    runner_named: bool = False,
    runner_span_s: float | None = None,
    max_neighbours: int = MAX_NEIGHBOURS,
) -> WaitSplit:
    """The split of ``me``'s time among queue, batch wait, the runner's own wait, the unexplained rest, and what
    each other request's prefill cost it. ``others``: the other requests on the same runner (any order; the
    ``max_neighbours`` closest are used). ``n_slots``: the runner's parallel slots (None: not known, so no queue
    is told). ``runner_named``: the runner's own lines named work for this task before its prompt; ``runner_span_s``:
    how long those lines span, where their timestamps are known (None: not known, so the free remainder)."""
    near = _neighbours(me, others, max_neighbours)
    sweep = _before_prefill(me, near, n_slots)
    wait = me.prefill[0] - me.wait_start_s if me.prefill is not None else 0.0
    free = sweep.free
    runner = 0.0
    if runner_named:
        runner = free if runner_span_s is None else min(max(runner_span_s, 0.0), free)
    held_by, batch_by = sweep.held_by, sweep.batch_by
    by_id = {o.id: o for o in near}
    holders = tuple(sorted((by_id[i] for i in held_by), key=lambda o: -held_by[o.id]))
    prefills = [(o.id, o.prefill) for o in near if o.prefill is not None]
    decode = (me.prefill[1], me.held[1]) if me.prefill is not None and me.held is not None else None
    decode_lost = _decode_lost(me, prefills) if decode is not None else None
    hits = [h for oid, p in prefills if (h := _hit(me, by_id[oid], p, decode, batch_by.get(oid, 0.0), decode_lost)) is not None]
    hits.sort(key=lambda h: -h.lost_s)
    return WaitSplit(
        max(wait, 0.0),
        sweep.queue if n_slots else None,
        holders,
        sum(batch_by.values()),
        runner,
        free - runner,
        tuple(hits),
        tuple(_name_runner(sweep.pieces, runner)),
    )


def split_for(
    rec: RequestRecord,
    ph: Phases,
    others: Sequence[tuple[RequestRecord, Phases]],
    *,
    n_slots: int | None,
    runner_named: bool = False,
    runner_span_s: float | None = None,
) -> WaitSplit:
    """``split_wait`` for a stored request among stored others; only those on the same model's runner count."""
    return Neighbours(others).split(rec, ph, n_slots=n_slots, runner_named=runner_named, runner_span_s=runner_span_s)


class Neighbours:
    """Stored requests' intervals, read once and grouped by model, to split many requests' waits among the same
    others: a page that split each of its 100 requests among 400 read every pair again (40,000 ``busy_of`` and model
    name parses, seconds)."""

    def __init__(self, others: Sequence[tuple[RequestRecord, Phases]]) -> None:
        self._by_model: dict[ModelName, list[Busy]] = {}
        for r, p in others:
            self._by_model.setdefault(parse_model_name(r.model), []).append(busy_of(r, p))

    def split(
        self,
        rec: RequestRecord,
        ph: Phases,
        *,
        n_slots: int | None,
        runner_named: bool = False,
        runner_span_s: float | None = None,
    ) -> WaitSplit:
        """``split_for`` ``rec`` among these requests (itself left out)."""
        me = busy_of(rec, ph)
        near = [b for b in self._by_model.get(parse_model_name(rec.model), []) if b.id != rec.id]
        return split_wait(me, near, n_slots=n_slots, runner_named=runner_named, runner_span_s=runner_span_s)

"""Live's "slowed" line: a running request another request's prompt weighs on now, named while it happens.

The running cards are turned into intervals up to now and handed to ``analysis.wait_split`` (the one function
Requests, Why and the report take the split from): a card whose wait, prompt or decode overlaps another card's
prefill on the same model's runner, while a slot was free for it (a queue is the queue card's, not this), says
which prompt is being read beside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from analysis.model_names import same_model, value_for_model
from analysis.records import Outcome
from analysis.wait_split import Busy, split_wait
from pages.live.cards import FINISHED_KEEP_S, Card
from pages.live.queue import SlotCount
from pages.shared import fmt
from store.rows import busy_of_row
from store.tables import RequestSummary

NOW_EPS_S = 1e-3  # an interval still open is drawn up to just past now, so "now" lies inside it
SLOWED_PHASES = ("waiting", "prefill", "decoding")  # the phases another prompt can hold back (a queued card queues)


def _busy(card: Card, now_unix_s: float) -> Busy | None:
    """A running card as intervals up to now: its prompt being read, or its reply being written."""
    start = card.phase_started_unix_s
    end = now_unix_s + NOW_EPS_S
    arrived = now_unix_s - card.elapsed_s
    prompt = card.prefill.prompt_tokens if card.prefill is not None else None
    if card.phase == "prefill" and start is not None:
        return Busy(card.request_id, card.model, card.client, prompt, arrived, (start, end), (start, end), (), arrived)
    if card.phase == "decoding" and start is not None:
        return Busy(card.request_id, card.model, card.client, prompt, arrived, (start, start), (start, end), (), arrived)
    if card.phase == "waiting":  # a slot free for it, no reading yet: its prompt has not begun
        return Busy(card.request_id, card.model, card.client, prompt, arrived, (end, end), None, (), arrived)
    return None


def _fills_first(other: Card, card: Card) -> bool:
    """Whether ``other``'s prompt, being read, can hold ``card`` back: the same model's runner, and, when both read
    a prompt, begun first (the runner fills a batch with the prompt it began first; the newer one waits on it)."""
    if other.request_id == card.request_id or not same_model(other.model, card.model):
        return False
    if card.phase == "prefill" and card.phase_started_unix_s is not None and other.phase_started_unix_s is not None:
        return other.phase_started_unix_s < card.phase_started_unix_s
    return True


def slowed_words(tokens: int | None, estimated: bool = False) -> str:
    """``estimated``: the size from the prompt's characters (the runner has not said it yet), marked "~" as Live's
    progress bars mark it."""
    size = f"{'~' if estimated else ''}{fmt.count(tokens)}-token " if tokens else ""
    return f"slowed: another request's {size}prompt is being read"


def slowed_cards(cards: Sequence[Card], slots: Mapping[str, SlotCount], now_unix_s: float) -> list[Card]:
    """The cards, each one another request's prompt is being read beside now marked with it (``slowed_by``)."""
    reading = [c for c in cards if c.phase == "prefill" and c.phase_started_unix_s is not None]
    if not reading:
        return list(cards)
    out = []
    for card in cards:
        me = _busy(card, now_unix_s) if card.phase in SLOWED_PHASES else None
        others = [_busy(o, now_unix_s) for o in reading if _fills_first(o, card)]
        near = [b for b in others if b is not None]
        if me is None or not near:
            out.append(card)
            continue
        known = value_for_model(dict(slots), card.model)
        split = split_wait(me, near, n_slots=known.slots if known is not None else None)
        hit = split.hits[0] if split.hits else None
        if hit is None:
            out.append(card)
            continue
        view = next(o.prefill for o in reading if o.request_id == hit.other.id)
        estimated = view is not None and view.size_estimated
        out.append(replace(card, slowed_by=slowed_words(hit.other.prompt_tokens, estimated)))
    return out


def finished_phases(
    rows: Sequence[RequestSummary], slots: Mapping[str, SlotCount], now_unix_s: float, keep_s: float = FINISHED_KEEP_S
) -> dict[str, dict[str, float]]:
    """Each finished row's wait before prefill in its parts (``analysis.wait_split``, against the other rows of its
    model), for its card's phase bar: "queue" only while every slot held another task, "behind others" while
    another prompt was read with a slot free, "before prefill" the rest (the runner's work, or unexplained).
    Only rows that ended in the last ``keep_s`` (those with a card); rows whose model's slot count is not known
    keep Ollama's one queue figure (absent here)."""
    busy = {r.id: b for r in rows if (b := busy_of_row(r)) is not None}
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        me = busy.get(r.id)
        known = value_for_model(dict(slots), r.model)
        ended = r.ended_at_unix_s
        if me is None or known is None or r.outcome is Outcome.IN_FLIGHT or ended is None or now_unix_s - ended > keep_s:
            continue
        others = [busy[o.id] for o in rows if o.id in busy and o.id != r.id and same_model(o.model, r.model)]
        split = split_wait(me, others, n_slots=known.slots)
        out[r.id] = {
            "queue": split.queue_s or 0.0,
            "behind others": split.batch_wait_s,
            "before prefill": split.runner_wait_s + split.unexplained_s,
        }
    return out

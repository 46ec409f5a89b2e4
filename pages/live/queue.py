"""Per model, how many generations wait and how many run now, and each waiting card's place in line (pure: no
Streamlit, no I/O, no clock).

Ollama serves a model's requests in the order they came, as many at once as its runner has slots
(``OLLAMA_NUM_PARALLEL``, the runner's ``-np``). What shows a request runs: a token, a reading of it from the
runner (/slots, the log), or a record that comes from the runner itself. What is left of the proxy's open requests
of that model waits, once the running ones fill the slots: when the slot count is known (the runner's command
line), the first requests beyond the free slots wait; when it is not, a request without a token waits while another
of its model runs and its own prompt should have been read by now (the estimate reached its end, or there is none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from analysis.model_names import is_cloud, value_for_model
from pages.live.cards import Card

LOAD_PHASES = ("other_load", "unload_wait", "loading")  # waiting for a model to load (its own or another)


@dataclass(frozen=True)
class SlotCount:
    slots: int
    source: str  # in words: "the runner's -np"


@dataclass(frozen=True)
class ModelQueue:
    model: str
    running: int  # generations a slot works on now (reading the prompt or writing the reply)
    waiting: int  # for a free slot, or for their model to load
    slots: SlotCount | None = None  # None: not known
    ollama_queued: int | None = None  # what Ollama's own /metrics says waits for this model; None: not served


def _runs(card: Card) -> bool:
    """The runner works on it: a token, the runner's reading of its prompt, or a record from the runner."""
    if card.phase == "decoding":
        return True
    if card.phase == "prefill":
        return card.prefill is not None and not card.prefill.estimated
    return card.direct and card.phase == "waiting"


def _undecided(card: Card) -> bool:
    """No token and no reading from the runner: reading its prompt or waiting for a slot, which cannot be seen."""
    if card.direct:
        return False
    if card.phase == "prefill":
        return card.prefill is not None and card.prefill.estimated
    return card.phase in ("queued", "waiting")


def _prompt_read_by_now(card: Card) -> bool:
    """The estimate says its prompt should have been read (or there is no estimate): no token yet means a wait."""
    p = card.prefill
    if p is None or p.prompt_tokens is None:
        return True
    return p.processed_tokens >= p.prompt_tokens - 1


def _waiting_for_slot(cards: Sequence[Card], group: list[int], known: SlotCount | None) -> tuple[list[int], int]:
    """Of one model's cards (indexes, oldest first): those that wait for a slot, and how many slots work now."""
    active = [i for i in group if _runs(cards[i])]
    undecided = [i for i in group if _undecided(cards[i])]
    if known is not None:
        queued = undecided[max(known.slots - len(active), 0) :]
    elif active:
        queued = [i for i in undecided if _prompt_read_by_now(cards[i])]
    else:
        queued = []
    return queued, len(active) + len(undecided) - len(queued)


def _their_count(ollama_queued: Mapping[str, int] | None, model: str) -> int | None:
    """What Ollama's own gauge says waits for this model (a gauge without a model label: its whole queue)."""
    if ollama_queued is None:
        return None
    theirs = value_for_model(dict(ollama_queued), model)
    if theirs is None and set(ollama_queued) == {""}:
        theirs = ollama_queued[""]
    return theirs


def queue_cards(
    cards: Sequence[Card], slots: Mapping[str, SlotCount], ollama_queued: Mapping[str, int] | None = None
) -> tuple[list[Card], list[ModelQueue]]:
    """The cards with those that wait for a slot marked ``queued`` (place in line, slots busy), and per model the
    counts, models in the order of their oldest card. ``cards``: running ones oldest first, finished ones ignored.
    ``ollama_queued``: Ollama's own queue gauge by model (its /metrics), shown beside ours; None: not served."""
    out = list(cards)
    groups: dict[str, list[int]] = {}
    for i, card in enumerate(cards):
        if card.phase != "finished":
            groups.setdefault(card.model, []).append(i)
    queues: list[ModelQueue] = []
    for model, group in groups.items():
        if is_cloud(model):
            continue  # ollama.com's queue and slots are not seen from here
        known = value_for_model(dict(slots), model)
        queued, busy = _waiting_for_slot(cards, group, known)
        for i in group:
            if i not in queued and cards[i].phase == "queued":  # a slot is free for it: reading its prompt, or about to
                out[i] = replace(cards[i], phase="waiting", queue_position=None, waits_for=None, state_s=None)
        for place, i in enumerate(queued, start=1):
            out[i] = replace(
                cards[i],
                phase="queued",
                queue_position=place,
                waits_for=f"a free slot of {model}",
                state_s=cards[i].elapsed_s,
                prefill=None,
                slots=known.slots if known is not None else None,
                slots_busy=busy,
            )
        waiting = len(queued) + sum(1 for i in group if out[i].phase in LOAD_PHASES)
        queues.append(ModelQueue(model, len(group) - waiting, waiting, known, _their_count(ollama_queued, model)))
    return out, queues


def _slots_busy(busy: int, slots: int | None) -> str:
    if slots is None:
        return f"{busy} running (how many slots it has is not known)"
    if busy >= slots:
        return {1: "its only slot busy", 2: "both slots busy"}.get(slots, f"all {slots} slots busy")
    return f"{busy} of {slots} slots busy"


def queue_caption(card: Card) -> str | None:
    """ "waiting: 2 ahead, both slots busy" for a card that waits for a slot (None for any other)."""
    if card.phase != "queued" or card.queue_position is None:
        return None
    ahead = card.queue_position - 1
    place = "next in line" if ahead == 0 else f"{ahead} ahead"
    if card.slots_busy is None:
        return f"waiting: {place}"
    return f"waiting: {place}, {_slots_busy(card.slots_busy, card.slots)}"

"""The wait split (analysis.wait_split) for ``/metrics``: each finished request's queue for a slot and what other
requests' prompts cost it, from the stored rows of the requests that finished before it on the same model.

Bounded: the newest ``MAX_RECENT`` rows per model, and at most ``MAX_MODELS`` models (the oldest dropped first;
model names come from clients). A neighbour still running when a request is counted is not among them: its part of
the wait counts as neither queue nor interference (the split then tells less, never more)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable

from analysis.model_names import parse_model_name
from analysis.wait_split import Busy, WaitSplit, split_wait
from store.rows import busy_of_row
from store.tables import RequestRow

MAX_RECENT = 64  # finished rows kept per model: more than any runner's slots times a queue anyone waits in
MAX_MODELS = 64  # models kept at once

SlotsOf = Callable[[str], int | None]  # model → its runner's slot count (None: not known)


def _model_key(model: str) -> bytes:
    """A model's key, of fixed size whatever its name's length (its spellings alike: ``llama3.2`` = ``:latest``)."""
    m = parse_model_name(model)
    return hashlib.blake2b(repr(m).encode(), digest_size=16).digest()


class WaitSplits:
    """The recent finished rows per model, and the split of each new one against them."""

    def __init__(self, slots_of: SlotsOf = lambda _m: None) -> None:
        self.slots_of = slots_of
        self._recent: OrderedDict[bytes, deque[Busy]] = OrderedDict()

    def split(self, row: RequestRow) -> WaitSplit | None:
        me = busy_of_row(row, names=False)
        if me is None:
            return None
        key = _model_key(row.model)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = deque(maxlen=MAX_RECENT)
            while len(self._recent) > MAX_MODELS:
                self._recent.popitem(last=False)
        self._recent.move_to_end(key)
        split = split_wait(me, list(recent), n_slots=self.slots_of(row.model))
        recent.append(me)
        return split

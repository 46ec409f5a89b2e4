"""The gaps between a running reply's token chunks, kept sorted as chunks arrive, so that its inter-token
percentiles cost the same at token 50 and at token 50,000.

A running request's row is written once a second. Sorting every gap so far for its ``itl_p50/p99/max`` at each
write grows with the reply (2 ms at 8,000 tokens, 20 ms at 30,000 on our machines); ``RunningGaps`` adds only the
gaps new since the last write, each in O(log n) (``sortedcontainers.SortedList``), and ``analysis.phases`` reads
the percentiles from it as it would from a sorted list. It is a cache of a function of the chunk times, and the
proxy's lists of chunk times only grow (one append per chunk): handed a list that is shorter than the one it saw,
or whose first or last seen chunk differs, it starts again from that list; a change in between is not looked for.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

from sortedcontainers import SortedList

# How many running requests' gaps are kept (the writer sees at most the proxy's running requests; one that ends
# without a final write is dropped oldest first and only costs a rebuild if it comes back).
MAX_RUNNING_REPLIES = 1024


class RunningGaps:
    """Sorted gaps of one reply's chunk times, extended by what is new."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._sorted = SortedList()  # indexing and len: what analysis.phases.percentile reads of a sorted list
        self._n_chunks = 0
        self._first_ns: int | None = None
        self._last_ns: int | None = None

    def update(self, token_chunk_ns: Sequence[int]) -> Sequence[int]:
        """The sorted gaps of ``token_chunk_ns``, adding the gaps after the chunks already seen."""
        n = len(token_chunk_ns)
        if not self._continues(token_chunk_ns):
            self._reset()  # not the list it saw grow: start again from this one
        if n > self._n_chunks:
            start = max(self._n_chunks - 1, 0)
            self._sorted.update(b - a for a, b in itertools.pairwise(token_chunk_ns[start:]))
            self._n_chunks, self._first_ns, self._last_ns = n, token_chunk_ns[0], token_chunk_ns[-1]
        return cast(Sequence[int], self._sorted)

    def _continues(self, chunks: Sequence[int]) -> bool:
        """Whether ``chunks`` starts with the chunks seen (checked at both ends of what was seen)."""
        seen = self._n_chunks
        if seen == 0:
            return True
        return len(chunks) >= seen and chunks[0] == self._first_ns and chunks[seen - 1] == self._last_ns


class RunningReplies:
    """``RunningGaps`` per running request id, at most ``max_replies`` of them (least recently written dropped)."""

    def __init__(self, max_replies: int = MAX_RUNNING_REPLIES) -> None:
        self.max_replies = max_replies
        self._gaps: OrderedDict[str, RunningGaps] = OrderedDict()

    def __len__(self) -> int:
        return len(self._gaps)

    def sorted_gaps(self, request_id: str, token_chunk_ns: Sequence[int]) -> Sequence[int]:
        """The sorted gaps of a running request's chunks so far."""
        gaps = self._gaps.pop(request_id, None) or RunningGaps()
        self._gaps[request_id] = gaps  # most recently written last
        while len(self._gaps) > self.max_replies:
            self._gaps.popitem(last=False)
        return gaps.update(token_chunk_ns)

    def finish(self, request_id: str, token_chunk_ns: Sequence[int]) -> Sequence[int] | None:
        """The sorted gaps of a request that ended, if it was followed while running (else None: sort them once);
        it is followed no longer."""
        gaps = self._gaps.pop(request_id, None)
        return gaps.update(token_chunk_ns) if gaps is not None else None

    def forget(self, request_id: str) -> None:
        """Follow it no longer (a late snapshot of a request already written finished)."""
        self._gaps.pop(request_id, None)

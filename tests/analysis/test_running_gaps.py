"""analysis.running_gaps: sorted gaps extended by what is new equal the gaps sorted whole, whatever it is handed."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from analysis.phases import percentile, token_gaps_ns
from analysis.running_gaps import MAX_RUNNING_REPLIES, RunningGaps, RunningReplies

times = st.lists(st.integers(min_value=0, max_value=2**40), min_size=0, max_size=200)


@given(times, st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_growing_a_reply_gives_the_gaps_sorted_whole(chunks: list[int], cuts: list[int]) -> None:
    gaps = RunningGaps()
    for n in [*sorted(cuts), len(chunks)]:
        got = list(gaps.update(chunks[:n]))
        assert got == sorted(token_gaps_ns(chunks[:n]))


@given(times.filter(bool), times, st.sampled_from(["first", "last seen", "shorter"]))
def test_a_list_that_does_not_continue_the_one_seen_is_taken_whole(first: list[int], tail: list[int], how: str) -> None:
    gaps = RunningGaps()
    gaps.update(first)
    other = [*first, *tail]
    if how == "first":
        other[0] += 1
    elif how == "last seen":
        other[len(first) - 1] -= 1
    else:
        other = first[:-1]
    assert list(gaps.update(other)) == sorted(token_gaps_ns(other))


def test_percentiles_read_from_it_equal_those_of_a_sorted_list() -> None:
    chunks = list(itertools.accumulate((7 * i) % 101 + 1 for i in range(5_000)))
    gaps = RunningGaps()
    for n in range(0, 5_001, 250):
        kept = gaps.update(chunks[:n])
    whole = sorted(token_gaps_ns(chunks))
    for q in (50, 99, 100):
        assert percentile(kept, q) == percentile(whole, q)


def test_replies_followed_are_bounded_oldest_dropped_first() -> None:
    assert MAX_RUNNING_REPLIES == RunningReplies().max_replies == 1024
    replies = RunningReplies(max_replies=3)
    for rid in ("a", "b", "c", "d"):
        replies.sorted_gaps(rid, [1, 3, 6])
    assert len(replies) == 3
    replies.sorted_gaps("b", [1, 3, 6, 10])  # written again: now the most recent
    replies.sorted_gaps("e", [1, 2])
    assert replies.finish("c", [1, 3, 6]) is None  # dropped: the oldest after b was written
    assert list(replies.finish("b", [1, 3, 6, 10, 15]) or []) == [2, 3, 4, 5]
    assert replies.finish("b", [1]) is None  # finished: followed no longer

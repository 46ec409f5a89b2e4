"""The collector's beat: periodic work of one period lands on the same instants (collectors.beat)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from collectors.beat import until_next_beat_s


@given(st.floats(0, 1e7), st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0]))
def test_the_next_beat_is_a_multiple_of_the_period_and_never_now(now_s: float, period_s: float) -> None:
    wait_s = until_next_beat_s(now_s, period_s)
    assert 0 < wait_s <= period_s
    beats = (now_s + wait_s) / period_s
    assert math.isclose(beats, round(beats), rel_tol=0, abs_tol=1e-6 * max(1.0, beats))


def test_periods_that_divide_one_another_wake_together() -> None:
    """The runner reader's busy step (0.25 s) and the sampler's tick (1 s) meet on every second."""
    for now_s in (10.0, 10.1, 10.6, 10.99):
        tick_at = now_s + until_next_beat_s(now_s, 1.0)
        at = now_s
        steps = set()
        while at < tick_at - 1e-9:
            at += until_next_beat_s(at, 0.25)
            steps.add(round(at, 9))
        assert round(tick_at, 9) in steps
    assert until_next_beat_s(12.0, 1.0) == 1.0, "on the beat: the next one, not now"

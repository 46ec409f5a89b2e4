"""``collectors.proxy.refusals``: the rate limit of its warnings, the last hour it keeps, the sidebar's words.

A clock the test moves stands in for time.monotonic (minutes and an hour are waited out without waiting).
"""

from __future__ import annotations

import logging

import pytest

from collectors.proxy.refusals import Refusal, Refusals, summary

LOGGER = "collectors.proxy.refusals"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_past_the_limit_lines_are_left_out_and_the_next_line_a_minute_later_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    refusals = Refusals(warnings_per_minute=2, clock_s=clock)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(5):
            refusals.note(400, Refusal.MALFORMED, "192.0.2.1", "malformed HTTP request: Invalid method encountered")
        assert len(lines(caplog)) == 2
        clock.now_s += 61
        refusals.note(503, Refusal.CONNECTION_BOUND, "192.0.2.2", "1024 connections open")
    first, _, last = lines(caplog)
    assert first == (
        "refused a request from 192.0.2.1 (malformed, answered 400): malformed HTTP request: Invalid method encountered"
    )
    assert "192.0.2.2 (too many connections, answered 503)" in last and "3 more refused before this and not logged" in last
    assert refusals.counts == {("400", Refusal.MALFORMED): 5, ("503", Refusal.CONNECTION_BOUND): 1}


def test_a_cut_without_an_answer_is_status_none() -> None:
    refusals = Refusals(warnings_per_minute=10, clock_s=Clock())
    refusals.note(None, Refusal.EVICTED, "", "a request head still arriving when the proxy needed room")
    assert refusals.counts == {("none", Refusal.EVICTED): 1}


def test_the_last_hour_forgets_older_refusals_while_the_counter_keeps_them() -> None:
    clock = Clock()
    refusals = Refusals(warnings_per_minute=10, clock_s=clock)
    refusals.note(400, Refusal.MALFORMED, "192.0.2.1", "x")
    clock.now_s += 30 * 60
    refusals.note(408, Refusal.HEAD_TIMEOUT, "192.0.2.1", "x")
    refusals.note(408, Refusal.HEAD_TIMEOUT, "192.0.2.1", "x")
    assert refusals.last_hour() == {("400", Refusal.MALFORMED): 1, ("408", Refusal.HEAD_TIMEOUT): 2}
    clock.now_s += 31 * 60  # the 400 is over an hour old now
    assert refusals.last_hour() == {("408", Refusal.HEAD_TIMEOUT): 2}
    clock.now_s += 2 * 3600
    refusals.note(400, Refusal.MALFORMED, "192.0.2.1", "x")
    assert refusals.last_hour() == {("400", Refusal.MALFORMED): 1}
    assert refusals.counts == {("400", Refusal.MALFORMED): 2, ("408", Refusal.HEAD_TIMEOUT): 2}


def test_the_sidebars_words_most_first_and_none_when_there_are_none() -> None:
    assert summary({}) is None
    words = summary({("503", Refusal.CONNECTION_BOUND): 1, ("400", Refusal.MALFORMED): 2, ("none", Refusal.EVICTED): 1})
    assert words == "2 × 400 malformed, 1 × 503 too many connections, 1 × cut to make room"

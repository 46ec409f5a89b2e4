"""The relay's state tables (collectors/proxy/relay/states.py), stated here outright, transition by transition.

The expectations are literal lists of (state, event, next state), written apart from the tables they check: a
transition added to, dropped from or redirected in a table fails these tests until the list here says the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import pytest

from collectors.proxy.relay.states import (
    CLIENT_MOVES,
    STAGE_MOVES,
    UPSTREAM_MOVES,
    ClientEvent,
    ClientState,
    IllegalMove,
    Stage,
    StageEvent,
    UpstreamEvent,
    UpstreamState,
    next_state,
)

Transition = tuple[Enum, Enum, Enum]

REQUEST_TRANSITIONS: list[Transition] = [
    (Stage.QUEUED, StageEvent.FORWARD, Stage.FORWARDED),
    (Stage.QUEUED, StageEvent.FAIL, Stage.DONE),  # failed before it went upstream
    (Stage.FORWARDED, StageEvent.RESPOND, Stage.RESPONDED),
    (Stage.FORWARDED, StageEvent.FAIL, Stage.DONE),
    (Stage.RESPONDED, StageEvent.COMPLETE, Stage.DONE),
    (Stage.RESPONDED, StageEvent.FAIL, Stage.DONE),
]

CLIENT_TRANSITIONS: list[Transition] = [
    (ClientState.BETWEEN, ClientEvent.HEAD_BEGINS, ClientState.HEAD),
    (ClientState.BETWEEN, ClientEvent.STOP, ClientState.STOPPED),
    (ClientState.HEAD, ClientEvent.HEAD_ENDS, ClientState.BETWEEN),
    (ClientState.HEAD, ClientEvent.STOP, ClientState.STOPPED),
]

UPSTREAM_TRANSITIONS: list[Transition] = [
    (UpstreamState.CONNECTING, UpstreamEvent.SEND, UpstreamState.WAITING),
    (UpstreamState.CONNECTING, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.CONNECTING, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
    (UpstreamState.WAITING, UpstreamEvent.FIRST_BYTE, UpstreamState.HEAD),
    (UpstreamState.WAITING, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.WAITING, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
    (UpstreamState.HEAD, UpstreamEvent.FINAL_HEAD, UpstreamState.BODY),
    (UpstreamState.HEAD, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.HEAD, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
    (UpstreamState.BODY, UpstreamEvent.RESPONSE_ENDS, UpstreamState.ENDED),
    (UpstreamState.BODY, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.BODY, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
    (UpstreamState.ENDED, UpstreamEvent.KEEP_ALIVE, UpstreamState.IDLE),
    (UpstreamState.ENDED, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.ENDED, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
    (UpstreamState.IDLE, UpstreamEvent.SEND, UpstreamState.WAITING),  # the next request on a kept-alive connection
    (UpstreamState.IDLE, UpstreamEvent.ABORT, UpstreamState.ABORTED),
    (UpstreamState.IDLE, UpstreamEvent.CONNECTION_LOST, UpstreamState.CLOSED),
]

MACHINES = pytest.mark.parametrize(
    ("table", "states", "events", "expected"),
    [
        (STAGE_MOVES, Stage, StageEvent, REQUEST_TRANSITIONS),
        (CLIENT_MOVES, ClientState, ClientEvent, CLIENT_TRANSITIONS),
        (UPSTREAM_MOVES, UpstreamState, UpstreamEvent, UPSTREAM_TRANSITIONS),
    ],
    ids=["request", "client", "upstream"],
)


def _transitions(table: Mapping[Enum, Mapping[Enum, Enum]]) -> list[Transition]:
    return sorted(((old, event, new) for old, row in table.items() for event, new in row.items()), key=_names)


def _names(transition: Transition) -> tuple[str, str, str]:
    return transition[0].name, transition[1].name, transition[2].name


@MACHINES
def test_each_table_holds_exactly_the_transitions_stated_here(
    table: Mapping[Enum, Mapping[Enum, Enum]], states: type[Enum], events: type[Enum], expected: list[Transition]
) -> None:
    assert len(set(expected)) == len(expected)  # no transition stated twice
    assert _transitions(table) == sorted(expected, key=_names)
    assert list(table) == list(states)  # one row per state, final states included (an empty row)


@MACHINES
def test_every_state_and_event_not_stated_here_is_an_illegal_move(
    table: Mapping[Enum, Mapping[Enum, Enum]], states: type[Enum], events: type[Enum], expected: list[Transition]
) -> None:
    allowed = {(old, event): new for old, event, new in expected}
    for old in states:
        for event in events:
            if (old, event) in allowed:
                assert next_state(table, old, event, "x") is allowed[old, event]
            else:
                with pytest.raises(IllegalMove, match=f"^x cannot move from {old.name} on {event.name}$"):
                    next_state(table, old, event, "x")

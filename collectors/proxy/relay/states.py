"""The relay's three state machines, as h11 keeps its own (h11/_state.py): each table says, for every state, which
event moves it and where to.

A request's ``Stage``, a client connection's ``ClientState`` and an upstream connection's ``UpstreamState`` each
change only through its object's ``move(event)``, which looks the event up in its table here; an event the table
lacks for the current state is a bug of ours, raised as ``IllegalMove`` (and so logged with its traceback like any
other exception of ours). Moves happen a few times per request, never per chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum
from typing import TypeVar


class Stage(IntEnum):
    """Where one request is, from its head to the end of its response; it only moves forward."""

    QUEUED = 1  # parsed, waiting behind the active request (or not yet started)
    FORWARDED = 2  # going upstream (connecting first when needed)
    RESPONDED = 3  # a response head went to the client
    DONE = 4  # its exchange ended (complete or failed)

    __hash__ = int.__hash__  # C-level, not Enum's Python-level hash of the name: each move looks its state up


class StageEvent(Enum):
    """What moves a request on."""

    FORWARD = 1  # it became the active request: going upstream
    RESPOND = 2  # a response head went to the client: Ollama's, or the relay's own answer (a 502)
    COMPLETE = 3  # the response to the client is complete
    FAIL = 4  # its exchange ended early (a ``Failure``)

    __hash__ = object.__hash__  # by identity, as members compare: each move looks its event up


class ClientState(Enum):
    """What one client connection's parser is doing."""

    BETWEEN = 1  # between request heads (a request may be in flight)
    HEAD = 2  # a request head has begun and not ended
    STOPPED = 3  # parses no more (refused, broken, evicted, failed): answers what is queued, then closes

    __hash__ = object.__hash__  # by identity, as members compare: each move looks its state up (3x faster)


class ClientEvent(Enum):
    """What moves a client connection's parser on."""

    HEAD_BEGINS = 1  # llhttp began a request head
    HEAD_ENDS = 2  # the request head is complete (its body, if any, follows)
    STOP = 3  # a refusal, a broken request, an eviction or our own error: parse no more

    __hash__ = object.__hash__


class UpstreamState(Enum):
    """One connection to Ollama, through its requests: CONNECTING, then (WAITING, HEAD, BODY, ENDED, IDLE)
    per request, until ABORTED (by us) or CLOSED (by the other end or the loop)."""

    CONNECTING = 1
    WAITING = 2  # the request went out; no byte of its response yet
    HEAD = 3  # response head bytes arriving (interim 1xx answers included)
    BODY = 4  # the final head went to the client; its body follows
    ENDED = 5  # the response is complete; finished once the parser has returned
    IDLE = 6  # open, kept alive for the next request
    ABORTED = 7
    CLOSED = 8

    __hash__ = object.__hash__  # by identity, as members compare: each move looks its state up (3x faster)


class UpstreamEvent(Enum):
    """What moves a connection to Ollama on."""

    SEND = 1  # a request's head went out on it
    FIRST_BYTE = 2  # the first byte of the response arrived
    FINAL_HEAD = 3  # a final (not 1xx) response head arrived and went to the client
    RESPONSE_ENDS = 4  # the response is complete (at once when it has no body)
    KEEP_ALIVE = 5  # the exchange finished and the connection may serve another request
    ABORT = 6  # we drop it
    CONNECTION_LOST = 7  # the other end (or the loop) closed it, or it never opened

    __hash__ = object.__hash__


class IllegalMove(RuntimeError):
    """A state machine of the relay was asked for a move its table lacks: a bug of ours, never the client's."""


# For each state, the events that move it and where to. Each object's ``move`` is the only place its state changes.
STAGE_MOVES: dict[Stage, dict[StageEvent, Stage]] = {
    Stage.QUEUED: {StageEvent.FORWARD: Stage.FORWARDED, StageEvent.FAIL: Stage.DONE},  # FAIL: before it went upstream
    Stage.FORWARDED: {StageEvent.RESPOND: Stage.RESPONDED, StageEvent.FAIL: Stage.DONE},
    Stage.RESPONDED: {StageEvent.COMPLETE: Stage.DONE, StageEvent.FAIL: Stage.DONE},
    Stage.DONE: {},
}
CLIENT_MOVES: dict[ClientState, dict[ClientEvent, ClientState]] = {
    ClientState.BETWEEN: {ClientEvent.HEAD_BEGINS: ClientState.HEAD, ClientEvent.STOP: ClientState.STOPPED},
    ClientState.HEAD: {ClientEvent.HEAD_ENDS: ClientState.BETWEEN, ClientEvent.STOP: ClientState.STOPPED},
    ClientState.STOPPED: {},
}
# Every open state may be dropped by us or lost; ABORTED and CLOSED are final.
_GONE = {UpstreamEvent.ABORT: UpstreamState.ABORTED, UpstreamEvent.CONNECTION_LOST: UpstreamState.CLOSED}
UPSTREAM_MOVES: dict[UpstreamState, dict[UpstreamEvent, UpstreamState]] = {
    UpstreamState.CONNECTING: {UpstreamEvent.SEND: UpstreamState.WAITING, **_GONE},
    UpstreamState.WAITING: {UpstreamEvent.FIRST_BYTE: UpstreamState.HEAD, **_GONE},
    UpstreamState.HEAD: {UpstreamEvent.FINAL_HEAD: UpstreamState.BODY, **_GONE},  # interim 1xx answers stay in HEAD
    UpstreamState.BODY: {UpstreamEvent.RESPONSE_ENDS: UpstreamState.ENDED, **_GONE},
    UpstreamState.ENDED: {UpstreamEvent.KEEP_ALIVE: UpstreamState.IDLE, **_GONE},
    UpstreamState.IDLE: {UpstreamEvent.SEND: UpstreamState.WAITING, **_GONE},  # the next request on a kept-alive one
    UpstreamState.ABORTED: {},
    UpstreamState.CLOSED: {},
}

S = TypeVar("S", bound=Enum)
E = TypeVar("E", bound=Enum)


def next_state(table: Mapping[S, Mapping[E, S]], old: S, event: E, what: str) -> S:
    """Where ``event`` moves ``old`` in ``table``; ``IllegalMove`` if the table lacks it."""
    new = table[old].get(event)
    if new is None:
        raise IllegalMove(f"{what} cannot move from {old.name} on {event.name}")
    return new


# The members read for every streamed chunk or body piece, by plain names: reading a member off its Enum class costs
# ~0.1 µs in Python 3.11 (a descriptor), a module global a tenth of that.
FORWARDED, RESPONDED, DONE = Stage.FORWARDED, Stage.RESPONDED, Stage.DONE
WAITING, HEAD, ENDED = UpstreamState.WAITING, UpstreamState.HEAD, UpstreamState.ENDED
ABORTED, CLOSED = UpstreamState.ABORTED, UpstreamState.CLOSED

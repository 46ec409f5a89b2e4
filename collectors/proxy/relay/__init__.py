"""HTTP/1.1 relay on plain asyncio protocols: the recording proxy's byte layer.

Why not aiohttp's server and client: per streamed chunk they cost about 40 µs of
CPU on our 2-core machines (a future, a task step and re-framing on each side)
against 25 µs for a bare socket relay, and with a batching server every stream
wakes in the same tick. Here both directions are parsed by httptools (llhttp, Node.js's
parser) and each response body piece goes to the client inside the callback of
the read that brought it: one timestamp, one append, one write.

What a request means (which ones are recorded, what the record holds, the error
texts) is the caller's: ``Relay`` asks ``route`` where each request goes and
reports to the ``Exchange`` it gets back.

Whose fault: bytes llhttp refuses are the client's (400) or Ollama's (502); an
exception raised by our own code (``route``, an ``Exchange`` hook, the relay) is
ours: logged with its traceback, answered 500 if no response began (else that
connection is cut), and every other connection goes on. Every answer the relay writes
itself for the client's fault (and every connection it cuts to make room) is a refusal:
logged, counted and kept for the sidebar by ``collectors.proxy.refusals``.

Its rooms, as uvicorn splits its protocols (uvicorn/protocols/http/):

- ``states``: the three state machines, each transition labelled by the event that moves it (as h11 keeps its own);
- ``wire``: HTTP/1.1 framing, the headers that travel, the answers the relay writes itself;
- ``exchange``: what the relay shares with its caller about one request (``Target``, ``RequestHead``, ``Exchange``);
- ``flow_control``: when either side's transport pauses and resumes reading;
- ``client_side`` and ``upstream_side``: the two asyncio protocols;
- ``relay``: ``Relay``, which listens, admits connections within their bounds, pools idle upstream connections.

Everything here logs as ``collectors.proxy.relay``.
"""

from collectors.proxy.relay.exchange import Exchange, Failure, RequestHead, Route, Target
from collectors.proxy.relay.relay import MAX_IDLE_UPSTREAMS, Relay
from collectors.proxy.relay.upstream_side import CONNECT_TIMEOUT_S
from collectors.proxy.relay.wire import HOP_BY_HOP, Headers, Refused

__all__ = [
    "CONNECT_TIMEOUT_S",
    "HOP_BY_HOP",
    "MAX_IDLE_UPSTREAMS",
    "Exchange",
    "Failure",
    "Headers",
    "Refused",
    "Relay",
    "RequestHead",
    "Route",
    "Target",
]

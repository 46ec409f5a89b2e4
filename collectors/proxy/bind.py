"""The proxy's listening socket, bound so that no second process can take its port.

On POSIX, ``SO_REUSEADDR`` (asyncio's ``reuse_address=True``) only lets a restart bind over connections still in
TIME_WAIT: a second listener on the same address is refused. On Windows the same option lets any process bind the
port too and take a share of its connections; there the socket is bound with ``SO_EXCLUSIVEADDRUSE`` instead.
Chosen by whether the ``socket`` module has that option, not by the platform's name.
"""

from __future__ import annotations

import socket

BACKLOG = 1024


def exclusive_socket(host: str, port: int) -> socket.socket | None:
    """A listening, non-blocking socket bound with ``SO_EXCLUSIVEADDRUSE`` where the OS has it; None elsewhere (the
    caller binds with ``reuse_address=True``). OSError when the address cannot be bound."""
    exclusive = getattr(socket, "SO_EXCLUSIVEADDRUSE", None)
    if exclusive is None:
        return None
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, exclusive, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

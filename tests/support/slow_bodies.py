"""A client holding many request bodies that arrive slowly, and other clients counting how many of their requests
are served beside it (issue 25, finding 5). Raw sockets, so each side picks its source address on loopback."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

SLOW_HEAD = b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def hold_slow_bodies(port: int, source: str, count: int, sent_bytes: int) -> list[socket.socket]:
    """``count`` connections from ``source``, each sending a head for a 33 MB body and its first ``sent_bytes``, then
    nothing more; returns them all (the caller closes them)."""
    held = []
    start = b'{"model": "m", "prompt": "' + b"x" * max(0, sent_bytes - 26)
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        held.append(s)
        with contextlib.suppress(OSError):  # refused at once: the proxy wrote 503 and closed
            s.sendall(SLOW_HEAD % (33 << 20) + start)
    return held


def still_held(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the proxy still holds open without a word (not answered, not closed)."""
    open_count = 0
    for s in socks:
        s.setblocking(False)
        try:
            s.recv(4096)  # an answer (503, 408) or the close: not held
        except BlockingIOError:
            open_count += 1
        except OSError:
            pass
        finally:
            s.setblocking(True)
    return open_count


def attempts_served(port: int, source: str, attempts: int) -> int:
    """``attempts`` requests from ``source``, one connection each, one after another; how many got a 200."""
    served = 0
    for _ in range(attempts):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
                s.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
        except OSError:
            continue
        served += reply.startswith(b"HTTP/1.1 200")
    return served


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for process {pid}")

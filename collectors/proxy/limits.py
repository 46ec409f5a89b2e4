"""Every bound the recording proxy keeps against hostile or broken clients and upstreams, in one place.

Each field is a named setting: ``PHASEWATCH_`` plus its name in capitals is its
environment variable (``PHASEWATCH_MAX_HEAD_BYTES=131072``); ``config.load_limits``
reads them. The defaults leave room for every real Ollama client: streams of many
minutes (idle timeouts only count while no byte moves), images in request bodies,
hundreds of concurrent requests.
"""

from __future__ import annotations

from dataclasses import dataclass

FD_RESERVE = 64  # descriptors kept for the store, the samplers and the local routes
# Where the OS sets no per-process descriptor limit to read (Windows: no ``resource``; sockets are handles, bounded
# by memory), the connection cap is taken against this many.
NO_RLIMIT_FDS = 8192


@dataclass(frozen=True)
class Limits:
    max_head_bytes: int = 64 * 1024  # one request head (request line and headers): 431 beyond
    max_kept_body_bytes: int = 32 << 20  # request body kept to record its facts; the rest is forwarded unkept
    # Kept bytes of all request bodies still arriving, together: beyond it, what arrives is forwarded unkept (its
    # record says truncated), so a crowd of slow bodies cannot pin max_kept_body_bytes each.
    max_kept_bodies_bytes: int = 256 << 20
    max_pipelined: int = 16  # requests parsed on one connection ahead of their answers
    max_pipelined_bytes: int = 1 << 20  # body bytes held for a request not yet sent upstream
    max_line_bytes: int = 16 << 20  # one upstream NDJSON line, SSE event or JSON body kept for parsing
    # A response line, event or body, or a request body (images), longer than this is parsed in a worker process:
    # the stdlib decoder holds the GIL for ~1 s per 16 MB (an embeddings reply), and every other stream would stall.
    big_body_bytes: int = 256 << 10
    max_big_bodies_waiting: int = 4  # large bodies queued for (or in) the worker; beyond it, recorded unparsed
    big_parse_timeout_s: float = 30.0  # from queueing a large body to its result; beyond it, recorded unparsed
    max_unparsed_bytes: int = 8 << 20  # response bytes recorded but not yet parsed before reading pauses
    max_label_chars: int = 256  # a model name kept in a record
    max_connections: int = 1024  # client connections in all (also held under the fd limit)
    max_connections_per_client: int = 512  # client connections from one address...
    max_client_share: float = 0.5  # ...and at most this share of the cap, so other addresses always find room
    head_timeout_s: float = 30.0  # from a head's first byte to its end
    # A request body with no byte arriving for this long ends (408); it is also the body's grace before its rate
    # counts.
    body_timeout_s: float = 60.0
    # After that grace, every body_rate_window_s must bring min_body_rate_bps on average (408 otherwise). What came
    # before buys no time, so a body cannot be trickled for hours after a fast start.
    min_body_rate_bps: int = 1024
    body_rate_window_s: float = 10.0
    # At the connection bound, with no idle connection to close, a connection whose only request's body has been
    # arriving for this long may be cut to make room, the oldest first (its record says evicted).
    slow_body_s: float = 5.0
    idle_timeout_s: float = 120.0  # a connection with no request and no byte
    # Requests the relay refuses itself (400, 408, 431, 503, …) are each logged at WARNING, at most this many lines a
    # minute: a flood of bad requests cannot fill the log (every one is still counted in /phasewatch/metrics).
    refusal_warnings_per_minute: int = 10

    def connection_cap(self, fd_soft_limit: int) -> int:
        """Client connections allowed: each may hold an upstream connection too, so half the spare fds."""
        return max(8, min(self.max_connections, (fd_soft_limit - FD_RESERVE) // 2))


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one (desktops often start at 1024); returns the soft limit."""
    try:
        import resource
    except ImportError:
        return NO_RLIMIT_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (hard, 1 << 20, 10240):  # macOS refuses RLIM_INFINITY and values above OPEN_MAX
        if want == resource.RLIM_INFINITY or want <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            return want
        except (ValueError, OSError):
            continue
    return soft


def fd_soft_limit() -> int:
    try:
        import resource
    except ImportError:
        return NO_RLIMIT_FDS
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft

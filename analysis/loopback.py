"""The one loopback test: is this host name or address this machine's own loopback?

Everything that decides "local or not" asks here (the collector's listen address, a runner's --host, which Ollama's
log is ours to read, which clients' processes can be looked up, how the Why report names a client), so that a form
one place takes (``[::1]``, a zone, an IPv4-mapped address) is taken by all. It lives in ``analysis`` because every
layer may import ``analysis`` (pyproject's import contracts).
"""

from __future__ import annotations

import ipaddress

# The one name that means loopback by definition; any other name would need a resolver to judge.
LOOPBACK_NAME = "localhost"


def is_loopback(host: str | None) -> bool:
    """True for ``localhost``, 127.0.0.0/8, ``::1`` (bare or as ``[::1]``, with or without a ``%zone``) and
    IPv4-mapped loopback (``::ffff:127.0.0.1``). False for anything else, ``0.0.0.0``/``::`` (every address, not
    loopback), a name that only starts like one (``127.0.0.1.evil.com``), and None or empty."""
    if not host:
        return False
    if host.lower().rstrip(".") == LOOPBACK_NAME:
        return True
    bracketed = host.startswith("[") and host.endswith("]")
    text = host[1:-1] if bracketed else host
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])  # a zone (fe80::1%eth0) names an interface, not the address
    except ValueError:
        return False
    if bracketed and addr.version != 6:
        return False  # a URL brackets IPv6 only: "[127.0.0.1]" is no address
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))

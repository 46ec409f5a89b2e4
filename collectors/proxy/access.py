"""Which Hosts and browser Origins the proxy answers: Ollama's own rules, so a page can do no more through us.

Host (against DNS rebinding: a page at ``http://evil.example`` whose name resolves to
127.0.0.1 sends ``Host: evil.example``): as Ollama's ``allowedHostsMiddleware``, an empty
Host, IP literals that are loopback, private, unspecified or this machine's, and the names
``localhost``, this machine's hostname and ``*.localhost``, ``*.local``, ``*.internal``;
plus the address the proxy listens on and the names in ``PHASEWATCH_ALLOWED_HOSTS``
(``*`` allows any). Unlike Ollama, the check also holds when listening beyond loopback.

Origin (a page sending requests cross-origin): as Ollama's CORS rules, the origin of the
request's own Host, ``http(s)://localhost``, ``127.0.0.1`` and ``0.0.0.0`` with any port,
``app://``, ``file://``, ``tauri://``, ``vscode-webview://``, ``vscode-file://``, plus the
entries of ``OLLAMA_ORIGINS`` (comma-separated; one ``*`` per entry is a wildcard; ``*``
alone allows any).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable

_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
# Go's netip.Addr.IsPrivate: RFC 1918 and RFC 4193, nothing else.
_PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
_DEFAULT_ORIGINS = (
    *(
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0")
        for port in ("", ":*")
        for scheme in ("http", "https")
    ),
    *("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*"),
)


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated setting: entries trimmed, empty ones dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def host_name(host_header: str) -> str:
    """The host of a Host header, without port or brackets, lower-case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


@functools.cache
def _this_machine_ips() -> frozenset[str]:
    import psutil  # only for a Host that is a public IP literal: rare, and the proxy alone need not load it

    try:
        return frozenset(a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs)
    except OSError:
        return frozenset()


class HostPolicy:
    def __init__(self, listen_host: str = "", allowed: Iterable[str] = ()) -> None:
        names = {host_name(n) for n in allowed}
        self.any = "*" in names
        self.names = names | {"localhost", socket.gethostname().lower()}
        if listen_host:
            self.names.add(host_name(f"[{listen_host}]" if ":" in listen_host else listen_host))

    def allows(self, host_header: str) -> bool:
        host = host_name(host_header)
        if self.any or host == "" or host in self.names or host.endswith(_LOCAL_SUFFIXES):
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        return ip.is_loopback or ip.is_unspecified or any(ip in n for n in _PRIVATE) or host in _this_machine_ips()


class OriginPolicy:
    def __init__(self, extra: Iterable[str] = ()) -> None:
        entries = [*extra, *_DEFAULT_ORIGINS]
        self.any = "*" in entries
        self.exact = frozenset(e.lower() for e in entries if "*" not in e)
        # gin-contrib/cors wildcards: one "*" per entry splits it into a prefix and a suffix.
        self.wildcards = tuple(tuple(e.split("*", 1)) for e in entries if e.count("*") == 1 and e != "*")

    def allows(self, origin: str, host_header: str) -> bool:
        if self.any or origin in (f"http://{host_header}", f"https://{host_header}"):
            return True  # the page's own origin: not a cross-origin request
        if origin in self.exact:
            return True
        return any(origin.startswith(prefix) and origin.endswith(suffix) for prefix, suffix in self.wildcards)

"""The dashboard refuses foreign Host names (DNS rebinding) on every route, and keeps XSRF protection on.

Unit checks of ``pages.shared.host_guard``, then raw HTTP with forged Host headers against a real
``streamlit run app.py`` on a free loopback port.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from pages.shared.host_guard import ALLOWED_HOSTS_ENV, allowed_names, host_allowed, host_name
from tests.e2e.support import run_app

NAMES = allowed_names(["127.0.0.1", "0.0.0.0"], {ALLOWED_HOSTS_ENV: "Dash.LAN, *.home.arpa"})


def test_host_name_parses_ports_brackets_and_rejects_malformed() -> None:
    assert host_name("LocalHost:8501") == "localhost"
    assert host_name("[::1]:8501") == "::1" and host_name("[::1]") == "::1"
    assert host_name("example.com.") == "example.com"
    for bad in (None, "", "a:b", "x:99999", "user@localhost", "localhost/x", "localhost?q", "[::1"):
        assert host_name(bad) is None, bad


def test_allowed_names_loopback_configured_and_setting() -> None:
    assert NAMES == ("localhost", "127.0.0.1", "::1", "dash.lan", "*.home.arpa")  # 0.0.0.0 names no host
    for ok in ("localhost:8501", "127.0.0.1", "[::1]:1", "dash.lan:8501", "DASH.LAN", "pc.home.arpa:8501"):
        assert host_allowed(ok, NAMES), ok
    for bad in (
        "evil.example:8501",
        "evil.example",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
        "home.arpa",
        "0.0.0.0:8501",
        "127.0.0.2",
        None,
    ):
        assert not host_allowed(bad, NAMES), bad
    assert host_allowed("anything.example", ("*",))
    assert "192.168.1.5" in allowed_names(["192.168.1.5"], {})


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("host-guard")
    with run_app(tmp / "data", tmp / "app.log", {"PHASEWATCH_COLLECTOR": "off", ALLOWED_HOSTS_ENV: "dash.lan"}) as url:
        yield url


def _response(
    url: str, method: str, path: str, host: str, headers: dict[str, str] | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def _answer(url: str, method: str, path: str, host: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    status, _, body = _response(url, method, path, host, headers)
    return status, body


def _status(url: str, method: str, path: str, host: str) -> int:
    return _answer(url, method, path, host)[0]


def _websocket_status(url: str, host: str) -> int:
    """The status line's code of a WebSocket upgrade to Streamlit's ``/_stcore/stream``."""
    return int(_websocket_head(url, host).split(b" ", 2)[1])


def _websocket_head(url: str, host: str) -> bytes:
    """The status line and headers of the answer to a WebSocket upgrade to Streamlit's ``/_stcore/stream``."""
    parts = urlsplit(url)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /_stcore/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: streamlit\r\n"
        f"Origin: http://{host}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as s:
        s.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = s.recv(4096)
            if not data:
                break
            head += data
    return head.split(b"\r\n\r\n")[0]


def _static_path(url: str, host: str) -> str:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=20)
    try:
        conn.request("GET", "/", headers={"Host": host})
        page = conn.getresponse().read().decode()
    finally:
        conn.close()
    start = page.index("./static/js/") + 1
    return page[start : page.index('"', start)]


ROUTES = ["/", "/lab", "/why", "/_stcore/health", "/_stcore/host-config", "/favicon.png"]


def test_loopback_and_allowed_hosts_are_served(app_url: str) -> None:
    port = urlsplit(app_url).port
    static = _static_path(app_url, f"127.0.0.1:{port}")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"dash.lan:{port}"):
        for path in [*ROUTES, static]:
            assert _status(app_url, "GET", path, host) == 200, (host, path)
        assert _websocket_status(app_url, host) == 101, host


@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "127.0.0.1.evil.example:{port}", "", "a b"])
def test_foreign_hosts_get_403_everywhere(app_url: str, host: str) -> None:
    port = urlsplit(app_url).port
    host = host.format(port=port)
    static = _static_path(app_url, f"127.0.0.1:{port}")
    for path in [*ROUTES, static]:
        assert _status(app_url, "GET", path, host) == 403, (host, path)
    assert _status(app_url, "POST", "/_stcore/upload_file/s/f", host) == 403
    assert _websocket_status(app_url, host) == 403


def test_xsrf_protection_stays_on(app_url: str) -> None:
    """An upload without the XSRF cookie and header is refused even from an allowed Host (without XSRF: 400)."""
    host = f"127.0.0.1:{urlsplit(app_url).port}"
    status, body = _answer(app_url, "PUT", "/_stcore/upload_file/session/file", host, {"Content-Length": "0"})
    assert (status, body) == (403, b"XSRF token missing or invalid")


def _frames_refused(headers: http.client.HTTPMessage) -> bool:
    """Both forms of "no page may frame this" (issue 25 #8, clickjacking), each exactly once."""
    return headers.get_all("X-Frame-Options") == ["DENY"] and headers.get_all("Content-Security-Policy") == [
        "frame-ancestors 'none'"
    ]


def test_every_answer_forbids_framing(app_url: str) -> None:
    """Pages, static files, /_stcore/*, fallbacks, the guard's 403s and both WebSocket answers forbid framing."""
    port = urlsplit(app_url).port
    static = _static_path(app_url, f"127.0.0.1:{port}")
    for host, expected in ((f"127.0.0.1:{port}", 200), (f"evil.example:{port}", 403)):
        for path in [*ROUTES, "/requests", static]:
            status, headers, _ = _response(app_url, "GET", path, host)
            assert status == expected and _frames_refused(headers), (host, path, status, headers.items())
        for path in ("/static/no-such-file.js", "/_stcore/no-such-route"):  # Streamlit's fallbacks and 404s
            status, headers, _ = _response(app_url, "GET", path, host)
            assert _frames_refused(headers), (host, path, status)
    for host, status_line in ((f"127.0.0.1:{port}", b" 101 "), (f"evil.example:{port}", b" 403 ")):
        head = _websocket_head(app_url, host).lower()
        assert status_line in head.split(b"\r\n")[0], head
        assert b"\r\nx-frame-options: deny" in head and b"\r\ncontent-security-policy: frame-ancestors 'none'" in head

"""HTTP/1.1 on the wire, for both sides of the relay: which headers travel, how bodies are framed, what llhttp's
complaints mean, and the bytes of the answers the relay writes itself."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote_to_bytes

import httptools

from collectors.proxy.refusals import Refusal

Headers = list[tuple[bytes, bytes]]

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection and are never forwarded.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te"}
    | {b"trailer", b"transfer-encoding", b"upgrade"}
)
# Never forwarded as the client or Ollama sent them: the relay frames every body it forwards itself.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
NO_BODY_STATUS = frozenset({204, 304})
_DIGITS = re.compile(rb"[0-9]{1,18}")
INTERNAL_ERROR = (
    "internal error in Phasewatch's proxy: a bug on our side, not in the request or in Ollama; "
    "the collector's log has the details"
)


class Refused(Exception):
    """Raised by a ``Route`` for a request that must not go anywhere: answered with ``status`` (0: no answer), then
    closed; ``why`` is its reason on the record (``collectors.proxy.refusals``)."""

    def __init__(self, status: int, reason: bytes, message: str, why: Refusal) -> None:
        super().__init__(message)
        self.status, self.reason, self.message, self.why = status, reason, message, why


class StopParsing(Exception):
    """Raised inside a parser callback to stop llhttp at this point of the bytes."""


def parser_problem(exc: Exception) -> Exception | None:
    """What ``feed_data`` raised, sorted: what was wrong with the bytes, or None for a deliberate stop.

    httptools turns an exception raised in a callback into ``HttpParserCallbackError`` with the original
    as its ``__context__``. Ours are told apart here: ``StopParsing`` is a deliberate stop (None), an
    ``HttpParserError`` raised by a callback is the bytes' fault (returned), and anything else is a bug in
    our own code (route, a recording hook): raised as itself, with its traceback, never blamed on the bytes.
    A protocol upgrade is returned as ``HttpParserUpgrade``.
    """
    if isinstance(exc, httptools.HttpParserCallbackError):
        cause = exc.__context__
        if isinstance(cause, StopParsing):
            return None
        if cause is None:
            return exc
        if isinstance(cause, httptools.HttpParserError):  # a callback found the bytes wrong: its words, not llhttp's
            return cause
        raise cause from None
    if isinstance(exc, (httptools.HttpParserError, httptools.HttpParserUpgrade)):
        return exc
    raise exc


def request_target(url: bytes) -> tuple[bytes, str]:
    """(path and query as sent, decoded path) of a request target; ``HttpParserInvalidURLError`` if malformed."""
    parsed = httptools.parse_url(url)
    raw_path = url  # origin form, as nearly every client sends it
    if not raw_path.startswith(b"/"):  # absolute form (http://host/path): keep path and query
        raw_path = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    return raw_path, unquote(parsed.path or b"/")


def header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def forwardable(headers: Headers, drop: frozenset[bytes]) -> Headers:
    """Headers without hop-by-hop ones, those named in Connection, framing ones, and ``drop`` (lower-case names).

    Framing headers go whatever Connection says: the relay writes its own (naming
    Content-Length in Connection must never leave a body unframed).
    """
    named = {t.strip().lower() for k, v in headers if k.lower() == b"connection" for t in v.split(b",")}
    return [
        (k, v)
        for k, v in headers
        if (low := k.lower()) not in HOP_BY_HOP and low not in _FRAMING and low not in drop and low not in named
    ]


def request_framing(headers: Headers, http_version: str) -> tuple[bool, int | None]:
    """(chunked, Content-Length) of a request head, as strict as nginx and Go's net/http; ``Refused`` otherwise.

    RFC 9112 §6.3: one Transfer-Encoding, and it must be a lone ``chunked`` (in HTTP/1.1);
    one Content-Length of digits; never both; one Host, required in HTTP/1.1.
    """
    if http_version not in ("1.0", "1.1"):
        raise Refused(
            505, b"HTTP Version Not Supported", f"HTTP/{http_version} is not supported; use HTTP/1.1", Refusal.HTTP_VERSION
        )
    hosts = 0
    codings: list[bytes] = []
    lengths: list[bytes] = []
    for key, value in headers:  # one pass: this runs for every request
        low = key.lower()
        if low == b"host":
            hosts += 1
        elif low == b"transfer-encoding":
            codings.append(value)
        elif low == b"content-length":
            lengths.append(value)
    if hosts > 1 or (http_version == "1.1" and not hosts):
        raise Refused(400, b"Bad Request", "an HTTP/1.1 request needs exactly one Host header", Refusal.MALFORMED)
    if len(codings) > 1 or len(lengths) > 1:
        raise Refused(400, b"Bad Request", "more than one Transfer-Encoding or Content-Length header", Refusal.MALFORMED)
    if codings and lengths:
        raise Refused(400, b"Bad Request", "both Transfer-Encoding and Content-Length", Refusal.MALFORMED)
    if codings:
        if http_version != "1.1":
            raise Refused(400, b"Bad Request", "Transfer-Encoding in an HTTP/1.0 request", Refusal.MALFORMED)
        if codings[0].strip(b" \t").lower() != b"chunked":
            raise Refused(501, b"Not Implemented", "only Transfer-Encoding: chunked is supported", Refusal.TRANSFER_CODING)
        return True, None
    if lengths:
        value = lengths[0].strip(b" \t")
        if not _DIGITS.fullmatch(value):
            raise Refused(400, b"Bad Request", "Content-Length is not a number", Refusal.MALFORMED)
        return False, int(value)
    return False, None


def response_framing(headers: Headers) -> tuple[bool, int | None]:
    """(chunked, Content-Length) of Ollama's response head; ``HttpParserError`` for a coding other than a lone
    chunked. llhttp has already refused a Content-Length that is not digits."""
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for key, value in headers:
        low = key.lower()
        if low == b"content-length":
            lengths.append(value)
        elif low == b"transfer-encoding":
            codings.append(value)
    if codings and (len(codings) > 1 or codings[0].strip(b" \t").lower() != b"chunked"):
        raise httptools.HttpParserError("a transfer coding other than a lone chunked")
    length = int(lengths[0].strip(b" \t")) if lengths and not codings else None
    return bool(codings), length


def head_bytes(first_line: bytes, headers: Headers) -> bytes:
    return first_line + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"


def json_response(status: int, reason: bytes, message: str, extra: Headers, close: bool) -> bytes:
    body = json.dumps({"error": message}).encode()
    headers = [(b"Content-Type", b"application/json; charset=utf-8"), (b"Content-Length", str(len(body)).encode())]
    headers += extra
    if close:
        headers.append((b"Connection", b"close"))
    return head_bytes(b"HTTP/1.1 %d %s" % (status, reason), headers) + body


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(piece), piece)


def unquote(path: bytes) -> str:
    return unquote_to_bytes(path).decode("utf-8", "replace")

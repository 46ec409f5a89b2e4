"""One escaping for text a client or a server chose that reaches a terminal or a report: model names, client
strings, error messages.

Any client of Ollama's API picks the model name it sends, and Ollama echoes it in its 404; printed as it is, an
ESC starts a terminal control sequence and a CR or LF starts a line of the client's making (a forged "Requests: 0
finished" in a report). ``printable`` keeps every character Python's ``repr`` keeps (letters of any script,
digits, punctuation, the space) and writes each other one as its escape: control bytes (C0, DEL, C1), line and
paragraph separators, format characters (bidirectional overrides, zero-width ones), surrogates, unassigned code
points. A backslash stays as it is: the escapes are for reading, not for decoding back.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal could act on written as its escape (``\\x1b``, ``\\n``, ``\\u202e``)."""
    if text.isprintable():  # the common case, in C
        return text
    return "".join(ch if ch.isprintable() or ch == " " else _escaped(ch) for ch in text)

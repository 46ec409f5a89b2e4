"""``analysis.printable``: what a terminal could act on is written as its escape; text of any script stays."""

from __future__ import annotations

import pytest

from analysis.printable import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("llama3.2:latest", "llama3.2:latest"),
        ("café 模型 😀 × ·", "café 模型 😀 × ·"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\nRequests: 0", "a\\nRequests: 0"),
        ("\r\t\x00\x07\x7f", "\\r\\t\\x00\\x07\\x7f"),
        ("\x9b31m", "\\x9b31m"),  # C1 CSI: a terminal's ESC [
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),  # bidirectional overrides
        ("a\u2028b\u0085c", "a\\u2028b\\x85c"),  # line separators str.splitlines() splits on
        ("\ud83d", "\\ud83d"),  # a lone surrogate
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert "\n" not in printable(text) and printable(text).isprintable()

"""Which program sent a request, from its ``User-Agent``: the first product and its version, nothing more.

A ``User-Agent`` is a list of products (RFC 9110 §10.1.5: ``product/version``, comments in parentheses), and past
the first it says things no one here needs (the OS, the CPU, a browser's whole lineage): only the first product and
its version are kept. The OpenAI and Anthropic SDKs write theirs as ``OpenAI/Python 1.99.0``: a "version" that is
no number followed by a bare number is read as that product ("OpenAI/Python") with that version.

The header is the client's text: each part is cut to a named bound and written printable (``analysis.printable``).
No header, or one with no product, is unknown (None), never "".
"""

from __future__ import annotations

from typing import NamedTuple

from analysis.printable import printable

MAX_PRODUCT_CHARS = 64  # "ollama-python", "OpenAI/Python", "Mozilla": far under
MAX_VERSION_CHARS = 32  # "0.6.1", "1.99.0", "3.12.0rc1+local"
# Only the start of the header is read: two products at most are looked at, each under its bound.
_READ_CHARS = 4 * (MAX_PRODUCT_CHARS + MAX_VERSION_CHARS)


class ClientProgram(NamedTuple):
    product: str | None  # None: not known (no User-Agent, or one naming no product)
    version: str | None  # None: not known (no version given)


UNKNOWN_PROGRAM = ClientProgram(None, None)


def _cut(text: str, max_chars: int) -> str:
    """``text`` printable and at most ``max_chars`` long, marked with "…" when cut."""
    shown = printable(text)
    return shown if len(shown) <= max_chars else shown[: max_chars - 1] + "…"


def _is_version(text: str) -> bool:
    return text[:1].isdigit()


def program_of(user_agent: str | None) -> ClientProgram:
    """The first product of ``user_agent`` and its version; ``UNKNOWN_PROGRAM`` where it names none."""
    if user_agent is None:
        return UNKNOWN_PROGRAM
    words = user_agent[:_READ_CHARS].split(maxsplit=2)
    if not words or words[0].startswith("("):  # empty, or only a comment
        return UNKNOWN_PROGRAM
    name, slash, version = words[0].partition("/")
    if not name:
        return UNKNOWN_PROGRAM
    following = words[1] if len(words) > 1 else ""
    if slash and version and not _is_version(version) and _is_version(following) and "/" not in following:
        name, version = words[0], following  # "OpenAI/Python 1.99.0"
    return ClientProgram(_cut(name, MAX_PRODUCT_CHARS), _cut(version, MAX_VERSION_CHARS) if version else None)


def program_label(product: str | None, version: str | None) -> str | None:
    """ "product version" for a table or a sentence ("ollama-python 0.6.1"); None when the product is unknown."""
    if product is None:
        return None
    return product if version is None else f"{product} {version}"


def process_label(name: str | None, pid: int | None, user: str | None) -> str | None:
    """ "python (pid 4242, user ana)": the local process behind a client's socket; None when not known."""
    if pid is None:
        return None
    who = f"pid {pid}" + (f", user {user}" if user is not None else "")
    return f"{name if name is not None else 'a process'} ({who})"

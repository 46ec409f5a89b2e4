"""``analysis.client_program``: a User-Agent's first product and version, bounded and printable; unknown is None."""

from __future__ import annotations

import platform
from importlib.metadata import version

import ollama
import openai
import pytest

from analysis.client_program import (
    MAX_PRODUCT_CHARS,
    MAX_VERSION_CHARS,
    UNKNOWN_PROGRAM,
    ClientProgram,
    program_label,
    program_of,
)


@pytest.mark.parametrize(
    ("user_agent", "program"),
    [
        ("ollama-python/0.6.1 (x86_64 linux) Python/3.12.3", ("ollama-python", "0.6.1")),
        ("OpenAI/Python 1.99.0", ("OpenAI/Python", "1.99.0")),
        ("Anthropic/Python 0.40.0", ("Anthropic/Python", "0.40.0")),
        ("python-httpx/0.28.1", ("python-httpx", "0.28.1")),
        ("Python-urllib/3.12", ("Python-urllib", "3.12")),
        ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/131.0", ("Mozilla", "5.0")),
        ("curl", ("curl", None)),
        ("curl/", ("curl", None)),
        ("llm/0.19 Python/3.12", ("llm", "0.19")),  # a second product is never kept
        ("  report-bot/2.1  ", ("report-bot", "2.1")),
    ],
)
def test_first_product_and_version(user_agent: str, program: tuple[str, str | None]) -> None:
    assert program_of(user_agent) == ClientProgram(*program)


@pytest.mark.parametrize("user_agent", [None, "", "   ", "(compatible; no product)", "/1.0"])
def test_no_product_is_unknown_never_empty(user_agent: str | None) -> None:
    assert program_of(user_agent) == UNKNOWN_PROGRAM == (None, None)


def test_hostile_text_is_bounded_and_printable() -> None:
    product, version = program_of("\x1b[2J" + "A" * 100 + "/\u202e" + "9" * 100)
    assert product is not None and version is not None
    assert len(product) <= MAX_PRODUCT_CHARS and product.endswith("…") and product.startswith("\\x1b[2J")
    assert len(version) <= MAX_VERSION_CHARS and version.isprintable()
    assert program_of("<script>alert(1)</script>/1") == ("<script>alert(1)<", "script>/1")
    long_header = "x" * 10_000_000  # read only from its start: the cost does not grow with the header
    assert program_of(long_header).product == "x" * (MAX_PRODUCT_CHARS - 1) + "…"


def test_the_real_clients_headers() -> None:
    """The header the installed ``ollama`` and ``openai`` packages really send."""
    ua = ollama.Client()._client.headers["user-agent"]
    assert program_of(ua) == ("ollama-python", version("ollama"))
    openai_ua = openai.OpenAI(api_key="x").user_agent
    assert program_of(openai_ua) == ("OpenAI/Python", version("openai"))
    assert platform.system().lower() not in (program_label(*program_of(ua)) or "")


def test_label() -> None:
    assert program_label("ollama-python", "0.6.1") == "ollama-python 0.6.1"
    assert program_label("curl", None) == "curl"
    assert program_label(None, "1.0") is None

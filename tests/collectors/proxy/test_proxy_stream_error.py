"""A mid-stream ``{"error": ...}`` line (status 200) is kept as an HTTP error's message is: cut to
``ERROR_MESSAGE_CHARS`` with text recording off (an upstream's message can quote the prompt or reply),
whole with ``--record-text``. Before, it was kept whole (up to 4,000 characters) either way."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from analysis.error_notes import ERROR_MESSAGE_CHARS
from analysis.records import Outcome
from collectors.proxy.recording import RECORD_ID_HEADER
from tests.support.proxy_thread import run_proxy
from tests.support.scripted_upstream import REPLY_HEADER, ScriptedUpstream, start_scripted_upstream

ERROR_CHARS = 3000  # under the record's 4,000-character bound on all its notes
PREFIX = "Ollama reported an error mid-stream: "


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    with start_scripted_upstream() as u:
        yield u


@pytest.mark.parametrize("record_text", [False, True])
def test_a_long_mid_stream_error_is_cut_like_an_http_error(upstream: ScriptedUpstream, record_text: bool) -> None:
    with run_proxy(upstream.base_url, record_text=record_text) as proxy:
        r = httpx.post(
            proxy.base_url + "/api/generate",
            json={"model": "scripted", "prompt": "hi"},
            headers={REPLY_HEADER: f"error:{ERROR_CHARS}"},
            timeout=30,
        )
        assert r.status_code == 200 and r.content.endswith(b'"' + b"E" * ERROR_CHARS + b'"}\n')  # passed on whole
        rec = proxy.wait_record(r.headers[RECORD_ID_HEADER])
    assert rec.outcome == Outcome.UPSTREAM_FAILED and rec.error is not None
    print(f"record_text={record_text}: {len(rec.error)} characters of error kept")
    if record_text:
        assert rec.error == PREFIX + "E" * ERROR_CHARS
    else:
        assert rec.error == PREFIX + "E" * (ERROR_MESSAGE_CHARS - 1) + "…"

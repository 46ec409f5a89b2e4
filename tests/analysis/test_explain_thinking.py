"""Thinking in the explanations: the Requests detail's story and the Why explanation say that thinking tokens
cost decode time like any other, and set the time to the first answer token beside the first token, with the
numbers the store holds."""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import replace
from pathlib import Path

from analysis import wording as w
from pages.why.view import build_why
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.requests_page import open_request, write_records
from tests.support.why_page import MODEL, PLAIN, build_store, trace


def test_the_requests_detail_says_what_thinking_cost(data_dir: Path) -> None:
    write_records(data_dir, time.time())
    at = open_request("thinking")
    text = "\n".join(str(t.value) for t in at.text)
    # 15 thinking chunks 10 ms apart from 200 ms, then 25 answer chunks: first token 200 ms, first answer 350 ms.
    assert "15 of its 40 output tokens were thinking, written in 150 ms at 100 tok/s" in text, text
    assert "thinking tokens cost decode time like any other" in text
    assert "first token came after 200 ms, the first answer token after 350 ms" in text
    assert "the answer came 150 ms later than the first token says" in text
    # A reply that did not think says nothing of it.
    plain = open_request("whole")
    assert "thinking" not in "\n".join(str(t.value) for t in plain.text)


def test_the_why_explanation_times_thinking_at_the_decode_rate_and_sets_both_first_tokens_side_by_side(
    data_dir: Path,
) -> None:
    now = time.time()
    recs = build_store(data_dir, now, reqs=PLAIN)
    thinkers = [r for r in recs if len(r.token_chunk_ns) >= 40][:3]
    writer = StoreWriter(db_path(data_dir))
    try:
        for rec in thinkers:
            k = len(rec.token_chunk_ns) // 2
            stamps = rec.token_chunk_ns
            writer.write(PutRequest(replace(rec, thinking_chunks=k, last_thinking_ns=stamps[k - 1], first_answer_ns=stamps[k])))
    finally:
        writer.close()
    with queries.open_reader(data_dir) as conn:
        assert conn is not None
        stored = [queries.request_detail(conn, r.id) for r in thinkers]
    phases = [s.phases for s in stored if s is not None]
    assert len(phases) == 3 and all(p.thinking_tokens and p.ttfa_s for p in phases)

    m = build_why(db_path(data_dir), MODEL, now)
    assert m is not None and m.story is not None
    sentence = next(s for s in m.sentences if "thought before answering" in s)
    print("\n" + sentence)
    c = m.story.ceilings
    tokens = statistics.median(p.thinking_tokens or 0 for p in phases)
    assert sentence.startswith(f"3 of {len([r for r in recs if r.metrics is not None or r.token_chunk_ns])} {MODEL}")
    assert f"a median {w.count(tokens)} thinking tokens" in sentence
    assert "Thinking tokens cost decode time like any other" in sentence
    assert f"at the {w.tok_s(c.decode_expected_tok_s)} expected for decode at {w.count(c.context_tokens)} tokens" in sentence
    assert f"take about {w.secs(tokens / c.decode_expected_tok_s)}" in sentence
    assert f"measured: {w.secs(statistics.median(p.thinking_s or 0 for p in phases))}" in sentence
    ttft = statistics.median(p.ttft_s or 0 for p in phases)
    ttfa = statistics.median(p.ttfa_s or 0 for p in phases)
    assert f"first token came after {w.secs(ttft)} but the first answer token" in sentence
    assert f"after {w.secs(ttfa)} (medians of 3)" in sentence
    # The decode rate it names is the chart's expected line at that context (one ceiling model).
    line = trace(m.decode_fig.to_plotly_json(), "expected")
    at = dict(zip(line["x"], line["y"], strict=True))
    assert w.tok_s(at[c.context_tokens]) == w.tok_s(c.decode_expected_tok_s)
    # Once, right after the decode sentence.
    assert m.sentences.count(sentence) == 1
    i = m.sentences.index(sentence)
    assert re.match("Decode makes one token at a time", m.sentences[i - 1])

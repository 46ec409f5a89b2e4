"""The Why page's "More interference measured here": each event says when the other request's prompt was read,
since two long prompts of one length read alike (the demo sends the same document again after a restart)."""

from __future__ import annotations

from analysis.interference import find_interference
from analysis.phases import Phases
from analysis.records import Outcome, RequestRecord
from pages.shared import fmt
from pages.why.view import _interference_sentences

MS = 1_000_000
T0 = 1.8e9


def _record(rid: str, tokens: list[int], started_s: float) -> RequestRecord:
    return RequestRecord(
        id=rid,
        started_at_unix_s=started_s,
        client_addr="127.0.0.1",
        endpoint="/api/chat",
        model="llama3.2:latest",
        stream=True,
        received_ns=tokens[0] - 100 * MS,
        token_chunk_ns=tokens,
        final_chunk_ns=tokens[-1],
        outcome=Outcome.OK,
    )


def _victim(windows: list[tuple[int, int]]) -> list[int]:
    t, out = 0, [0]
    for _ in range(400):
        t += (50 if any(a <= t < b for a, b in windows) else 10) * MS
        out.append(t)
    return out


def test_each_event_says_when_the_other_prompt_was_read() -> None:
    first, second = (300 * MS, 600 * MS), (2000 * MS, 2300 * MS)
    victim = _record("v", _victim([first, second]), T0)
    pairs = [(victim, Phases(prefill_start_ns=-50 * MS, decode_start_ns=0, decode_end_ns=victim.token_chunk_ns[-1]))]
    for rid, (w0, w1) in (("a", first), ("b", second)):
        rec = _record(rid, [w1 + i * 10 * MS for i in range(5)], T0 + (w0 - 100 * MS) / 1e9)
        pairs.append((rec, Phases(prefill_start_ns=w0, decode_start_ns=w1, prompt_tokens=4096, cached_tokens=0)))
    events = find_interference(pairs)
    assert len(events) == 2
    told = _interference_sentences("llama3.2:latest", events, pairs)
    by_aggressor = {e.aggressor_id: s for e, s in zip(events, told, strict=True)}
    for rid, w0 in (("a", first[0]), ("b", second[0])):
        rec = next(r for r, _ in pairs if r.id == rid)
        assert by_aggressor[rid].startswith(f"{fmt.clock(rec.wall_s(w0))} · While another request read its 4,096-token")
    assert told[0] != told[1]

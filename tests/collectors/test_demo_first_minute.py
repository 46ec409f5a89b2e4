"""The demo shows a long prompt being read, and the stall it causes in the chat, in its first minute.

``collectors.demo.run_demo`` as the dashboard starts it (the simulator on the demo's GPU profile, a collector with
``--demo``, the synthetic users): within ``FIRST_MINUTE_S`` the store holds a document of 8k-32k prompt tokens
whose prefill took at least a second, and a chat reply that streamed while it was read, its tokens slowed meanwhile
to a gap at least 5x its usual one (they share the model's batches: each batch of the document's prompt, ~0.15 s
on this GPU, passes before the chat's next token).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from pathlib import Path

import pytest

from collectors.demo import DEFAULT_HARDWARE, DOCUMENT_TOKENS, run_demo
from store import queries
from store.schema import db_path

pytestmark = pytest.mark.timeout(240)

FIRST_MINUTE_S = 60.0
MIN_PREFILL_S = 1.0
STALL_RATIO = 5.0  # "reading it takes seconds": a card with its progress is seen for at least this long


def _document_and_stall(data_dir: Path) -> tuple[float, float, float] | None:
    """(the document's prefill, the longest token gap of a reply while it was read, that reply's median gap) in s."""
    with queries.open_reader(db_path(data_dir)) as conn:
        if conn is None:
            return None
        stored = list(queries.stored_requests(conn))
    docs = [s for s in stored if (s.phases.prompt_tokens or 0) >= DOCUMENT_TOKENS[0] and s.phases.prefill_s is not None]
    for doc in docs:
        rec = doc.record
        prefill_s = doc.phases.prefill_s
        assert prefill_s is not None
        end = rec.wall_s(rec.first_token_ns) if rec.first_token_ns else None
        if end is None:
            continue
        start = end - prefill_s
        for other in stored:
            chunks = other.record.token_chunk_ns
            if other.record.id == rec.id or len(chunks) < 2:
                continue
            gaps = [(other.record.wall_s(a), (b - a) / 1e9) for a, b in itertools.pairwise(chunks)]
            overlapping = [gap for t, gap in gaps if start - 1 <= t <= end]
            if overlapping:
                return prefill_s, max(overlapping), statistics.median(gap for _t, gap in gaps)
    return None


@pytest.mark.slow  # the demo's own start, then its users' first document: 14-16 s on this shared machine
def test_the_demo_reads_a_long_document_and_stalls_the_chat_in_its_first_minute(tmp_path: Path) -> None:
    stop = threading.Event()
    result: list[int] = []
    demo = threading.Thread(target=lambda: result.append(run_demo(tmp_path, DEFAULT_HARDWARE, 2, True, stop)), daemon=True)
    started = time.monotonic()
    demo.start()
    try:
        found = None
        while time.monotonic() - started < FIRST_MINUTE_S + 15 and found is None:  # + the demo's own start-up
            time.sleep(1.0)
            assert demo.is_alive(), f"the demo stopped: {result}"
            found = _document_and_stall(tmp_path)
        assert found is not None, "no document read beside a streaming chat reply in the demo's first minute"
        prefill_s, gap_s, usual_s = found
        print(f"\ndocument prefill {prefill_s:.2f} s; the chat's token gap meanwhile {gap_s:.3f} s, usually {usual_s:.3f} s")
        assert prefill_s >= MIN_PREFILL_S
        assert gap_s >= STALL_RATIO * usual_s
    finally:
        stop.set()
        demo.join(30)

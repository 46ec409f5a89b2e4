"""A request through the real store and back: the record exactly, and the phases exactly as split at write time."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.phases import split_record
from analysis.records import FinalMetrics, Outcome, RequestRecord
from store import queries
from store.ops import PutRequest
from store.schema import db_path
from store.writer import StoreWriter

t_ns = st.integers(min_value=0, max_value=2**52)
opt_ns = st.none() | t_ns
metrics = st.builds(
    FinalMetrics,
    total_duration_ns=opt_ns,
    load_duration_ns=opt_ns,
    prompt_eval_count=st.none() | st.integers(0, 10**6),
    prompt_eval_cached_count=st.none() | st.integers(0, 10**6),
    prompt_eval_duration_ns=opt_ns,
    eval_count=st.none() | st.integers(0, 10**6),
    eval_duration_ns=opt_ns,
    done_reason=st.none() | st.sampled_from(["stop", "length"]),
)
_ids = itertools.count()


@pytest.fixture(scope="module")
def writer(tmp_path_factory: pytest.TempPathFactory) -> StoreWriter:
    return StoreWriter(db_path(tmp_path_factory.mktemp("rows")))


@settings(max_examples=60, deadline=None)
@given(
    received=t_ns,
    forwarded=opt_ns,
    first_token=opt_ns,
    chunks=st.lists(t_ns, max_size=20),
    final=opt_ns,
    closed=opt_ns,
    m=st.none() | metrics,
    outcome=st.sampled_from(list(Outcome)),
    endpoint=st.sampled_from(["/api/chat", "/api/generate", "/v1/chat/completions"]),
    text=st.none() | st.text(max_size=20),
)
def test_round_trip_through_the_store(
    writer: StoreWriter,
    received: int,
    forwarded: int | None,
    first_token: int | None,
    chunks: list[int],
    final: int | None,
    closed: int | None,
    m: FinalMetrics | None,
    outcome: Outcome,
    endpoint: str,
    text: str | None,
) -> None:
    rec = RequestRecord(
        id=f"r{next(_ids)}",
        started_at_unix_s=1_700_000_000.5,
        client_addr="127.0.0.1:1",
        endpoint=endpoint,
        model="llama3.2",
        stream=True,
        num_ctx=None,
        received_ns=received,
        forwarded_ns=forwarded,
        first_token_ns=first_token,
        token_chunk_ns=chunks,
        final_chunk_ns=final,
        closed_ns=closed,
        outcome=outcome,
        metrics=m,
        prompt_text=text,
        response_text=text,
    )
    writer.write(PutRequest(rec))
    with queries.open_reader(writer.path) as conn:
        assert conn is not None
        stored = queries.request_detail(conn, rec.id)
    assert stored is not None
    assert stored.record == rec
    assert stored.phases == split_record(rec)

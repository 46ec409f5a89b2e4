"""Property tests: no input makes the phase split raise anything but PhaseSplitError."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.phases import (
    MAX_DURATION_NS,
    MAX_TOKEN_COUNT,
    PhaseSplitError,
    parse_final_json,
    split_metrics,
    split_record,
    split_response,
)
from analysis.records import FinalMetrics, Outcome, RequestRecord

METRIC_KEYS = [
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_cached_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
metric_values = st.integers(min_value=-(10**20), max_value=10**20) | st.floats() | json_values
final_objects = st.fixed_dictionaries(
    {"done": st.just(True) | json_values, "done_reason": st.none() | st.sampled_from(["stop", "length", "load"]) | json_values},
    optional={k: metric_values for k in METRIC_KEYS},
)


def _check_numbers_are_finite(values: dict[str, object]) -> None:
    for key, v in values.items():
        if isinstance(v, float):
            assert math.isfinite(v), key


@settings(max_examples=200, deadline=None)
@given(final_objects | json_values)
def test_split_response_raises_only_its_own_error(obj: object) -> None:
    try:
        p = split_response(obj)
    except PhaseSplitError:
        return
    _check_numbers_are_finite(p.to_json_dict())
    assert p.prefill_tok_s is None or p.prefill_tok_s >= 0
    assert p.decode_tok_s is None or p.decode_tok_s >= 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | json_values.map(repr))
def test_parse_final_json_raises_only_its_own_error(text: str) -> None:
    try:
        p = parse_final_json(text)
    except PhaseSplitError as exc:
        assert str(exc)
        return
    _check_numbers_are_finite(p.to_json_dict())


ns = st.integers(min_value=-(10**19), max_value=10**19)
opt_ns = st.none() | ns
metrics = st.builds(
    FinalMetrics,
    total_duration_ns=opt_ns,
    load_duration_ns=opt_ns,
    prompt_eval_count=opt_ns,
    prompt_eval_cached_count=opt_ns,
    prompt_eval_duration_ns=opt_ns,
    eval_count=opt_ns,
    eval_duration_ns=opt_ns,
    done_reason=st.none() | st.text(max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(metrics)
def test_split_metrics_raises_only_its_own_error(m: FinalMetrics) -> None:
    durations = [m.total_duration_ns, m.load_duration_ns, m.prompt_eval_duration_ns, m.eval_duration_ns]
    counts = [m.prompt_eval_count, m.prompt_eval_cached_count, m.eval_count]
    impossible = any(v is not None and not 0 <= v <= MAX_DURATION_NS for v in durations) or any(
        v is not None and not 0 <= v <= MAX_TOKEN_COUNT for v in counts
    )
    try:
        p = split_metrics(m)
    except PhaseSplitError:
        assert impossible  # raised only for values that cannot be real
        return
    assert not impossible
    _check_numbers_are_finite(p.to_json_dict())


@settings(max_examples=200, deadline=None)
@given(
    received=ns,
    forwarded=opt_ns,
    first_token=opt_ns,
    chunks=st.lists(ns, max_size=30),
    final=opt_ns,
    closed=opt_ns,
    m=st.none() | metrics,
    outcome=st.sampled_from(list(Outcome)),
)
def test_split_record_never_raises(
    received: int,
    forwarded: int | None,
    first_token: int | None,
    chunks: list[int],
    final: int | None,
    closed: int | None,
    m: FinalMetrics | None,
    outcome: Outcome,
) -> None:
    rec = RequestRecord(
        id="x",
        started_at_unix_s=0.0,
        client_addr="",
        endpoint="/api/generate",
        model="m",
        stream=True,
        received_ns=received,
        forwarded_ns=forwarded,
        first_token_ns=first_token,
        token_chunk_ns=chunks,
        final_chunk_ns=final,
        closed_ns=closed,
        outcome=outcome,
        metrics=m,
    )
    p = split_record(rec)
    assert p.token_chunks == len(chunks)
    assert all(code for code in p.flags) and set(p.flags) == set(p.flag_text)

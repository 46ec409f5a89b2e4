"""analysis.reloads: each load's cause from the requests and /api/ps snapshots, and reload_churn's threshold."""

from __future__ import annotations

import pytest

from analysis.reloads import (
    RELOAD_CHURN,
    Cause,
    LoadInput,
    PsRow,
    client_host,
    describe_load,
    find_churn,
    find_loads,
    is_queue_full,
    reloads,
)

T0 = 1_800_000_000.0
A, B = "qwen2.5:0.5b", "llama3.2:latest"


def req(
    i: int, model: str, at_s: float, load_s: float | None = 1.0, num_ctx: int | None = None, kind: str = "generate"
) -> LoadInput:
    return LoadInput(f"r{i}", model, T0 + at_s, T0 + at_s + 2, "127.0.0.1", num_ctx, load_s, kind)


def test_keep_alive_expiry_is_found_from_the_snapshots_expires_at() -> None:
    ps = [PsRow(T0 + 10, A, 4096, T0 + 310), PsRow(T0 + 300, A, 4096, T0 + 310)]
    snapshots = [T0 + 10, T0 + 300, T0 + 312, T0 + 400]
    loads = find_loads([req(1, A, 0), req(2, A, 500)], ps, snapshots)
    assert [ld.cause for ld in loads] == [Cause.FIRST_USE, Cause.KEEP_ALIVE_EXPIRED]
    assert loads[1].expired_at_unix_s == T0 + 310
    assert describe_load(loads[1]).startswith(f"{A} loaded in 1.00 s: its keep_alive expired at ")


def test_a_model_gone_before_its_expiry_while_another_loaded_was_evicted_by_it() -> None:
    ps = [PsRow(T0 + 5, A, 4096, T0 + 900), PsRow(T0 + 25, B, 4096, T0 + 900)]
    snapshots = [T0 + 5, T0 + 20, T0 + 25]  # a poll during B's load lists neither
    result = reloads([req(1, A, 0), req(2, B, 19, load_s=3.0), req(3, A, 60)], ps, snapshots)
    assert [ld.cause for ld in result.loads] == [Cause.FIRST_USE, Cause.FIRST_USE, Cause.EVICTED]
    assert result.loads[1].evicted == (A,) and result.loads[2].evicted_by == B
    text = describe_load(result.loads[2], max_loaded_models=1)
    assert text == f"{A} loaded in 1.00 s: evicted by {B} (OLLAMA_MAX_LOADED_MODELS is 1)"


def test_an_unload_request_between_is_the_cause() -> None:
    loads = find_loads([req(1, A, 0), req(2, A, 10, load_s=None, kind="unload"), req(3, A, 20)])
    assert [ld.cause for ld in loads] == [Cause.FIRST_USE, Cause.UNLOADED]


def test_requests_that_waited_on_one_load_are_one_load() -> None:
    loads = find_loads([req(1, A, 0, load_s=2.0), req(2, A, 0.5, load_s=1.5)])
    assert len(loads) == 1 and loads[0].requests_waited == 2


def test_no_snapshots_and_same_options_leave_the_cause_unknown() -> None:
    loads = find_loads([req(1, A, 0, num_ctx=4096), req(2, A, 100, num_ctx=4096)])
    assert loads[1].cause is Cause.UNKNOWN


@pytest.mark.parametrize(("reloads_n", "flagged"), [(3, False), (4, True)])
def test_churn_is_more_than_three_reloads_within_an_hour(reloads_n: int, flagged: bool) -> None:
    ctxs = [2048, 4096] * 3
    reqs = [req(i, A, 600 * i, num_ctx=ctxs[i]) for i in range(reloads_n + 1)]
    churn = find_churn(find_loads(reqs))
    assert bool(churn) is flagged
    if flagged:
        assert churn[0].code == RELOAD_CHURN and churn[0].lost_s == pytest.approx(reloads_n * 1.0)


def test_reloads_spread_over_more_than_an_hour_are_no_churn() -> None:
    ctxs = [2048, 4096] * 3
    reqs = [req(i, A, 1300 * i, num_ctx=ctxs[i]) for i in range(6)]  # 5 reloads, at most 3 in any hour
    assert find_churn(find_loads(reqs)) == []


def test_client_host_and_queue_full() -> None:
    assert client_host("127.0.0.2:5000") == "127.0.0.2" and client_host("[::1]:80") == "::1" and client_host(None) is None
    assert is_queue_full(503, "upstream HTTP 503: server busy, please try again.  maximum pending requests exceeded")
    assert not is_queue_full(503, "upstream HTTP 503: too many connections") and not is_queue_full(None, None)


def test_a_request_without_num_ctx_after_one_with_it_reloads_at_ollamas_default() -> None:
    ps = [PsRow(T0 + 5, A, 4096, T0 + 900), PsRow(T0 + 105, A, 8192, T0 + 900)]
    loads = find_loads([req(1, A, 0, num_ctx=4096), req(2, A, 100)], ps, [T0 + 5, T0 + 105])
    assert loads[1].cause is Cause.OPTIONS_CHANGED and loads[1].option == "num_ctx 4,096 → 8,192 (Ollama's default)"

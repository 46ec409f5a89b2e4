"""16 concurrent streams through the proxy: timestamps against sim's truth, one record each.

The proxy runs in its own process (``python -m collectors.proxy --print-records``),
as in production (the collector process), so the test's client never competes with it for the GIL.

What this proves is that the proxy stamps each chunk when its read arrives (not per batch of reads,
not when a stream or a record is finished), in bounds set by sim's step time and far beyond any
scheduling hiccup, so it holds on a busy machine. Issue 3's speed target (TTFT and gap errors within
2 ms at p99) depends on how busy the machine is: ``bench/proxy_accuracy.py`` prints those percentiles.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from sim import timing
from sim.catalog import find_model
from sim.profiles import profile_by_key
from tests.support.proxy_process import StampErrors, burst, start_proxy_process
from tests.support.proxy_thread import sim_truth
from tests.support.sim_process import SimProcess

STREAMS = 16
TOKENS = 48
# 16 slots decoding llama3.1:8b on the m3-max profile: a 26 ms step (38 tok/s per stream, as such a Mac
# gives), long next to the few milliseconds a starved proxy needs to serve 16 chunks of one step.
MODEL = "llama3.1:8b"
HARDWARE = "m3-max"
NUM_CTX = 512  # Ollama's default context on a 128 GB Mac would reserve 16 x 256K tokens of KV cache
STAGGER_S = 0.004  # concurrent, not simultaneous, starts: all 16 streams decode together
# Bounds in sim's design step time (sim's own gaps are that long only while the machine lets it keep
# time: a starved sim catches up with short gaps). Measured on our 2-core machines with a 9 ms step, idle
# and with two CPU-bound processes beside the test (load average 7-9): gap error p50 0.05-2.9 ms (a hiccup
# of the proxy or of sim makes two large errors, one gap too long and the next too short: p99 0.6-20 ms);
# token lag behind sim p50 0.3-2.8 ms, extremes -19 / +32 ms; TTFT error p50 0.7-19 ms, nearly all of it
# the hop from the proxy to sim's own "received" stamp (p50 0.4-16 ms; sim parses the request first).
# Stamps taken per flush, per batch of streams or when a stream ends are off by a step or more for most
# tokens.
GAP_ERROR_P50_STEPS = 0.4
LAG_P50_STEPS = 0.5
# No single stamp or hop may be off by more than this: one taken at connection accept (keep-alive
# connections wait between bursts), at the stream's end (1.3 s here) or at a store flush (every 200 ms)
# would be, while the longest scheduling hiccup seen under load was ~36 ms.
ANY_ERROR_MAX_MS = 150.0

pytestmark = pytest.mark.sim_args("--hardware", HARDWARE, "--num-parallel", str(STREAMS), "--disk-gbs", "20")


@pytest.mark.slow
def test_sixteen_streams_match_the_truth_and_are_recorded_once(sim: SimProcess, tmp_path: Path) -> None:
    with start_proxy_process(sim.base_url, tmp_path) as proxy:
        for _ in range(2):  # the first burst loads the model and opens the pooled upstream connections
            pairs = burst(proxy.base_url, streams=STREAMS, model=MODEL, tokens=TOKENS, num_ctx=NUM_CTX, stagger_s=STAGGER_S)
        records = proxy.stop()
    by_id: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_id.setdefault(rec["id"], []).append(rec)
    assert len(records) == 2 * STREAMS and all(len(v) == 1 for v in by_id.values())  # each request exactly once
    errors = StampErrors()
    for sim_id, record_id in pairs:
        rec, truth = by_id[record_id][0], sim_truth(sim.base_url, sim_id)
        assert rec["outcome"] == "ok" and rec["status_code"] == 200 and rec["error"] is None
        assert (
            rec["metrics"]["eval_count"] == TOKENS and rec["metrics"]["total_duration_ns"] == truth["reported"]["total_duration"]
        )
        assert len(rec["token_chunk_ns"]) == len(truth["token_written_ns"]) == TOKENS
        # The proxy has the request before sim does (one clock for both processes).
        assert rec["received_ns"] <= rec["forwarded_ns"] <= truth["received_ns"]
        errors.add(rec, truth)
    summary = errors.summary()
    print(summary)
    model = find_model(MODEL)
    assert model is not None
    step_ms = 1e3 * timing.step_seconds(model, profile_by_key(HARDWARE), 1.0, timing.StepWork([60] * STREAMS, []))
    # Most stamps are taken when their read arrives: most gaps match sim's to a fraction of a step.
    assert statistics.median(errors.gap_err_ms) <= GAP_ERROR_P50_STEPS * step_ms, summary
    assert abs(statistics.median(errors.lag_ms)) <= LAG_P50_STEPS * step_ms, summary
    everything = errors.ttft_err_ms + errors.hop_ms + errors.gap_err_ms + [abs(x) for x in errors.lag_ms]
    assert max(everything) <= ANY_ERROR_MAX_MS, summary

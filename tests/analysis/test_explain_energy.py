"""Energy per phase from counter deltas or integrated power, on hand-built samples."""

from __future__ import annotations

import dataclasses

import pytest

from analysis.energy import energy_between, energy_for_request
from analysis.phases import Phases
from analysis.records import GpuSample, Outcome, RequestRecord

T0 = 1_800_000_000.0
MS = 1_000_000


def samples(
    watts: float = 300.0, start: float = T0 - 1, end: float = T0 + 3, step: float = 0.1, index: int = 0, counter: bool = True
) -> list[GpuSample]:
    out = []
    n = round((end - start) / step)
    for k in range(n + 1):
        t = start + k * step
        out.append(
            GpuSample(
                ts_unix_s=t,
                index=index,
                name="gpu",
                uuid=f"GPU-{index}",
                power_w=watts,
                energy_j=(5000.0 + watts * (t - start)) if counter else None,
            )
        )
    return out


def request() -> tuple[RequestRecord, Phases]:
    # Prefill 0.5 s from T0, decode 1.0 s after it; 1000 prompt tokens (200 cached), 101 output tokens.
    rec = RequestRecord(
        id="r",
        started_at_unix_s=T0,
        client_addr="127.0.0.1",
        endpoint="/api/generate",
        model="m",
        stream=True,
        received_ns=0,
        final_chunk_ns=1500 * MS,
        outcome=Outcome.OK,
    )
    ph = Phases(
        prefill_start_ns=0,
        decode_start_ns=500 * MS,
        decode_end_ns=1500 * MS,
        prompt_tokens=1000,
        cached_tokens=200,
        output_tokens=101,
    )
    return rec, ph


def test_counter_deltas_per_token() -> None:
    rec, ph = request()
    e = energy_for_request(rec, ph, samples())
    assert e is not None and e.method == "energy_counter" and not e.coarse
    assert e.prefill_j == pytest.approx(150)  # 300 W × 0.5 s
    assert e.decode_j == pytest.approx(300)
    assert e.j_per_prompt_token == pytest.approx(150 / 800)  # only computed tokens
    assert e.j_per_output_token == pytest.approx(300 / 100)  # 100 intervals


def test_power_integration_without_counter() -> None:
    rec, ph = request()
    e = energy_for_request(rec, ph, samples(counter=False))
    assert e is not None and e.method == "power_samples"
    assert e.prefill_j == pytest.approx(150)
    # A ramp from 100 W to 300 W over the window integrates to the trapezoid.
    ramp = [dataclasses.replace(s, power_w=100 + 200 * (s.ts_unix_s - T0) / 0.5) for s in samples(counter=False)]
    w = energy_between(ramp, T0, T0 + 0.5)
    assert w is not None and w.joules == pytest.approx(100, rel=1e-6)


def test_counter_reset_falls_back_to_power() -> None:
    s = samples()
    reset = [dataclasses.replace(x, energy_j=(x.energy_j or 0) - (1e6 if x.ts_unix_s > T0 + 0.2 else 0)) for x in s]
    w = energy_between(reset, T0, T0 + 0.5)
    assert w is not None and w.method == "power_samples" and w.joules == pytest.approx(150)


def test_two_gpus_add_up_and_sparse_samples_are_marked_coarse() -> None:
    both = samples(index=0) + samples(watts=100, index=1)
    w = energy_between(both, T0, T0 + 0.5)
    assert w is not None and w.joules == pytest.approx(200)
    sparse = energy_between(samples(step=1.0), T0 + 0.2, T0 + 0.4)
    assert sparse is not None and sparse.coarse and sparse.joules == pytest.approx(60)


def test_no_coverage_gives_none() -> None:
    rec, ph = request()
    only_prefill = energy_for_request(rec, ph, samples(end=T0 + 0.6))  # samples stop before decode ends
    assert only_prefill is not None and only_prefill.prefill_j == pytest.approx(150) and only_prefill.decode_j is None
    assert only_prefill.j_per_output_token is None
    assert energy_between(samples(end=T0 + 0.2), T0, T0 + 0.5) is None
    assert energy_for_request(rec, ph, []) is None
    assert energy_for_request(rec, Phases(), samples()) is None
    with pytest.raises(ValueError):
        energy_between(samples(), T0 + 1, T0)

"""Diagnoses on hand-built records: each fires on its evidence, with its numbers; a clean request gets none."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from analysis.diagnose import CODES, Diagnosis, Severity, diagnose_request
from analysis.phases import Phases, split_record
from analysis.records import GpuSample, RequestRecord
from analysis.runner_wait_lines import MIB
from analysis.runner_wait_tasks import TaskWaits, WaitKind
from tests.support.diagnose_cases import FACTS, SPEC, T0_UNIX, loaded, make_record


def gpu_samples(rec: RequestRecord, **fields: object) -> list[GpuSample]:
    """Samples every 20 ms across the request, busy, with the given overrides."""
    end = rec.wall_s(rec.final_chunk_ns or rec.received_ns)
    base = GpuSample(
        ts_unix_s=T0_UNIX,
        index=0,
        name=SPEC.name,
        uuid="GPU-1",
        util_gpu_pct=95.0,
        power_w=250.0,
        power_limit_w=350.0,
        mem_clock_mhz=9751,
        mem_clock_max_mhz=9751,
        mem_bus_width_bits=384,
        pstate=2,
    )
    out = []
    t = T0_UNIX
    while t <= end:
        out.append(dataclasses.replace(base, ts_unix_s=t, **fields))  # type: ignore[arg-type]
        t += 0.02
    return out


def codes(ds: list[Diagnosis]) -> list[str]:
    return [d.code for d in ds]


def run(rec: RequestRecord, **kw: object) -> list[Diagnosis]:
    return diagnose_request(rec, split_record(rec), spec=SPEC, facts=FACTS, **kw)  # type: ignore[arg-type]


def test_clean_request_is_silent() -> None:
    # 50 tokens at 9 ms (111 tok/s), on a 3090 where 130 tok/s is expected, fully in VRAM, clocks at max.
    rec = make_record()
    assert run(rec, loaded=loaded(), gpu_samples=gpu_samples(rec)) == []


def test_every_code_is_documented() -> None:
    for code in (
        "partial_offload",
        "memory_clock_low",
        "power_capped",
        "cache_hit",
        "one_token_reply",
        "ttft_load",
        "ttft_prompt",
        "ttft_queue",
        "ttft_runner_wait",
        "ttft_wait_unexplained",
    ):
        assert code in CODES


def test_partial_offload_says_how_much_faster_on_gpu() -> None:
    rec = make_record(token_gap_ms=60)  # 16.7 tok/s
    ds = run(rec, loaded=loaded(size=10e9, vram=6e9), host_bandwidth_bytes_s=60e9)
    assert codes(ds)[0] == "partial_offload"
    d = ds[0]
    assert d.severity is Severity.WARNING
    assert "40%" in d.sentence and "4.00 GB of 10.0 GB" in d.sentence
    assert "60 GB/s" in d.sentence and "936 GB/s" in d.sentence
    assert "16.7 tok/s" in d.sentence
    full = d.numbers["full_gpu_expected_tok_s"]
    assert full == pytest.approx(0.70 * 936e9 / (4.92e9 + 131072 * (200 + 25)))
    assert f"{full / 16.7:.1f}×" in d.sentence or f"{full / 16.67:.0f}×" in d.sentence
    # The generic "decode is slow" fallback is not repeated once the cause is known.
    assert "decode_slow" not in codes(ds)


def test_memory_clock_below_max() -> None:
    rec = make_record()
    ds = run(rec, gpu_samples=gpu_samples(rec, mem_clock_mhz=8000))
    assert codes(ds) == ["memory_clock_low"]
    assert "8000 MHz" in ds[0].sentence and "9751 MHz" in ds[0].sentence and "P2" in ds[0].sentence
    assert "768 GB/s" in ds[0].sentence  # 2 × 8000 MHz × 384 bit ÷ 8


def test_idle_samples_do_not_count_as_a_low_clock() -> None:
    rec = make_record()
    assert run(rec, gpu_samples=gpu_samples(rec, mem_clock_mhz=405, util_gpu_pct=0.0)) == []


def test_power_cap() -> None:
    rec = make_record()
    ds = run(rec, gpu_samples=gpu_samples(rec, power_w=349.0))
    assert codes(ds) == ["power_capped"]
    assert "349 W of its 350 W limit" in ds[0].sentence
    by_flag = run(rec, gpu_samples=gpu_samples(rec, throttle_reasons=0x4))
    assert codes(by_flag) == ["power_capped"]


def test_cache_hit_names_both_rates() -> None:
    rec = make_record(prompt=1000, cached=900, prefill_ms=50)
    ds = run(rec)
    assert codes(ds) == ["cache_hit"]
    s = ds[0].sentence
    assert "900 of the 1,000 prompt tokens" in s
    assert "20,000 tok/s" in s  # Ollama's 1000 / 0.05 s
    assert "only 100 were, at 2,000 tok/s" in s


def test_cache_suspected_when_server_does_not_say() -> None:
    rec = make_record(prompt=8000, cached=None, prefill_ms=40)  # 200,000 tok/s: far above the 3090's ceiling
    ds = run(rec)
    assert codes(ds) == ["cache_suspected"]
    assert "200,000 tok/s" in ds[0].sentence


def test_one_token_reply() -> None:
    ds = run(make_record(output=1))
    assert codes(ds) == ["one_token_reply"]


def saved_16k_state() -> TaskWaits:
    """The H200 run's 272-token prompt after a 16k one: what the runner's lines said it did first."""
    t = TaskWaits(1112, 0, 2, 0)
    t.add(WaitKind.PROMPT_CACHE_SAVE, round(1362.016 * MIB), 16669)
    t.add(WaitKind.FULL_REPROCESS, None, None)
    return t


@pytest.mark.parametrize(
    ("kw", "extra", "code", "needle"),
    [
        ({"load_ms": 2500}, {}, "ttft_load", "2.50 s of the 2.56 s before the first token went to loading llama3.1:8b"),
        (
            {"queue_ms": 4000},
            {"all_slots_busy": True},
            "ttft_queue",
            "4.00 s of the 4.06 s before the first token was spent waiting for a free slot: every slot",
        ),
        # A free slot, or slots not known: not a queue for a slot.
        ({"queue_ms": 4000}, {"all_slots_busy": False}, "ttft_wait_unexplained", "was read while a slot"),
        ({"queue_ms": 4000}, {}, "ttft_wait_unexplained", "unexplained: the runner's /slots do not say why"),
        (
            {"queue_ms": 4000},
            {"all_slots_busy": False, "waits": saved_16k_state()},
            "ttft_runner_wait",
            "state (16,669 tokens), 1,362 MiB, from its slot into its prompt cache in system memory; full re-processing",
        ),
        ({"prompt": 8000, "prefill_ms": 2000}, {}, "ttft_prompt", "reading the 8,000-token prompt at 4,000 tok/s"),
    ],
)
def test_ttft_dominated(kw: dict[str, Any], extra: dict[str, Any], code: str, needle: str) -> None:
    ds = run(make_record(**kw), **extra)
    assert "ttft_queue" not in codes(ds) or extra.get("all_slots_busy") is True
    assert code in codes(ds)
    d = next(d for d in ds if d.code == code)
    assert needle in d.sentence


def test_decode_far_below_expected_without_cause() -> None:
    ds = run(make_record(token_gap_ms=40))  # 25 tok/s where 130 is expected
    assert codes(ds) == ["decode_slow"]
    assert "25.0 tok/s" in ds[0].sentence


def test_decode_above_ceiling_is_flagged() -> None:
    ds = run(make_record(token_gap_ms=2))  # 500 tok/s: a 3090 cannot read 4.9 GB that often
    assert codes(ds) == ["decode_above_ceiling"]


def test_works_without_hardware_or_model() -> None:
    rec = make_record(load_ms=3000)
    ds = diagnose_request(rec, split_record(rec))
    assert codes(ds) == ["ttft_load"]
    # An empty Phases (e.g. a failed request) gives nothing to say rather than an error.
    assert diagnose_request(rec, Phases()) == []


def test_a_few_cached_template_tokens_are_not_worth_a_sentence() -> None:
    assert run(make_record(prompt=40, cached=2)) == []
    one = run(make_record(prompt=1000, cached=999, prefill_ms=10))
    assert "only 1 was, at 100 tok/s" in one[0].sentence


def test_prefill_above_ceiling_with_cache_reported() -> None:
    ds = run(make_record(prompt=8000, cached=0, prefill_ms=100))  # 80,000 tok/s of real compute: impossible on a 3090
    assert codes(ds) == ["prefill_above_ceiling"]
    assert "80,000 tok/s" in ds[0].sentence and "142 TFLOP/s" in ds[0].sentence


def test_an_embedding_gets_no_generation_diagnoses() -> None:
    """Prefill only: an impossible embed rate is no "cache hit" story, and there is no first token or decode to judge."""
    from dataclasses import replace

    from analysis.records import RequestKind

    rec = make_record(prompt=8000, cached=None, prefill_ms=40, output=1)  # 200,000 tok/s: beyond the 3090
    assert {"cache_suspected", "one_token_reply"} <= set(codes(run(rec)))  # as a generation
    embed = replace(rec, kind=RequestKind.EMBED, endpoint="/api/embed")
    assert not {"cache_suspected", "one_token_reply", "ttft_slow", "decode_slow"} & set(codes(run(embed)))

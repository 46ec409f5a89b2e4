"""sim never runs faster than the ceilings that ``analysis`` computes for the same GPU and model.

The fastest a sim step can ever be is ``sim.timing.floor_seconds`` (the engine shortens steps to catch
up with its timeline, never below that floor), so the property tests hold the rates of floor-length
steps under ``analysis.ceilings``: prefill of 1 to 32K prompt tokens after any cached prefix, decode at
any context up to the model's limit, on every hardware profile and model, with any share of the
model in VRAM. The facts come from the ``/api/show`` JSON sim serves, as the app reads them.
The last test drives the real engine behind a stalled event loop, where catching up happens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.ceilings import DEFAULT_UBATCH_TOKENS, CeilingModel, Ceilings, ceilings_for, ollama_num_batch, starting_efficiencies
from analysis.model_facts import ModelFacts as AnalysisFacts
from analysis.model_facts import model_facts_from_show
from sim import timing
from sim.backend import Done, GenRequest, Token
from sim.catalog import BY_NAME, MODELS, ModelFacts
from sim.engine import SimEngine
from sim.profiles import PROFILES, SimProfile, profile_by_key
from sim.tokens import encode, make_prompt
from sim.truth import TruthRecord

MAX_PROMPT_TOKENS = 32 * 1024
REL_TOLERANCE = 1e-9  # at the floor, sim's time and the ceiling are the same formula: only rounding differs
CASES = [(p, m) for p in PROFILES.values() for m in MODELS]
CASE_IDS = [f"{p.key}-{m.name}" for p, m in CASES]


def analysis_facts(model: ModelFacts) -> AnalysisFacts:
    """What the app learns about a sim model: its /api/show reply and its /api/tags size."""
    return model_facts_from_show({"model_info": model.model_info(), "details": model.details()}, model.size_bytes)


def analysis_ceilings(
    profile: SimProfile, model: ModelFacts, *, context: int, prompt: int, vram: float, ubatch: int = DEFAULT_UBATCH_TOKENS
) -> Ceilings:
    """The app's ``ceilings_for``, with the micro-batch the request ran with (the Why page passes the loaded model's)."""
    return ceilings_for(
        profile.spec,
        analysis_facts(model),
        context_tokens=context,
        prompt_tokens=prompt,
        vram_fraction=vram,
        host_bandwidth_bytes_s=profile.host_bandwidth_bytes_s,
        ubatch_tokens=ubatch,
    )


def fastest_prefill_s(model: ModelFacts, profile: SimProfile, vram: float, cached: int, prompt: int, batch: int) -> float:
    """The shortest time sim can report for ``prompt`` uncached tokens after ``cached`` ones: floor-length steps."""
    seconds, pos, end = 0.0, cached, cached + prompt
    while pos < end:
        n = min(batch, end - pos)
        seconds += timing.floor_seconds(model, profile, vram, timing.StepWork([], [(pos, n)]))
        pos += n
    return seconds


def vram_share(profile: SimProfile) -> st.SearchStrategy[float]:
    """size_vram ÷ size: anything from all in system memory to all in VRAM (nothing on a CPU-only machine)."""
    if profile.vram_bytes == 0:
        return st.just(0.0)
    return st.one_of(st.just(1.0), st.just(0.0), st.floats(0.0, 1.0))


@pytest.mark.parametrize(("profile", "model"), CASES, ids=CASE_IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_prefill_is_never_faster_than_the_analysis_ceiling(profile: SimProfile, model: ModelFacts, data: st.DataObject) -> None:
    prompt = data.draw(st.integers(1, min(MAX_PROMPT_TOKENS, model.context_length - 1)), label="uncached prompt tokens")
    cached = data.draw(st.integers(0, model.context_length - 1 - prompt), label="cached tokens before it")
    num_ctx = cached + prompt + 1
    batch = data.draw(st.one_of(st.just(timing.default_num_batch(num_ctx)), st.integers(32, 4096)), label="num_batch")
    vram = data.draw(vram_share(profile), label="vram fraction")
    rate = prompt / fastest_prefill_s(model, profile, vram, cached, prompt, batch)
    c = analysis_ceilings(profile, model, context=cached + prompt, prompt=prompt, vram=vram, ubatch=batch)
    assert rate <= c.prefill_ceiling_tok_s * (1 + REL_TOLERANCE)


@pytest.mark.parametrize(("profile", "model"), CASES, ids=CASE_IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decode_is_never_faster_than_the_analysis_ceiling(profile: SimProfile, model: ModelFacts, data: st.DataObject) -> None:
    context = data.draw(st.integers(1, model.context_length), label="context tokens")
    vram = data.draw(vram_share(profile), label="vram fraction")
    rate = 1.0 / timing.floor_seconds(model, profile, vram, timing.StepWork([context], []))
    ceiling = analysis_ceilings(profile, model, context=context, prompt=0, vram=vram).decode_ceiling_tok_s
    assert rate <= ceiling * (1 + REL_TOLERANCE)


def test_the_app_passes_ollamas_micro_batch_for_the_loaded_context() -> None:
    # What the Why page computes for a model loaded with 32K of context is the ceiling at sim's batch for it.
    profile, model = profile_by_key("rtx-3090"), BY_NAME["llama3.1:8b"]
    facts = analysis_facts(model)
    start = CeilingModel(
        profile.spec,
        facts,
        starting_efficiencies(profile.spec, facts.quantization),
        0.4,
        profile.host_bandwidth_bytes_s,
        None,
        ollama_num_batch(32768),
    )
    assert ollama_num_batch(32768) == timing.default_num_batch(32768) == 1024
    assert start.at(700, 900) == analysis_ceilings(profile, model, context=900, prompt=700, vram=0.4, ubatch=1024)
    for num_ctx in (2048, 4096, 4097, 32768, 32769, 131072):
        assert ollama_num_batch(num_ctx) == timing.default_num_batch(num_ctx)


def test_a_short_prefill_is_bound_by_one_read_of_the_weights() -> None:
    # The case: 14 prompt tokens of llama3.2 on an RTX 4090 cannot beat 14 x BW / W.
    profile, model = profile_by_key("rtx-4090"), BY_NAME["llama3.2:latest"]
    weights_read_s = model.size_bytes / profile.spec.bandwidth_bytes_s
    assert fastest_prefill_s(model, profile, 1.0, 0, 14, 512) >= weights_read_s
    assert 14 / fastest_prefill_s(model, profile, 1.0, 0, 14, 512) < 7_000  # not the 151,691 tok/s once plotted


async def _prefills_behind_a_stalled_loop(stall_s: float, rounds: int) -> tuple[list[int], float]:
    """(prompt_eval_ns of short requests started right after the loop stalled, their floor in ns)."""
    profile = dataclasses.replace(profile_by_key("rtx-4090"), disk_read_bytes_s=1e12)
    model = BY_NAME["llama3.2:latest"]
    engine = SimEngine(profile, num_parallel=2)

    def request(prompt_ids: list[int], num_predict: int) -> GenRequest:
        truth = TruthRecord(id=uuid.uuid4().hex, endpoint="/api/generate", model=model.name, received_ns=time.monotonic_ns())
        return GenRequest(model=model, prompt_ids=prompt_ids, truth=truth, num_predict=num_predict)

    tokens_seen = asyncio.Event()

    async def long_decode() -> None:
        # Keeps the batch loop stepping on its virtual timeline the whole time.
        async for ev in engine.generate(request(encode(make_prompt(8, seed=99)), 100_000)):
            if isinstance(ev, Token):
                tokens_seen.set()

    background = asyncio.create_task(long_decode())
    try:
        await tokens_seen.wait()
        durations: list[int] = []
        for i in range(rounds):
            time.sleep(stall_s)  # block the event loop: the batch loop falls behind its timeline and then catches up
            async for ev in engine.generate(request(encode(make_prompt(14, seed=i)), 2)):
                if isinstance(ev, Done):
                    durations.append(ev.prompt_eval_ns)
        floor_s = timing.floor_seconds(model, profile, 1.0, timing.StepWork([8], [(0, 14)]))
        return durations, floor_s * 1e9
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await engine.close()


def test_catching_up_never_makes_a_prefill_faster_than_the_weights_allow() -> None:
    durations, floor_ns = asyncio.run(_prefills_behind_a_stalled_loop(stall_s=0.03, rounds=8))
    assert len(durations) == 8
    # Timers only ever add time, so this holds on a busy machine too.
    assert min(durations) >= floor_ns, (durations, floor_ns)

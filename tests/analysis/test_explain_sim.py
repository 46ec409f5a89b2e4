"""Diagnoses and interference on real requests: sim → recording proxy → records → explainer.

sim is set up to cause each effect (a model larger than VRAM, a repeated prompt, a long
prompt arriving while another reply streams) and the explainer must name it with its
numbers; on a clean request it must say nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest

from analysis.ceilings import CeilingModel, starting_efficiencies
from analysis.diagnose import Diagnosis, diagnose_request
from analysis.explain import explain_rates, explain_request
from analysis.hardware import spec_by_key
from analysis.interference import describe, find_interference
from analysis.model_facts import ModelFacts, model_facts_from_show
from analysis.phases import split_record
from analysis.records import LoadedModel, RequestRecord
from analysis.story import Story, build_story
from collectors.proxy.recording import RECORD_ID_HEADER
from sim.tokens import make_prompt
from tests.support.proxy_thread import ProxyThread, run_proxy
from tests.support.sim_process import SimProcess, http_json, start_sim

HARDWARE = "rtx-3090"
SPEC = spec_by_key(HARDWARE)
MODEL = "llama3.1:8b"
CTX = {"num_ctx": 8192}  # every request the same, so none forces a reload

pytestmark = pytest.mark.sim_args(
    "--hardware", HARDWARE, "--num-parallel", "2", "--ollama-version", "0.33.3", "--disk-gbs", "100"
)


@pytest.fixture(scope="module")
def proxy(sim: SimProcess) -> Iterator[ProxyThread]:
    with run_proxy(sim.base_url) as p:
        ollama.Client(host=p.base_url, timeout=60).generate(model=MODEL, prompt="warm up", options={"num_predict": 2, **CTX})
        yield p


def facts(sim: SimProcess, model: str) -> ModelFacts:
    status, show = http_json(sim, "POST", "/api/show", {"model": model})
    assert status == 200, show
    _, tags = http_json(sim, "GET", "/api/tags")
    size = next(m["size"] for m in tags["models"] if m["name"] == model)
    return model_facts_from_show(show, size)


def loaded(sim: SimProcess, model: str) -> LoadedModel:
    _, ps = http_json(sim, "GET", "/api/ps")
    m = next(m for m in ps["models"] if m["name"] == model)
    return LoadedModel(time.time(), m["name"], m["model"], m["digest"], m["size"], m["size_vram"], m.get("context_length"), None)


def generate(proxy: ProxyThread, model: str, prompt: str, **options: Any) -> RequestRecord:
    """One streamed generation through the proxy; its record."""
    client = ollama.Client(host=proxy.base_url, timeout=60)
    before = {r.id for r in proxy.records}
    for _ in client.generate(model=model, prompt=prompt, options={**CTX, **options}, stream=True):
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = [r for r in proxy.records if r.id not in before and r.model == model and r.final_chunk_ns]
        if new:
            return new[-1]
        time.sleep(0.01)
    raise TimeoutError("no record")


def diagnose(sim: SimProcess, rec: RequestRecord) -> list[Diagnosis]:
    return diagnose_request(rec, split_record(rec), spec=SPEC, facts=facts(sim, rec.model), loaded=loaded(sim, rec.model))


def test_clean_request_is_silent(sim: SimProcess, proxy: ProxyThread) -> None:
    rec = generate(proxy, MODEL, make_prompt(60, seed=11), num_predict=30)
    ph = split_record(rec)
    assert ph.decode_tok_s and ph.output_tokens == 30
    assert diagnose(sim, rec) == []
    lines = explain_request(rec, split_record(rec))
    assert "writing 30 tokens at" in lines[0]


def test_repeated_prompt_is_a_cache_hit(sim: SimProcess, proxy: ProxyThread) -> None:
    prompt = make_prompt(2000, seed=12)
    generate(proxy, MODEL, prompt, num_predict=3)
    rec = generate(proxy, MODEL, prompt, num_predict=3)
    ph = split_record(rec)
    assert ph.cached_tokens and ph.prompt_tokens and ph.cached_tokens > 0.9 * ph.prompt_tokens
    hits = [d for d in diagnose(sim, rec) if d.code == "cache_hit"]
    assert len(hits) == 1
    assert f"{ph.cached_tokens:,} of the {ph.prompt_tokens:,} prompt tokens" in hits[0].sentence
    assert ph.ollama_prefill_tok_s and f"{ph.ollama_prefill_tok_s:,.0f} tok/s" in hits[0].sentence


def test_long_prompt_stalls_a_streaming_reply(sim: SimProcess, proxy: ProxyThread) -> None:
    victim_id: list[str] = []

    def stream_reply() -> None:
        # Plain httpx, to read the proxy's record id header; "stream" absent means streamed NDJSON.
        resp = httpx.post(
            proxy.base_url + "/api/generate",
            json={"model": MODEL, "prompt": make_prompt(20, seed=13), "options": {"num_predict": 150, **CTX}},
            timeout=60,
        )
        victim_id.append(resp.headers[RECORD_ID_HEADER])

    t = threading.Thread(target=stream_reply)
    t.start()
    try:
        time.sleep(0.3)  # the reply is streaming by now
        aggressor = generate(proxy, MODEL, make_prompt(4000, seed=14), num_predict=3)
    finally:
        t.join(timeout=60)
    victim = proxy.wait_record(victim_id[0])
    pairs = [(victim, split_record(victim)), (aggressor, split_record(aggressor))]
    found = [i for i in find_interference(pairs) if i.victim_id == victim.id and i.aggressor_id == aggressor.id]
    assert len(found) == 1
    i = found[0]
    assert i.significant and i.affected_gaps >= 1
    # Each stalled gap is about one chunk of the other prompt: far beyond the usual gap.
    assert i.extra_ms_per_token > 5 * i.baseline_gap_ms
    assert "4,0" in describe(i)  # the aggressor's prompt length, in words
    # The aggressor's own wait for its first token went to reading that prompt.
    assert "ttft_prompt" in [d.code for d in diagnose(sim, aggressor)]
    c_lines = explain_rates(_story(sim), hardware_name=SPEC.name, model_name=MODEL, interference=found)
    assert c_lines[-1].startswith("Measured here:")


def _story(sim: SimProcess) -> Story:
    f = facts(sim, MODEL)
    return build_story(CeilingModel(SPEC, f, starting_efficiencies(SPEC, f.quantization)), [])


def test_model_larger_than_vram_is_partly_offloaded() -> None:
    # Its own sim: the 70B model (42.5 GB) cannot fit a 24 GB card.
    with start_sim("--hardware", HARDWARE, "--disk-gbs", "200") as s, run_proxy(s.base_url) as p:
        rec = generate(p, "llama3.1:70b", "hello there", num_predict=4)
        lm = loaded(s, "llama3.1:70b")
        assert lm.size_vram_bytes < lm.size_bytes
        ds = diagnose_request(rec, split_record(rec), spec=SPEC, facts=facts(s, rec.model), loaded=lm)
    assert ds[0].code == "partial_offload"
    frac = 1 - lm.size_vram_bytes / lm.size_bytes
    assert f"{frac * 100:.0f}% of llama3.1:70b" in ds[0].sentence
    assert ds[0].numbers["full_gpu_expected_tok_s"] > 3 * ds[0].numbers["measured_tok_s"]

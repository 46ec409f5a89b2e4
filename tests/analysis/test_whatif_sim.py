"""The what-if's suggestion, tried on sim: a spilling model, the setting suggested, and the decode rate it gives.

sim (a simulated RTX 4090, 24 GiB, two slots) loads llama3.1:8b with two 131,072-token contexts: 39 GB, so part of
it runs from system memory. Calibrated on that run's decode rate (as the Why page calibrates on the user's
requests), the suggestion's predicted decode rate must meet what sim gives at the suggested setting within 10%.
"""

from __future__ import annotations

from dataclasses import replace

import ollama
import pytest

from analysis.ceilings import starting_efficiencies
from analysis.hardware import BY_KEY
from analysis.memory import RunnerSettings
from analysis.model_facts import model_facts_from_show
from analysis.whatif import Workload, predict, suggest
from sim.profiles import PROFILES
from tests.support.sim_process import start_sim

MODEL = "llama3.1:8b"
PROMPT = "Tell me about the sea. " * 20
REPLY_TOKENS = 200


def _decode_tok_s(client: ollama.Client, num_ctx: int) -> tuple[float, int]:
    """(decode tok/s by Ollama's numbers, the context it decoded at)."""
    r = client.generate(model=MODEL, prompt=PROMPT, options={"num_predict": REPLY_TOKENS, "num_ctx": num_ctx})
    assert r.eval_count and r.eval_duration and r.prompt_eval_count
    return (r.eval_count - 1) / (r.eval_duration / 1e9), r.prompt_eval_count + r.eval_count // 2


def _vram_share(client: ollama.Client) -> float:
    loaded = next(m for m in client.ps().models if m.model == MODEL)
    assert loaded.size and loaded.size_vram is not None
    return loaded.size_vram / loaded.size


@pytest.mark.slow
def test_the_suggested_context_runs_at_the_predicted_rate() -> None:
    spec, profile = BY_KEY["rtx-4090"], PROFILES["rtx-4090"]
    with start_sim("--hardware", "rtx-4090", "--num-parallel", "2") as sim:
        client = ollama.Client(host=sim.base_url, timeout=300)
        show = client.show(MODEL).model_dump(by_alias=True)
        size = next(m.size for m in client.list().models if m.model == MODEL)
        assert size is not None
        facts = model_facts_from_show(show, int(size))
        spilled_rate, context = _decode_tok_s(client, 131072)
        assert _vram_share(client) < 1.0, "two 128k contexts spill on 24 GiB"

        work = Workload(context, context, context, context)
        now_settings = RunnerSettings(num_ctx=131072, num_parallel=2)
        free, host = float(profile.vram_bytes), profile.host_bandwidth_bytes_s
        start = predict(facts, spec, now_settings, work, free_vram_bytes=free, host_bandwidth_bytes_s=host)
        # Calibrated as the Why page does: the measured share of the decode ceiling.
        eff = replace(starting_efficiencies(spec, facts.quantization), eta_bw=spilled_rate / start.at_median.decode_ceiling_tok_s)
        now = predict(facts, spec, now_settings, work, free_vram_bytes=free, host_bandwidth_bytes_s=host, efficiencies=eff)
        assert now.memory.fits is False
        found = suggest(now, facts, spec, work, free_vram_bytes=free, host_bandwidth_bytes_s=host, efficiencies=eff)
        ctx = next(f for f in found if f.change.startswith("num_ctx") and f.prediction.memory.fits)
        assert "num_ctx" in ctx.how and ctx.prediction.memory.fits

        measured, _ = _decode_tok_s(client, ctx.prediction.settings.num_ctx)
        assert _vram_share(client) == 1.0, f"sim fits it too at {ctx.change}"
        assert measured > spilled_rate * 1.1
        print(f"spilled {spilled_rate:.1f} tok/s; {ctx.sentence}; sim measured {measured:.1f} tok/s")
        assert ctx.prediction.decode_tok_s == pytest.approx(measured, rel=0.10), (ctx.sentence, measured)

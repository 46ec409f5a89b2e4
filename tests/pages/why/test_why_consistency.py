"""The Why page tells one story: every number it states, draws and diagnoses comes from one ceiling model.

The page is rendered (AppTest) over fixture stores written with the collector's own StoreWriter: short
prompts only, long prompts only, mixed, cache-heavy, a partly offloaded model, impossible readings, and
no data. For each, the rendered text and figures are checked against each other and against figures
computed here from the requests written:
- each stated ceiling equals the chart's ceiling line at the stated prompt length or context;
- each verdict (which side of the ridge) matches the intensity and ridge the same sentence states;
- the expected ratio is the median expected prefill ÷ median expected decode at the measured requests'
  own prompt lengths and contexts (``analysis.ceilings.ceilings_for``, called here directly);
- no impossible or too-short reading sets an axis range, a median or the calibration;
- no sentence appears twice.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from analysis import wording as w
from analysis.ceilings import (
    MAX_PLAUSIBLE_FRACTION,
    MIN_RATE_TOKENS,
    Efficiencies,
    ceilings_for,
    ollama_num_batch,
    starting_efficiencies,
)
from analysis.hardware import spec_by_key
from analysis.model_facts import model_facts_from_show
from analysis.records import LoadedModel
from pages.why.figures import HEADROOM
from pages.why.view import build_why
from sim.catalog import BY_NAME
from store.schema import db_path
from store.writer import StoreWriter
from tests.support.why_page import (
    BIG,
    GIB,
    MODEL,
    PLAIN,
    Req,
    build_store,
    figures,
    open_why,
    page_text,
    req_shape,
    show_json,
    trace,
)

SPEC = spec_by_key("rtx-4090")


@dataclass(frozen=True)
class Fixture:
    reqs: list[Req]
    model: str = MODEL
    loaded: list[LoadedModel] | None = None


def _shapes(prompts: list[int], rate_tok_s: float, step_ms: float, offset0: float = 290.0, cached: int = 0) -> list[Req]:
    return [
        Req(req_shape(p + cached, p / rate_tok_s * 1000, 60 + 10 * i, step_ms, cached=cached), offset0 - 12 * i)
        for i, p in enumerate(prompts)
    ]


def _half_loaded(now: float) -> list[LoadedModel]:
    return [LoadedModel(now - 1, BIG, BIG, BY_NAME[BIG].digest, 42 * GIB, 21 * GIB, 4096, now + 90, "70.6B", "Q4_K_M", "llama")]


SHORT = _shapes([40, 48, 56, 64, 72, 80, 90], 12_000, 6) + _shapes([12, 20], 4_000, 6, offset0=100)  # two too short to time
LONG = _shapes([2000, 3000, 4000, 6000, 8000, 12000, 16000], 18_000, 7)
CACHE = (
    _shapes([100, 60, 40, 80, 120], 15_000, 5, cached=2900)
    + _shapes([800, 1600], 20_000, 5, offset0=200)
    + [Req(req_shape(8808, 440, 80, 6, cached=3), 60)]  # 3 cached tokens of 8,808: not worth a sentence
)
# Half of a 70B model in system memory: about 2 tok/s of decode at most, a few hundred of prefill.
OFFLOAD = [replace(r, model=BIG) for r in _shapes([300, 600, 1200, 2400, 4800], 400, 1000)]
IMPOSSIBLE = [
    *PLAIN[:6],
    Req(req_shape(14, 0.0923, 40, 4), 20),  # 151,691 tok/s for 14 tokens: faster than one read of the weights
    Req(req_shape(4000, 10, 60, 5), 15),  # 400,000 tok/s: above the compute ceiling
]
FIXTURES = {
    "short-only": Fixture(SHORT),
    "long-only": Fixture(LONG),
    "mixed": Fixture(PLAIN),
    "cache-heavy": Fixture(CACHE),
    "partial-offload": Fixture(OFFLOAD, BIG),
    "impossible": Fixture(IMPOSSIBLE),
    "no-data": Fixture([]),
}


def _num(s: str) -> float:
    return float(s.replace(",", ""))


def _computed(r: Req) -> int:
    return r.shape.prompt_tokens - (r.shape.cached_tokens or 0)


def _context(r: Req) -> int:
    return round(r.shape.prompt_tokens + r.shape.output_tokens / 2)


def _check(at: Any, fx: Fixture, data_dir: Path, now: float) -> None:
    text = page_text(at)
    figs = figures(at)
    metrics = {m.label: m.value for m in at.metric}
    pre, dec = figs["Prefill"], figs["Decode"]

    # No sentence twice.
    lines = [s.strip() for line in text.splitlines() for s in re.split(r"(?<=\.) (?=[A-Z])", line) if len(s.strip()) > 20]
    assert not [s for s, n in Counter(lines).items() if n > 1]

    # Stated ceilings are the chart's ceilings at the stated prompt length and context.
    m = re.search(r"at ([\d,]+) prompt tokens the ceiling is ([\d,.]+ tok/s), set by (\w+)", text)
    assert m, text
    prompt, stated, bound = int(_num(m[1])), m[2], m[3]
    line = dict(zip(trace(pre, "ceiling")["x"], trace(pre, "ceiling")["y"], strict=True))
    assert w.tok_s(line[prompt]) == stated
    m = re.search(r"from memory at ([\d,]+) tokens of context: at [\d,]+ GB/s that allows at most ([\d,.]+ tok/s) there", text)
    assert m, text
    ctx, stated = int(_num(m[1])), m[2]
    line = dict(zip(trace(dec, "ceiling")["x"], trace(dec, "ceiling")["y"], strict=True))
    assert w.tok_s(line[ctx]) == stated

    # Verdicts from the numbers the same sentence states.
    m = re.search(
        r"decode does about ([\d,.]+) FLOP and a ([\d,]+)-token prefill about ([\d,.]+); .* needs ([\d,.]+) FLOP per byte", text
    )
    assert m, text
    dec_i, pre_p, pre_i, ridge = _num(m[1]), int(_num(m[2])), _num(m[3]), _num(m[4])
    assert pre_p == prompt
    verdict = next(s for s in text.splitlines() if "its ridge point" in s)
    assert ("decode runs" in verdict and "below it, waiting on memory" in verdict) == (dec_i < ridge)
    assert (f"{pre_p:,}-token prefill sits" in verdict and "above it, limited by compute" in verdict) == (pre_i >= ridge)
    assert (bound == "compute") == (pre_i >= ridge)

    model = build_why(db_path(data_dir), fx.model, now)
    assert model is not None and model.efficiencies is not None and model.facts is not None
    eff, hw = model.efficiencies, model.hardware
    facts = model_facts_from_show(show_json(fx.model), None)
    ubatch = ollama_num_batch(fx.loaded[0].context_length if fx.loaded else 8192)

    def ceil_at(p: int, c: int, efficiencies: Efficiencies = eff) -> Any:
        return ceilings_for(
            SPEC,
            facts,
            context_tokens=c,
            prompt_tokens=p,
            vram_fraction=model.vram_fraction,
            host_bandwidth_bytes_s=hw.host_bandwidth_bytes_s,
            efficiencies=efficiencies,
            bandwidth_bytes_s=hw.bandwidth_bytes_s,
            ubatch_tokens=ubatch,
        )

    # Which readings count: timed over enough tokens and under their own ceiling.
    def pre_ceiling(r: Req) -> float:
        return float(ceil_at(_computed(r), _computed(r)).prefill_ceiling_tok_s)

    pre_ok = [
        r for r in fx.reqs if _computed(r) >= MIN_RATE_TOKENS and r.prefill_tok_s <= MAX_PLAUSIBLE_FRACTION * pre_ceiling(r)
    ]
    dec_ok = [
        r
        for r in fx.reqs
        if r.decode_tok_s
        and r.shape.output_tokens - 1 >= MIN_RATE_TOKENS
        and r.decode_tok_s <= MAX_PLAUSIBLE_FRACTION * ceil_at(0, _context(r)).decode_ceiling_tok_s
    ]
    impossible = [r for r in fx.reqs if r.prefill_tok_s > MAX_PLAUSIBLE_FRACTION * pre_ceiling(r)]

    if not fx.reqs:
        assert metrics["Prefill ÷ decode"] == "—" and metrics["Prefill, tok/s (median)"] == "—"
        assert "should read a 512-token prompt at about" in text
        return

    # Medians and the ratio from the counted readings only.
    pp = statistics.median(r.prefill_tok_s for r in pre_ok)
    tg = statistics.median(r.decode_tok_s for r in dec_ok if r.decode_tok_s)
    assert metrics["Prefill, tok/s (median)"] == w.num(pp) and metrics["Decode, tok/s (median)"] == w.num(tg)
    assert metrics["Prefill ÷ decode"] == w.times(pp / tg)

    # The prior's ratio (the starting efficiencies, never fitted) over the same prompts and contexts.
    prior = starting_efficiencies(SPEC, facts.quantization).serving(facts.layers)
    exp_pp = statistics.median(ceil_at(_computed(r), _computed(r), prior).prefill_expected_tok_s for r in pre_ok)
    exp_tg = statistics.median(ceil_at(0, _context(r), prior).decode_expected_tok_s for r in dec_ok)
    assert metrics["Prior ratio"] == w.times(exp_pp / exp_tg)
    differ = not (1 / 1.5 <= (pp / tg) / (exp_pp / exp_tg) <= 1.5)
    assert ("The two ratios differ by more than" in text) == differ

    # The calibration saw the counted readings only.
    expected_name = trace(pre, "expected")["name"]
    if len(pre_ok) >= 5:
        assert f"median of {len(pre_ok)} of your requests" in expected_name
        assert eff.prefill_samples == len(pre_ok)
    else:
        assert "docs/physics.md" in expected_name
    assert eff.decode_samples in (0, len(dec_ok))

    # Axis ranges: the ceiling line and the counted readings; flagged ones sit at the edge, values in hover.
    top = pre["layout"]["yaxis"]["range"][1]
    ceiling_top = max(trace(pre, "ceiling")["y"])
    assert top == pytest.approx(HEADROOM * max(ceiling_top, *(r.prefill_tok_s for r in pre_ok)))
    for r in impossible:
        assert r.prefill_tok_s > top
    if impossible:
        flagged = trace(pre, "cannot be true")
        assert sorted(float(c[1]) for c in flagged["customdata"]) == pytest.approx(sorted(r.prefill_tok_s for r in impossible))
        assert all(y <= top for y in flagged["y"])
        assert f"{len(impossible)} above the ceiling, which cannot be true" in text
    tiny = [r for r in fx.reqs if _computed(r) < MIN_RATE_TOKENS and r not in impossible]
    if tiny:
        assert f"{len(tiny)} timed over fewer than {MIN_RATE_TOKENS} tokens" in text


@pytest.mark.parametrize("name", list(FIXTURES))
def test_why_tells_one_story(name: str, data_dir: Path) -> None:
    fx = FIXTURES[name]
    now = time.time()
    loaded = _half_loaded(now) if fx.model == BIG else None
    fx = replace(fx, loaded=loaded)
    build_store(data_dir, now, reqs=fx.reqs, loaded=loaded)
    at = open_why()
    if fx.model != MODEL:
        at.selectbox(key="why_model").set_value(fx.model).run()
    assert not at.exception
    _check(at, fx, data_dir, now)


def test_cache_sentences_only_when_material_and_once(data_dir: Path) -> None:
    now = time.time()
    build_store(data_dir, now, reqs=CACHE)
    text = page_text(open_why())
    assert "8,808 prompt tokens" not in text  # 3 cached tokens move the rate by 0.03%: no sentence
    assert text.count("came from the prompt cache") == 1  # grouped: the newest case, once


def test_before_any_request_the_physics_for_this_gpu_and_a_typical_model(data_dir: Path) -> None:
    from bench.pages_fixture import status_rows

    w_ = StoreWriter(db_path(data_dir))
    try:
        status_rows(w_, time.time(), data_dir)
    finally:
        w_.close()
    at = open_why()
    text = page_text(at)
    assert "a typical 8B model (Q4_K_M)" in text and "should read a 512-token prompt at about" in text
    figs = figures(at)
    assert len(trace(figs["Prefill"], "ceiling")["y"]) > 10 and len(trace(figs["Decode"], "expected")["y"]) > 10
    assert at.get("page_link"), "a one-click way to the Lab experiment"
    at.selectbox(key="why_gpu").set_value("rtx-3090").run()
    assert "NVIDIA GeForce RTX 3090" in page_text(at) and "936 GB/s" in page_text(at)

"""The Why page's work: store → hardware, model facts, ceilings, charts and sentences (no Streamlit).

``build_why`` reads the store read-only once and hands the page everything it draws:
the GPU (from the latest NVML sample, matched against the spec table, bandwidth
cross-checked with NVML's memory clock × bus width), the model's facts from the stored
``/api/show`` answer and where it sits (``/api/ps``), one point per recorded request,
ceiling and expected lines, the explainer's sentences, grouped diagnoses and energy.
Every sentence comes from ``analysis`` (``explain_rates``, ``describe``, diagnoses),
so it carries the user's numbers.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from analysis import wording as w
from analysis.accelerator import Hardware, resolve_hardware
from analysis.ceilings import (
    MIN_DECODE_INTERVALS_FOR_CALIBRATION,
    MIN_PROMPT_TOKENS_FOR_CALIBRATION,
    CalibrationPoint,
    Ceilings,
    CurvePoint,
    Efficiencies,
    calibrate,
    calibration_points,
    ceilings_for,
    ceilings_for_request,
    curve_tokens,
    decode_curve,
    prefill_curve,
    starting_efficiencies,
    vram_fraction,
)
from analysis.diagnose import CODES, Severity, diagnose_request
from analysis.energy import PhaseEnergy, energy_for_request
from analysis.explain import explain_energy, explain_rates
from analysis.hardware import HardwareSpec
from analysis.interference import Interference, describe, find_interference
from analysis.model_facts import ModelFacts, ModelFactsError, model_facts_from_show
from analysis.phases import Phases
from analysis.records import UNIFIED_MEMORY_KINDS, UNIFIED_MEMORY_NOTE, GpuSample, LoadedModel, Outcome, RequestRecord
from pages.charts import plain
from store import queries
from store.tables import RequestSummary

POINTS_LIMIT = 5000  # requests drawn per chart (newest first)
CALIBRATION_LIMIT = 1000  # newest requests the calibration looks at
RECENT_LIMIT = 400  # records (with token times) for interference, within the sidebar window
DIAGNOSE_LIMIT = 100  # newest finished requests of the model that get diagnosed
GPU_LOOKBACK_S = 24 * 3600  # how far back to look for a GPU sample when none is fresh
DEFAULT_PROMPT_TOKENS = 512  # for the sentences when no request has been measured yet
DEFAULT_CONTEXT_TOKENS = 1024
CURVE_POINTS = 60

MEASURED_COLOUR = "#1e88e5"
CEILING_COLOUR = "#e53935"
EXPECTED_COLOUR = "#fb8c00"
FULL_GPU_COLOUR = "#8e24aa"


_open = queries.open_reader  # None while there is no store yet


# ---------------------------------------------------------------------------------------------
# Figures


def _measured_trace(xs: Sequence[float | None], ys: Sequence[float | None], ids: Sequence[str], x_label: str) -> go.Scatter:
    # numpy arrays: Plotly validates a list element by element, an array at once (5,000 points: ~1 s vs ~ms).
    return go.Scatter(
        x=np.asarray(xs, dtype=np.float64),
        y=np.asarray(ys, dtype=np.float64),
        mode="markers",
        name="measured (one per request)",
        marker={"color": MEASURED_COLOUR, "size": 7, "opacity": 0.75},
        customdata=np.asarray([i[:8] for i in ids], dtype=object),
        hovertemplate=f"{x_label}: %{{x:,.0f}}<br>%{{y:,.1f}} tok/s<br>request %{{customdata}}<extra></extra>",
    )


def _line(curve: Sequence[CurvePoint], attr: str, name: str, colour: str, dash: str) -> go.Scatter:
    return go.Scatter(
        x=[p.tokens for p in curve],
        y=[getattr(p, attr) for p in curve],
        mode="lines",
        name=name,
        line={"color": colour, "width": 2, "dash": dash},
        hovertemplate="%{x:,.0f} tokens: %{y:,.1f} tok/s<extra>" + name.split(" (")[0] + "</extra>",
    )


def _layout(fig: go.Figure, title: str, x_title: str) -> go.Figure:
    fig.update_layout(
        title={"text": title},
        height=420,
        margin={"l": 60, "r": 20, "t": 70, "b": 50},
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0},
        hovermode="closest",
    )
    fig.update_xaxes(title_text=x_title, type="log")
    fig.update_yaxes(title_text="tokens per second (tok/s)", rangemode="tozero")
    return fig


def expected_label(eff: Efficiencies, kind: str) -> str:
    """Legend name of the expected line: which efficiency it uses and where that came from."""
    eta, source = (eff.eta_compute, eff.source_compute) if kind == "prefill" else (eff.eta_bw, eff.source_bw)
    return f"expected ({w.pct(eta)} of ceiling: {source})"


def prefill_figure(
    points: Sequence[RequestSummary], curve: Sequence[CurvePoint], eff: Efficiencies | None, model: str, hw_label: str
) -> go.Figure:
    fig = go.Figure()
    if curve and eff is not None:
        fig.add_trace(_line(curve, "ceiling_tok_s", "ceiling (memory, then compute)", CEILING_COLOUR, "dash"))
        fig.add_trace(_line(curve, "expected_tok_s", expected_label(eff, "prefill"), EXPECTED_COLOUR, "solid"))
    fig.add_trace(
        _measured_trace([p.computed_prompt_tokens for p in points], [p.prefill_tok_s for p in points],
                        [p.id for p in points], "prompt tokens")
    )  # fmt: skip
    return _layout(
        fig, f"Prefill: prompt tokens/s against prompt length<br><sup>{plain(model)} on {plain(hw_label)}</sup>",
        "prompt length (tokens computed, cache hits excluded; log scale)",
    )  # fmt: skip


def decode_figure(
    points: Sequence[RequestSummary],
    curve: Sequence[CurvePoint],
    full_gpu_curve: Sequence[CurvePoint],
    eff: Efficiencies | None,
    model: str,
    hw_label: str,
) -> go.Figure:
    fig = go.Figure()
    if curve and eff is not None:
        blended = " blended with system memory" if full_gpu_curve else ""
        fig.add_trace(_line(curve, "ceiling_tok_s", f"ceiling (memory bandwidth{blended})", CEILING_COLOUR, "dash"))
        fig.add_trace(_line(curve, "expected_tok_s", expected_label(eff, "decode"), EXPECTED_COLOUR, "solid"))
    if full_gpu_curve:
        fig.add_trace(_line(full_gpu_curve, "ceiling_tok_s", "ceiling if the model were all in VRAM", FULL_GPU_COLOUR, "dot"))
    fig.add_trace(
        _measured_trace([p.decode_context_tokens for p in points], [p.decode_tok_s for p in points],
                        [p.id for p in points], "context tokens")
    )  # fmt: skip
    return _layout(
        fig, f"Decode: output tokens/s against context length<br><sup>{plain(model)} on {plain(hw_label)}</sup>",
        "context length (prompt + half the reply, tokens; log scale)",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The page's model


@dataclass(frozen=True)
class DiagnosisGroup:
    code: str
    what: str  # what the diagnosis means, in general
    severity: Severity
    requests: int  # how many of the diagnosed requests had it
    latest: str  # the newest request's sentence, with its numbers


@dataclass
class WhyModel:
    model: str
    hardware: Hardware
    facts: ModelFacts | None
    facts_error: str | None  # why there are no facts (not fetched yet, or unreadable)
    loaded: LoadedModel | None
    vram_fraction: float
    prefill_points: list[RequestSummary]  # with a prefill rate and computed prompt tokens
    decode_points: list[RequestSummary]  # with a decode rate and a context length
    requests_total: int  # finished requests of this model in the store (up to POINTS_LIMIT)
    efficiencies: Efficiencies | None
    ceilings: Ceilings | None  # at the typical prompt and context
    typical_prompt_tokens: int
    typical_context_tokens: int
    prefill_median_tok_s: float | None
    decode_median_tok_s: float | None
    prefill_fig: go.Figure
    decode_fig: go.Figure
    sentences: list[str]  # explain_rates: the ratio first, then the plain explanation
    interference: list[Interference]  # significant events where this model's reply was slowed
    interference_sentences: list[str]
    diagnoses: list[DiagnosisGroup]
    diagnosed_requests: int
    energy: PhaseEnergy | None
    energy_sentence: str | None
    window_requests: int  # this model's finished requests in the sidebar window
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.prefill_median_tok_s and self.decode_median_tok_s:
            return self.prefill_median_tok_s / self.decode_median_tok_s
        return None

    @property
    def simulated(self) -> bool:
        return self.hardware.simulated


def model_choices(db: Path) -> list[str] | None:
    """Models with recorded requests (newest first), then loaded ones; None when there is no store."""
    with _open(db) as conn:
        return None if conn is None else queries.model_choices(conn)


def _latest_gpus(conn: sqlite3.Connection, now_unix_s: float) -> list[GpuSample]:
    """The newest sample of each GPU: from the last minute, else the last day (per-minute rollups)."""
    for lookback in (60.0, GPU_LOOKBACK_S):
        latest: dict[int, GpuSample] = {}
        for s in queries.gpu_samples(conn, now_unix_s - lookback, now_unix_s + 5):
            latest[s.index] = s
        if latest:
            return [latest[i] for i in sorted(latest)]
    return []


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _prefill_points(rows: Sequence[RequestSummary]) -> list[RequestSummary]:
    return [r for r in rows if r.prefill_tok_s and r.prompt_tokens and (r.computed_prompt_tokens or 0) > 0]


def _decode_points(rows: Sequence[RequestSummary]) -> list[RequestSummary]:
    return [r for r in rows if r.decode_tok_s and r.decode_context_tokens is not None]


def _calibrate(rows: Sequence[RequestSummary], spec: HardwareSpec, facts: ModelFacts, start: Efficiencies,
               frac: float, host_bw: float | None, bw: float | None) -> Efficiencies:  # fmt: skip
    history: list[CalibrationPoint] = []
    for r in rows[:CALIBRATION_LIMIT]:
        c = ceilings_for_request(
            spec, facts, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens, vram_fraction=frac,
            host_bandwidth_bytes_s=host_bw, efficiencies=start, bandwidth_bytes_s=bw,
        )  # fmt: skip
        computed = (r.prompt_tokens or 0) - (r.cached_tokens or 0)
        history += calibration_points(r.decode_tok_s, r.output_tokens, r.prefill_tok_s, computed, c)
    return calibrate(history, start)


def _aggregate_energy(parts: Sequence[PhaseEnergy]) -> PhaseEnergy | None:
    """Joules summed over requests, divided by the tokens they covered: a per-token figure for the model."""
    pre = [(e.prefill_j, e.prompt_tokens_computed) for e in parts if e.prefill_j is not None and e.prompt_tokens_computed]
    dec = [(e.decode_j, e.output_intervals) for e in parts if e.decode_j is not None and e.output_intervals]
    if not pre and not dec:
        return None
    pre_j, pre_n = sum(j for j, _ in pre if j is not None), sum(n for _, n in pre if n)
    dec_j, dec_n = sum(j for j, _ in dec if j is not None), sum(n for _, n in dec if n)
    methods = {e.method for e in parts if e.method}
    return PhaseEnergy(
        prefill_j=pre_j if pre else None,
        decode_j=dec_j if dec else None,
        prompt_tokens_computed=pre_n or None,
        output_intervals=dec_n or None,
        j_per_prompt_token=pre_j / pre_n if pre_n else None,
        j_per_output_token=dec_j / dec_n if dec_n else None,
        method=methods.pop() if len(methods) == 1 else "mixed",
        coarse=any(e.coarse for e in parts),
    )


def _group(diagnosed: Sequence[tuple[RequestRecord, list[Any]]]) -> list[DiagnosisGroup]:
    counts: Counter[str] = Counter()
    latest: dict[str, tuple[float, str, Severity]] = {}
    for rec, ds in diagnosed:
        for d in {d.code: d for d in ds}.values():
            counts[d.code] += 1
            if d.code not in latest or rec.started_at_unix_s > latest[d.code][0]:
                latest[d.code] = (rec.started_at_unix_s, d.sentence, d.severity)
    groups = [DiagnosisGroup(code, CODES.get(code, code), latest[code][2], n, latest[code][1]) for code, n in counts.items()]
    groups.sort(key=lambda g: (g.severity != Severity.WARNING, -g.requests, g.code))
    return groups


def _interference_on(victims: Sequence[RequestRecord], pairs: Sequence[tuple[RequestRecord, Phases]]) -> list[Interference]:
    """Significant slowdowns of ``victims``' replies by any request's prefill, worst first.

    ``find_interference`` compares every gap of every record with every prefill; here only
    the victims keep their token times and only prefills inside a victim's stream are
    offered, which keeps a busy window to milliseconds instead of minutes.
    """
    windows = [(ph.prefill_start_ns, ph.decode_start_ns, rec, ph) for rec, ph in pairs
               if ph.prefill_start_ns is not None and ph.decode_start_ns is not None]  # fmt: skip
    by_id = {rec.id: ph for rec, ph in pairs}
    out: list[Interference] = []
    for victim in victims:
        ts = victim.token_chunk_ns
        if len(ts) < 3 or victim.id not in by_id:
            continue
        others = [(replace(rec, token_chunk_ns=[]), ph) for w0, w1, rec, ph in windows
                  if rec.id != victim.id and w0 is not None and w1 is not None and w0 < ts[-1] and w1 > ts[0]]  # fmt: skip
        if others:
            found = find_interference([(victim, by_id[victim.id]), *others])
            out += [i for i in found if i.significant and i.victim_id == victim.id]
    out.sort(key=lambda i: i.extra_ms_total, reverse=True)
    return out


def build_why(
    db: Path,
    model: str,
    now_unix_s: float | None = None,
    window_s: float = 300.0,
    *,
    apple_chip: tuple[str, int | None] | None = None,
) -> WhyModel | None:
    """Everything the Why page shows for ``model``; None when there is no store.

    ``window_s`` (the sidebar's window) bounds the diagnoses, interference and energy;
    the charts and the calibration use every stored request of the model. The host's
    memory bandwidth (where it matters: no GPU, or part of the model in system memory)
    is the collector's stored measurement; every phase is the one stored with its request.
    """
    now = time.time() if now_unix_s is None else now_unix_s
    with _open(db) as conn:
        if conn is None:
            return None
        gpus = _latest_gpus(conn, now)
        beat = queries.latest_heartbeat(conn)
        info = queries.model_info(conn, model)
        show = None if info is None else info.show
        loaded = queries.loaded_model(conn, model)
        measured_bw = queries.latest_host_bandwidth(conn)
        rows = queries.rate_rows(conn, model, 0.0, limit=POINTS_LIMIT)
        # Their phases as stored at write time (re-derived by the collector when the split changes).
        recent = [s for s in queries.requests_in_window(conn, now - window_s, now, with_tokens=True, limit=RECENT_LIMIT)
                  if s.record.metrics is not None]  # fmt: skip
        phases = {s.record.id: s.phases for s in recent}
        mine = [s.record for s in recent if s.record.model == model and s.record.outcome is Outcome.OK][-DIAGNOSE_LIMIT:]
        samples_by_id: dict[str, list[GpuSample]] = {}
        if gpus:
            for rec in mine:
                end_ns = rec.closed_ns or rec.final_chunk_ns or rec.received_ns
                samples_by_id[rec.id] = queries.gpu_samples(conn, rec.started_at_unix_s - 2, rec.wall_s(end_ns) + 2)

    frac = vram_fraction(loaded.size_bytes, loaded.size_vram_bytes) if loaded else 1.0
    need_host = not gpus or frac < 1.0

    def host_bw() -> float | None:
        return None if measured_bw is None else measured_bw.bandwidth_bytes_s

    hw = resolve_hardware(gpus[0] if gpus else None, gpu_count=len(gpus), apple_chip=apple_chip,
                          host_bandwidth=host_bw if need_host else lambda: None)  # fmt: skip
    if hw.kind == "cpu":
        frac = 1.0  # the CPU's memory is the "VRAM": nothing is offloaded from it
    elif frac < 1.0:
        hw = replace(hw, host_bandwidth_bytes_s=host_bw())
    notes = list(hw.notes)
    if gpus and beat is not None and beat.gpu_state in UNIFIED_MEMORY_KINDS:
        notes.append(UNIFIED_MEMORY_NOTE[0].upper() + UNIFIED_MEMORY_NOTE[1:] + " (Ollama's size_vram).")

    facts: ModelFacts | None = None
    facts_error: str | None = None
    if show is None:
        facts_error = (
            f"No model facts for {model} yet: they appear once Ollama has the model loaded and the collector "
            "has asked Ollama about it (/api/show)."
        )
    else:
        try:
            facts = model_facts_from_show(show, None)
        except ModelFactsError as e:
            facts_error = f"Ollama's description of {model} cannot be read for ceilings: {e}."
    if facts is not None and facts.weights_bytes_estimated:
        notes.append(
            f"Weight bytes ({w.gb(facts.weights_bytes)}) are estimated from the parameter count and "
            f"{facts.quantization or 'the'} quantization's bits per weight."
        )
    if loaded is None and facts is not None:
        notes.append(f"{model} is not loaded right now; the decode ceiling assumes it fits entirely in GPU memory.")

    prefill_pts = _prefill_points(rows)
    decode_pts = _decode_points(rows)
    # (The points are filtered: their rates, prompt and context lengths are known.)
    prompt_lengths = [p.computed_prompt_tokens or 0 for p in prefill_pts]
    context_lengths = [p.decode_context_tokens or 0.0 for p in decode_pts]
    prefill_rates = [p.prefill_tok_s or 0.0 for p in prefill_pts]
    decode_rates = [p.decode_tok_s or 0.0 for p in decode_pts]
    long_prompts = [r for r, n in zip(prefill_rates, prompt_lengths, strict=True) if n >= MIN_PROMPT_TOKENS_FOR_CALIBRATION]
    prefill_median = _median(long_prompts) or _median(prefill_rates)
    long_replies = [
        r
        for r, p in zip(decode_rates, decode_pts, strict=True)
        if (p.output_tokens or 0) - 1 >= MIN_DECODE_INTERVALS_FOR_CALIBRATION
    ]
    decode_median = _median(long_replies) or _median(decode_rates)
    typical_prompt = round(_median(prompt_lengths) or DEFAULT_PROMPT_TOKENS)
    typical_ctx = round(_median(context_lengths) or DEFAULT_CONTEXT_TOKENS)

    spec = hw.spec
    eff: Efficiencies | None = None
    ceilings: Ceilings | None = None
    pre_curve: list[CurvePoint] = []
    dec_curve: list[CurvePoint] = []
    full_curve: list[CurvePoint] = []
    host = hw.host_bandwidth_bytes_s
    if spec is not None and facts is not None:
        start = starting_efficiencies(spec, facts.quantization)
        eff = _calibrate(rows, spec, facts, start, frac, host, hw.bandwidth_bytes_s)
        ceilings = ceilings_for(
            spec, facts, context_tokens=typical_ctx, prompt_tokens=typical_prompt, vram_fraction=frac,
            host_bandwidth_bytes_s=host, efficiencies=eff, bandwidth_bytes_s=hw.bandwidth_bytes_s,
        )  # fmt: skip
        max_prompt = max([*prompt_lengths, facts.context_length or 8192])
        max_ctx = max([*(int(n) for n in context_lengths), facts.context_length or 8192])
        min_prompt = min([*prompt_lengths, 16])
        min_ctx = min([*(int(n) for n in context_lengths), 16])
        pre_curve = prefill_curve(spec, facts, curve_tokens(max_prompt, CURVE_POINTS, max(min_prompt, 1)), efficiencies=eff)
        ctx_tokens = curve_tokens(max_ctx, CURVE_POINTS, max(min_ctx, 1))
        dec_curve = decode_curve(spec, facts, ctx_tokens, vram_fraction=frac, host_bandwidth_bytes_s=host,
                                 efficiencies=eff, bandwidth_bytes_s=hw.bandwidth_bytes_s)  # fmt: skip
        if frac < 1.0:
            full_curve = decode_curve(spec, facts, ctx_tokens, efficiencies=eff, bandwidth_bytes_s=hw.bandwidth_bytes_s)

    pairs: list[tuple[RequestRecord, Phases]] = [(s.record, s.phases) for s in recent]
    events = _interference_on(mine, pairs)
    by_id = {r.id: r for r, _ in pairs}
    interference_sentences = []
    for i in events[:3]:
        agg = by_id.get(i.aggressor_id)
        agg_label = f"a request to {agg.model}" if agg is not None and agg.model != model else "another request"
        interference_sentences.append(describe(i, f"a {model} reply", agg_label))

    diagnosed = []
    energies: list[PhaseEnergy] = []
    for rec in mine:
        ph = phases[rec.id]
        samples = samples_by_id.get(rec.id, [])
        ds = diagnose_request(rec, ph, gpu_samples=samples, loaded=loaded if hw.kind != "cpu" else None, facts=facts, spec=spec,
                              host_bandwidth_bytes_s=host, efficiencies=eff)  # fmt: skip
        diagnosed.append((rec, ds))
        if samples:
            used = energy_for_request(rec, ph, samples)
            if used is not None:
                energies.append(used)
    energy = _aggregate_energy(energies)

    sentences: list[str] = []
    if ceilings is not None:
        sentences = explain_rates(
            ceilings, hardware_name=("simulated " if hw.simulated and "simulated" not in hw.label.lower() else "") + hw.label,
            model_name=model, prefill_tok_s=prefill_median, decode_tok_s=decode_median,
            prompt_tokens=typical_prompt, interference=events,
        )  # fmt: skip
    hw_label = hw.label
    return WhyModel(
        model=model,
        hardware=hw,
        facts=facts,
        facts_error=facts_error,
        loaded=loaded,
        vram_fraction=frac,
        prefill_points=prefill_pts,
        decode_points=decode_pts,
        requests_total=len(rows),
        efficiencies=eff,
        ceilings=ceilings,
        typical_prompt_tokens=typical_prompt,
        typical_context_tokens=typical_ctx,
        prefill_median_tok_s=prefill_median,
        decode_median_tok_s=decode_median,
        prefill_fig=prefill_figure(prefill_pts, pre_curve, eff, model, hw_label),
        decode_fig=decode_figure(decode_pts, dec_curve, full_curve, eff, model, hw_label),
        sentences=sentences,
        interference=events,
        interference_sentences=interference_sentences,
        diagnoses=_group(diagnosed),
        diagnosed_requests=len(diagnosed),
        energy=energy,
        energy_sentence=explain_energy(energy) if energy is not None else None,
        window_requests=len(mine),
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# Lines the page prints


def hardware_line(hw: Hardware) -> str:
    """One line on the hardware and where its bandwidth figure comes from (plain text)."""
    parts = [hw.label + (" (simulated)" if hw.simulated and "simulated" not in hw.label.lower() else "")]
    if hw.spec is not None and hw.kind != "cpu":
        parts.append(f"table row {hw.spec.key}")
    if hw.bandwidth_bytes_s:
        src = ""
        if hw.bandwidth is not None and hw.bandwidth.source == "nvml" and hw.mem_clock_max_mhz and hw.bus_width_bits:
            src = f" (NVML: 2 × {hw.mem_clock_max_mhz:,} MHz × {hw.bus_width_bits} bit ÷ 8)"
        elif hw.bandwidth is not None and hw.bandwidth.source == "table":
            src = " (datasheet)"
        elif hw.kind == "cpu" and hw.host_bandwidth_bytes_s:
            src = " (measured on this machine)"
        parts.append(f"memory bandwidth {w.gb_s(hw.bandwidth_bytes_s)}{src}")
    if hw.spec is not None:
        parts.append(f"{w.tflops(hw.spec.fp16_flops)} dense FP16")
        if hw.kind != "cpu":
            parts.append(f"{hw.spec.memory_bytes / 2**30:.0f} GiB")
    if hw.mem_clock_mhz is not None and hw.mem_clock_max_mhz:
        parts.append(f"memory clock now {hw.mem_clock_mhz:,} of {hw.mem_clock_max_mhz:,} MHz")
    if hw.gpu_count > 1:
        parts.append(f"{hw.gpu_count} GPUs; ceilings for GPU 0")
    return " · ".join(parts)


def facts_line(m: WhyModel) -> str | None:
    f = m.facts
    if f is None:
        return None
    moe = f" ({f.experts_used} of {f.experts} experts per token)" if f.experts and f.experts_used else ""
    parts = [
        f"{m.model}: {f.architecture}",
        f"{f.params / 1e9:.2f} B parameters per token{moe}",
        f"{f.layers} layers",
        f"hidden size {f.hidden:,}",
        f"{w.num(f.kv_heads)} KV heads × {f.head_dim}",
        f.quantization or "quantization unknown",
        f"weights {w.gb(f.weights_bytes)}" + (" (estimated)" if f.weights_bytes_estimated else ""),
        f"KV cache {f.kv_bytes_per_token / 1024:,.0f} KiB per token",
    ]
    if m.loaded is not None:
        in_ram = m.loaded.size_bytes - m.loaded.size_vram_bytes
        where = "all in GPU memory" if in_ram <= 0 else f"{w.pct(1 - m.vram_fraction)} ({w.gb(in_ram)}) in system memory"
        parts.append(f"loaded: {w.gb(m.loaded.size_bytes)}, {where}")
    return " · ".join(parts)

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
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from analysis import wording as w
from analysis.accelerator import Hardware
from analysis.ceilings import (
    MIN_RATE_TOKENS,
    Ceilings,
    CurvePoint,
    Efficiencies,
    curve_tokens,
)
from analysis.diagnose import CODES, DecodeUse, Diagnosis, DiagnosisCode, Severity, decode_use, explain_decode_use
from analysis.doubt import Doubt
from analysis.energy import PhaseEnergy, energy_for_request
from analysis.explain import ThinkingReply, explain_embeddings, explain_energy, explain_rates, explain_thinking_replies
from analysis.hardware import HardwareSpec
from analysis.interference import Interference, describe, find_interference
from analysis.model_facts import ModelFacts, is_embedding_model
from analysis.model_names import is_cloud, same_model
from analysis.phases import Phases
from analysis.records import (
    GpuSample,
    InstalledModel,
    LoadedModel,
    Outcome,
    RequestKind,
    RequestRecord,
    RunnerFlags,
)
from analysis.runner_load_words import PlacementInUse, describe_layers
from analysis.runner_wait_tasks import TaskWaits
from analysis.story import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    EmbedStory,
    Reading,
    Status,
    Story,
    embed_story,
    plain_readings,
)
from analysis.wait_split import Neighbours, WaitSplit
from pages.shared import fmt
from pages.shared.basis import (
    BasisReads,
    ModelBasis,
    judged_readings,
    latest_gpus,
    model_basis,
    rate_samples,
    read_basis,
    speeds_of,
)
from pages.shared.slot_count import num_parallel_setting
from pages.shared.window import ModelWindow, model_window
from pages.why.figures import decode_figure, flagged_note, prefill_figure
from store import queries, sample_queries
from store.queries import StoredRequest
from store.tables import OllamaSettingRow, RequestSummary

FRESH_GPU_S = 60.0  # a GPU sample this recent says which GPU reports to this dashboard now
RECENT_LIMIT = 400  # records (with token times) for interference, within the sidebar window
DIAGNOSE_LIMIT = 100  # newest finished requests of the model that get diagnosed
CURVE_POINTS = 60


_open = queries.open_reader  # None while there is no store yet


# ---------------------------------------------------------------------------------------------
# The page's model


@dataclass(frozen=True)
class DiagnosisGroup:
    code: DiagnosisCode
    what: str  # what the diagnosis means, in general
    severity: Severity
    requests: int  # how many of the diagnosed requests had it
    latest: str  # the newest request's sentence, with its numbers
    numbers: dict[str, float] = field(default_factory=dict)  # the newest request's figures, unformatted
    by_request: dict[str, dict[str, float]] = field(default_factory=dict)  # every request's figures, by request id


@dataclass
class WhyModel:
    model: str
    hardware: Hardware
    facts: ModelFacts | None
    facts_error: str | None  # why there are no facts (not fetched yet, or unreadable)
    loaded: LoadedModel | None
    runner: RunnerFlags | None  # the settings its runner was started with, when its command line was read
    vram_fraction: float  # the share of the model on the GPU the ceilings use (``placement`` says from where)
    prefill_points: list[Reading]  # one per request with a prefill rate, flagged or not
    decode_points: list[Reading]  # one per request with a decode rate
    requests_total: int  # finished requests of this model in the window: the charts' points
    efficiencies: Efficiencies | None
    ceilings: Ceilings | None  # at the typical prompt and context
    typical_prompt_tokens: int
    typical_context_tokens: int
    prefill_median_tok_s: float | None  # readings that count only
    decode_median_tok_s: float | None
    figures: Callable[[], tuple[go.Figure, go.Figure]]  # the prefill and decode charts, built when first drawn
    story: Story | None  # the ceiling model and the readings set against it (None without GPU spec or model facts)
    ubatch_tokens: int
    prefill_note: str | None  # what the prefill chart draws apart (flagged, too short)
    decode_note: str | None
    sentences: list[str]  # explain_rates: the ratio first, then the plain explanation
    interference: list[Interference]  # significant events where this model's reply was slowed
    interference_sentences: list[str]
    diagnoses: list[DiagnosisGroup]
    diagnosed_requests: int
    energy: PhaseEnergy | None
    energy_sentence: str | None
    window_requests: int  # this model's finished requests in the sidebar window
    window: ModelWindow | None = None  # every number of the page comes from the requests of this window
    viewer_note: str | None = None  # the machine viewing the page is not the one the readings ran on
    notes: list[str] = field(default_factory=list)
    # Embedding requests: prefill-only work, drawn apart on the prefill chart, kept out of medians and calibration.
    embed_points: list[Reading] = field(default_factory=list)
    embed: EmbedStory | None = None
    embed_sentence: str | None = None
    facts_read_at_unix_s: float | None = None  # when the collector stored the /api/show the facts come from
    gpu_mem_total_bytes: int | None = None  # the latest GPU sample's memory (the what-if's free memory)
    gpu_mem_used_bytes: int | None = None
    placement: PlacementInUse | None = None  # where the model sits, from the runner's own words or /api/ps
    doubts: list[Doubt] = field(default_factory=list)  # inputs most readings contradict (analysis.doubt)
    server_settings: list[OllamaSettingRow] = field(default_factory=list)  # Ollama's start lines (its log)

    @cached_property
    def _figures_built(self) -> tuple[go.Figure, go.Figure]:
        # The page shows the medians before the charts: building the charts of 5,000 readings (~0.3 s) waits
        # until the medians are on screen.
        return self.figures()

    @property
    def prefill_fig(self) -> go.Figure:
        return self._figures_built[0]

    @property
    def decode_fig(self) -> go.Figure:
        return self._figures_built[1]

    @property
    def ratio(self) -> float | None:
        if self.prefill_median_tok_s and self.decode_median_tok_s:
            return self.prefill_median_tok_s / self.decode_median_tok_s
        return None

    @property
    def expected_ratio(self) -> float | None:
        """The prior's prefill ÷ decode (first principles, never fitted) over the same prompt lengths and contexts as
        the measured readings: what the measured ratio is compared with."""
        return self.story.prior_ratio if self.story is not None else None

    @property
    def simulated(self) -> bool:
        return self.hardware.simulated


def model_choices(db: Path) -> list[str] | None:
    """Models with recorded requests (newest first), then loaded ones; None when there is no store."""
    with _open(db) as conn:
        return None if conn is None else queries.model_choices(conn)


@dataclass(frozen=True)
class PreviewChoices:
    """The installed models the preview offers (before any request), and the one it starts on."""

    offered: list[InstalledModel]  # generation models, as Ollama lists them (newest first)
    embedding: list[str]  # embedding models left out: decode does not apply to them
    default: str | None  # the loaded one, else the largest that fits the GPU's memory, else the first
    memory_bytes: int | None  # the GPU memory the default was fitted into (None: not known)
    cloud: list[str] = field(default_factory=list)  # cloud models left out: they run on ollama.com, not on this GPU


def default_preview_model(offered: Sequence[InstalledModel], loaded: Sequence[str], memory_bytes: int | None) -> str | None:
    """The loaded model if one is offered, else the largest that fits ``memory_bytes``, else the first."""
    for m in offered:
        if any(same_model(m.name, n) for n in loaded):
            return m.name
    fits = [m for m in offered if m.size_bytes is not None and memory_bytes is not None and m.size_bytes <= memory_bytes]
    if fits:
        return max(fits, key=lambda m: m.size_bytes or 0).name
    return offered[0].name if offered else None


def preview_choices(db: Path, picked: HardwareSpec | None, now_unix_s: float | None = None) -> PreviewChoices | None:
    """Installed models (/api/tags) for the preview; None when there is no store.

    ``picked``: a GPU picked from the hardware table (its memory), else the newest sample's memory total.
    """
    now = time.time() if now_unix_s is None else now_unix_s
    with _open(db) as conn:
        if conn is None:
            return None
        installed = queries.installed_models(conn)
        shows = {r.digest: r for r in queries.model_infos(conn)}
        loaded = [m.name for m in queries.latest_loaded_models(conn)]
        gpus = [] if picked is not None else latest_gpus(conn, now)
    offered: list[InstalledModel] = []
    embedding: list[str] = []
    cloud: list[str] = []
    for m in installed:
        if is_cloud(m.name):  # its listed size is a manifest's, and it never runs here: no ceiling of this GPU
            cloud.append(m.name)
            continue
        # Older Ollama lists no capabilities in /api/tags; /api/show has them (parsed only then).
        info = shows.get(m.digest) if not m.capabilities else None
        caps = m.capabilities or (info.show.get("capabilities") if info is not None else None) or ()
        if is_embedding_model(m.family, [c for c in caps if isinstance(c, str)]):
            embedding.append(m.name)
        else:
            offered.append(m)
    memory = picked.memory_bytes if picked is not None else (gpus[0].mem_total_bytes if gpus else None)
    memory_bytes = int(memory) if memory else None
    return PreviewChoices(offered, embedding, default_preview_model(offered, loaded, memory_bytes), memory_bytes, cloud)


def _summed(pairs: Sequence[tuple[float, int]]) -> tuple[float | None, int | None, float | None]:
    """(joules, tokens, joules per token) over (joules, tokens) pairs; all None when there is none."""
    if not pairs:
        return None, None, None
    joules, tokens = sum(j for j, _ in pairs), sum(n for _, n in pairs)
    return joules, tokens or None, joules / tokens if tokens else None


def _aggregate_energy(parts: Sequence[PhaseEnergy]) -> PhaseEnergy | None:
    """Joules summed over requests, divided by the tokens they covered: a per-token figure for the model."""
    pre = [(e.prefill_j, e.prompt_tokens_computed) for e in parts if e.prefill_j is not None and e.prompt_tokens_computed]
    dec = [(e.decode_j, e.output_intervals) for e in parts if e.decode_j is not None and e.output_intervals]
    if not pre and not dec:
        return None
    pre_j, pre_n, pre_per = _summed(pre)
    dec_j, dec_n, dec_per = _summed(dec)
    methods = {e.method for e in parts if e.method}
    return PhaseEnergy(
        prefill_j=pre_j,
        decode_j=dec_j,
        prompt_tokens_computed=pre_n,
        output_intervals=dec_n,
        j_per_prompt_token=pre_per,
        j_per_output_token=dec_per,
        method=methods.pop() if len(methods) == 1 else "mixed",
        coarse=any(e.coarse for e in parts),
    )


def _group(diagnosed: Sequence[tuple[RequestRecord, list[Diagnosis]]]) -> list[DiagnosisGroup]:
    counts: Counter[DiagnosisCode] = Counter()
    latest: dict[DiagnosisCode, tuple[float, str, Severity, dict[str, float]]] = {}
    by_request: dict[DiagnosisCode, dict[str, dict[str, float]]] = {}
    for rec, ds in diagnosed:
        for d in {d.code: d for d in ds}.values():
            counts[d.code] += 1
            by_request.setdefault(d.code, {})[rec.id] = dict(d.numbers)
            if d.code not in latest or rec.started_at_unix_s > latest[d.code][0]:
                latest[d.code] = (rec.started_at_unix_s, d.sentence, d.severity, dict(d.numbers))
    groups = [
        DiagnosisGroup(code, CODES[code], latest[code][2], n, latest[code][1], latest[code][3], by_request[code])
        for code, n in counts.items()
    ]
    groups.sort(key=lambda g: (g.severity != Severity.WARNING, -g.requests, g.code))
    return groups


def _interference_on(victims: Sequence[RequestRecord], pairs: Sequence[tuple[RequestRecord, Phases]]) -> list[Interference]:
    """Significant slowdowns of ``victims``' replies by any request's prefill, worst first.

    ``find_interference`` compares every gap of every record with every prefill; here only
    the victims keep their token times and only prefills inside a victim's stream are
    offered, which keeps a busy window to milliseconds instead of minutes.
    """
    windows = [
        (ph.prefill_start_ns, ph.decode_start_ns, rec, ph)
        for rec, ph in pairs
        if ph.prefill_start_ns is not None and ph.decode_start_ns is not None
    ]
    by_id = {rec.id: ph for rec, ph in pairs}
    out: list[Interference] = []
    for victim in victims:
        ts = victim.token_chunk_ns
        if len(ts) < 3 or victim.id not in by_id:
            continue
        others = [
            (replace(rec, token_chunk_ns=[]), ph)
            for w0, w1, rec, ph in windows
            if rec.id != victim.id and w0 is not None and w1 is not None and w0 < ts[-1] and w1 > ts[0]
        ]
        if others:
            found = find_interference([(victim, by_id[victim.id]), *others])
            out += [i for i in found if i.significant and i.victim_id == victim.id]
    out.sort(key=lambda i: i.extra_ms_total, reverse=True)
    return out


@dataclass
class _StoreReads(BasisReads):
    """What one Why view reads from the store, in one read-only connection: the model's basis and more."""

    recent: list[StoredRequest] = field(default_factory=list)  # requests of the window, with token times and phases
    mine: list[RequestRecord] = field(default_factory=list)  # the model's finished requests of the window, to diagnose
    samples_by_id: dict[str, list[GpuSample]] = field(default_factory=dict)
    server_settings: list[OllamaSettingRow] = field(default_factory=list)
    waits_by_id: dict[str, TaskWaits] = field(default_factory=dict)  # the runner's own waits before each prompt
    viewer_gpus: list[GpuSample] = field(default_factory=list)  # the GPUs reporting to this dashboard now

    @cached_property
    def neighbours(self) -> Neighbours:
        """The recent requests' intervals, read once for every diagnosed request's wait split."""
        return Neighbours([(s.record, s.phases) for s in self.recent])


def _read_store(conn: sqlite3.Connection, model: str, now: float, window_s: float) -> _StoreReads:
    basis = read_basis(conn, model, now, window_s)
    # Their phases as stored at write time (re-derived by the collector when the split changes).
    recent = [
        s
        for s in queries.requests_in_window(conn, now - window_s, now, with_tokens=True, limit=RECENT_LIMIT)
        if s.record.metrics is not None
    ]
    mine = [s.record for s in recent if s.record.model == model and s.record.outcome is Outcome.OK][-DIAGNOSE_LIMIT:]
    samples_by_id: dict[str, list[GpuSample]] = {}
    if basis.gpus:
        for rec in mine:
            end_ns = rec.closed_ns or rec.final_chunk_ns or rec.received_ns
            samples_by_id[rec.id] = sample_queries.gpu_samples(conn, rec.started_at_unix_s - 2, rec.wall_s(end_ns) + 2)
    return _StoreReads(
        **vars(basis),
        waits_by_id=queries.request_waits(conn, [r.id for r in mine]),
        recent=recent,
        mine=mine,
        samples_by_id=samples_by_id,
        server_settings=queries.ollama_settings(conn),
        viewer_gpus=_fresh_gpus(conn, time.time()),
    )


def _fresh_gpus(conn: sqlite3.Connection, wall_unix_s: float) -> list[GpuSample]:
    latest: dict[int, GpuSample] = {}
    for s in sample_queries.gpu_samples(conn, wall_unix_s - FRESH_GPU_S, wall_unix_s + 5):
        latest[s.index] = s
    return [latest[i] for i in sorted(latest)]


def viewer_note(hw: Hardware, ran_on: Sequence[GpuSample], viewer: Sequence[GpuSample]) -> str | None:
    """A sentence when the GPU the readings ran on is not the one reporting to this dashboard now (a copied data
    folder, a stopped collector): the ceilings stay those of the readings' hardware."""
    then = ran_on[0].name if ran_on else None
    now = viewer[0].name if viewer else None
    if then == now:
        return None
    when = f" (its samples up to {fmt.clock(ran_on[0].ts_unix_s)})" if ran_on else ""
    here = f"{now} reports to this dashboard now" if now else "no GPU reports to this dashboard now"
    ran = f"These readings ran on {then}{when}" if then else "These readings ran without a GPU sample of their time"
    return f"{ran}; {here}. Every ceiling here is that of the hardware the readings ran on, not of the machine viewing them."


@dataclass
class _Curves:
    """The measured points and the ceiling/expected lines of both charts (and the story when there are ceilings)."""

    story: Story | None
    embeds: EmbedStory | None
    prefill_r: list[Reading]
    decode_r: list[Reading]
    embed_r: list[Reading]
    pre_curve: list[CurvePoint] = field(default_factory=list)
    dec_curve: list[CurvePoint] = field(default_factory=list)
    full_curve: list[CurvePoint] = field(default_factory=list)
    pre_prior: list[CurvePoint] = field(default_factory=list)  # the prior's expected line, when calibration replaced it
    dec_prior: list[CurvePoint] = field(default_factory=list)


def _curves(reads: BasisReads, basis: ModelBasis, facts: ModelFacts | None, frac: float) -> _Curves:
    """The charts' points (``judged_readings``: the readings every page reads speeds from) and lines from the basis's
    story (plain readings without one)."""
    story = basis.story
    embed_samples = rate_samples(reads.judged)[1]
    if story is None or facts is None:
        prefill_r, decode_r = judged_readings(basis, reads)
        return _Curves(None, None, prefill_r, decode_r, plain_readings(embed_samples)[0])
    embeds = embed_story(story.model, embed_samples)
    out = _Curves(story, embeds, story.prefill, story.decode, embeds.readings if embeds is not None else [])
    prompt_lengths = [r.tokens for r in (*out.prefill_r, *out.embed_r)]
    context_lengths = [r.tokens for r in out.decode_r]
    max_prompt = max([*prompt_lengths, facts.context_length or 8192])
    max_ctx = max([*context_lengths, facts.context_length or 8192])
    min_prompt = max(min([*prompt_lengths, 16]), 1)
    min_ctx = max(min([*context_lengths, 16]), 1)
    # The stated prompt length and context are points of the lines, so the sentences' ceilings are on the chart.
    stated = {story.typical_prompt_tokens} | ({embeds.typical_prompt_tokens} if embeds is not None else set())
    pre_tokens = sorted({*curve_tokens(max_prompt, CURVE_POINTS, min_prompt), *stated})
    ctx_tokens = sorted({*curve_tokens(max_ctx, CURVE_POINTS, min_ctx), story.typical_context_tokens})
    out.pre_curve = story.model.prefill_curve(pre_tokens)
    out.dec_curve = story.model.decode_curve(ctx_tokens)
    if frac < 1.0:
        out.full_curve = story.model.decode_curve(ctx_tokens, all_in_vram=True)
    if story.prior_model is not None:
        out.pre_prior = story.prior_model.prefill_curve(pre_tokens)
        out.dec_prior = story.prior_model.decode_curve(ctx_tokens)
    return out


def _figures(
    curves: _Curves, eff: Efficiencies | None, model: str, hardware_label: str, ubatch: int
) -> tuple[go.Figure, go.Figure]:
    prior_eff = curves.story.prior_model.efficiencies if curves.story and curves.story.prior_model else None
    pre_prior = (curves.pre_prior, prior_eff) if prior_eff is not None else None
    dec_prior = (curves.dec_prior, prior_eff) if prior_eff is not None else None
    prefill = prefill_figure(
        curves.prefill_r, curves.pre_curve, eff, model, hardware_label, ubatch, embed=curves.embed_r, prior=pre_prior
    )
    decode = decode_figure(curves.decode_r, curves.dec_curve, curves.full_curve, eff, model, hardware_label, prior=dec_prior)
    return prefill, decode


def _interference_sentences(
    model: str, events: Sequence[Interference], pairs: Sequence[tuple[RequestRecord, Phases]]
) -> list[str]:
    by_id = {r.id: (r, ph) for r, ph in pairs}
    out = []
    for i in events[:3]:
        agg, agg_ph = by_id.get(i.aggressor_id, (None, None))
        agg_label = f"a request to {agg.model}" if agg is not None and agg.model != model else "another request"
        sentence = describe(i, f"a {fmt.label(model)} reply", agg_label)
        if agg is not None and agg_ph is not None and agg_ph.prefill_start_ns is not None:
            # When its prompt was read: two long prompts of one length read alike, and only the time tells them apart.
            sentence = f"{fmt.clock(agg.wall_s(agg_ph.prefill_start_ns))} · {sentence}"
        out.append(sentence)
    return out


def _diagnose(reads: _StoreReads, basis: ModelBasis) -> tuple[list[tuple[RequestRecord, list[Any]]], PhaseEnergy | None]:
    """Each finished request of the window diagnosed from the basis (as the Requests detail does), and the energy
    its phases used where GPU samples exist."""
    phases = {s.record.id: s.phases for s in reads.recent}
    diagnosed = []
    energies: list[PhaseEnergy] = []
    for rec in reads.mine:
        ph = phases[rec.id]
        gpu_s = reads.samples_by_id.get(rec.id, [])
        ds = basis.diagnose(rec, ph, gpu_samples=gpu_s, waits=reads.waits_by_id.get(rec.id), split=_split(rec, ph, reads))
        diagnosed.append((rec, ds))
        if gpu_s:
            used = energy_for_request(rec, ph, gpu_s)
            if used is not None:
                energies.append(used)
    return diagnosed, _aggregate_energy(energies)


def _split(rec: RequestRecord, ph: Phases, reads: _StoreReads) -> WaitSplit:
    """This request's time among queue, the runner's own wait and other requests' prefills (analysis.wait_split),
    the slot count from the runner's command line, else its own log line (unknown: no queue is told)."""
    waits = reads.waits_by_id.get(rec.id)
    slots = reads.runner.parallel if reads.runner is not None and reads.runner.parallel else None
    if slots is None and waits is not None:
        slots = waits.n_slots
    if slots is None:
        slots = num_parallel_setting(reads.server_settings)
    named = waits is not None and bool(waits.before_prefill())
    return reads.neighbours.split(rec, ph, n_slots=slots, runner_named=named)


def _decode_use(reads: _StoreReads) -> DecodeUse | None:
    phases = {s.record.id: s.phases for s in reads.recent}
    return decode_use([(rec, phases[rec.id]) for rec in reads.mine if rec.id in phases], reads.samples_by_id)


def _rate_sentences(
    story: Story,
    rows: Sequence[RequestSummary],
    hw: Hardware,
    model: str,
    ubatch_source: str,
    events: list[Interference],
    use: DecodeUse | None = None,
    eff: Efficiencies | None = None,
) -> list[str]:
    # Replies that thought: thinking is decode work, and the first answer token comes after it.
    gens = [r for r in rows if r.kind is RequestKind.GENERATE]
    thought = [
        ThinkingReply(r.thinking_tokens, r.output_tokens, r.thinking_s, r.ttft_s, r.ttfa_s) for r in gens if r.thinking_tokens
    ]
    thinking = explain_thinking_replies(thought, len(gens), story.ceilings, model)
    out = explain_rates(
        story,
        hardware_name=("simulated " if hw.simulated and "simulated" not in hw.label.lower() else "") + hw.label,
        model_name=model,
        ubatch_source=ubatch_source,
        interference=events,
        thinking=thinking,
    )
    if use is not None and not hw.simulated and len(out) >= 2:
        # Direct evidence on decode, after the decode sentence and the thinking sentence that follows it (if any).
        at = 3 if thinking is not None and len(out) >= 3 and out[2] == thinking else 2
        out.insert(at, explain_decode_use(use, eff))
    return out


def build_why(
    db: Path,
    model: str,
    now_unix_s: float | None = None,
    window_s: float = 300.0,
    *,
    preview: tuple[HardwareSpec | None, ModelFacts | None] | None = None,
) -> WhyModel | None:
    """Everything the Why page shows for ``model``; None when there is no store.

    ``preview`` (before any request: a GPU picked from the table, or None for the detected one, and the
    facts of a model, or None for ``model``'s stored /api/show as for any model) explains from the ceilings alone.

    ``window_s`` (the sidebar's window) bounds every number: medians, charts, readings counted, diagnoses,
    interference and energy come from the requests of one window (``model_window``: moved to the last period with
    activity when it holds none), judged against the GPU of their time; the calibration alone is fitted on every
    stored request of the model. The host's
    memory bandwidth (where it matters: no GPU, or part of the model in system memory)
    is the collector's stored measurement, and so is the Apple chip (the collector reads it, not the page);
    every phase is the one stored with its request.
    """
    with _open(db) as conn:
        if conn is None:
            return None
        win = model_window(conn, model, time.time() if now_unix_s is None else now_unix_s, window_s)
        reads = _read_store(conn, model, win.end_unix_s, window_s)
    picked_hw, picked_facts = preview if preview is not None else (None, None)
    basis = model_basis(model, reads, picked_hw=picked_hw, picked_facts=picked_facts)
    hw, frac, facts, notes, doubts = basis.hardware, basis.gpu_fraction, basis.facts, basis.notes, basis.doubts
    ubatch, ubatch_source = basis.ubatch_tokens, basis.ubatch_source
    curves = _curves(reads, basis, facts.facts, frac)
    speeds = speeds_of(curves.prefill_r, curves.decode_r)  # as Lab and the report read them
    story = curves.story
    eff = basis.efficiencies
    pairs: list[tuple[RequestRecord, Phases]] = [(s.record, s.phases) for s in reads.recent]
    events = _interference_on(reads.mine, pairs)
    diagnosed, energy = _diagnose(reads, basis)
    embeds = curves.embeds
    return WhyModel(
        model=model,
        hardware=hw,
        facts=facts.facts,
        facts_error=facts.error,
        loaded=reads.loaded,
        runner=reads.runner,
        server_settings=reads.server_settings,
        vram_fraction=frac,
        prefill_points=curves.prefill_r,
        decode_points=curves.decode_r,
        requests_total=len(reads.judged),
        efficiencies=eff,
        ceilings=story.ceilings if story is not None else None,
        typical_prompt_tokens=story.typical_prompt_tokens if story is not None else DEFAULT_PROMPT_TOKENS,
        typical_context_tokens=story.typical_context_tokens if story is not None else DEFAULT_CONTEXT_TOKENS,
        prefill_median_tok_s=speeds.prefill_tok_s,
        decode_median_tok_s=speeds.decode_tok_s,
        figures=partial(_figures, curves, eff, model, hw.label, ubatch),
        story=story,
        ubatch_tokens=ubatch,
        prefill_note=flagged_note("prefill", curves.prefill_r),
        decode_note=flagged_note("decode", curves.decode_r),
        sentences=_rate_sentences(story, reads.judged, hw, model, ubatch_source, events, _decode_use(reads), eff)
        if story is not None
        else [],
        interference=events,
        interference_sentences=_interference_sentences(model, events, pairs),
        diagnoses=_group(diagnosed),
        diagnosed_requests=len(diagnosed),
        energy=energy,
        energy_sentence=explain_energy(energy) if energy is not None else None,
        window_requests=len(reads.mine),
        window=win,
        viewer_note=viewer_note(hw, reads.gpus, reads.viewer_gpus) if preview is None else None,
        notes=[*notes, *cloud_notes(model)],
        embed_points=curves.embed_r,
        embed=embeds,
        embed_sentence=explain_embeddings(embeds) if embeds is not None else None,
        facts_read_at_unix_s=facts.read_at_unix_s,
        gpu_mem_total_bytes=reads.gpus[0].mem_total_bytes if reads.gpus else None,
        gpu_mem_used_bytes=reads.gpus[0].mem_used_bytes if reads.gpus else None,
        placement=reads.placement,
        doubts=doubts,
    )


# ---------------------------------------------------------------------------------------------
# Lines the page prints


def cloud_notes(model: str) -> list[str]:
    """A cloud model's requests ran on ollama.com: said, since no figure of this machine judges them."""
    if not is_cloud(model):
        return []
    return [
        f"{model} is a cloud model: it runs on ollama.com, not on this machine, so none of its requests is set against"
        " this machine's ceilings or counted in its rates; the Requests page keeps their tokens and the client's times."
    ]


def hardware_line(hw: Hardware) -> str:
    """One line on the hardware and where its bandwidth figure comes from (plain text)."""
    parts = [hw.label + (" (simulated)" if hw.simulated and "simulated" not in hw.label.lower() else "")]
    if hw.spec is not None and hw.kind != "cpu":
        parts.append(f"table row {hw.spec.key}")
    if hw.bandwidth_bytes_s:
        src = ""
        if hw.bandwidth is not None and hw.bandwidth.source == "nvml" and hw.mem_clock_max_mhz and hw.bus_width_bits:
            src = f" (NVML: 2 × {fmt.count(hw.mem_clock_max_mhz)} MHz × {hw.bus_width_bits} bit ÷ 8)"
        elif hw.bandwidth is not None and hw.bandwidth.source == "table":
            src = " (datasheet)"
        elif hw.kind == "cpu" and hw.host_bandwidth_bytes_s:
            src = " (measured on this machine)"
        parts.append(f"memory bandwidth {w.gb_s(hw.bandwidth_bytes_s)}{src}")
    if hw.spec is not None:
        parts.append(f"{w.tflops(hw.spec.fp16_flops)} dense FP16")
        if hw.kind != "cpu":
            parts.append(f"{w.gb(hw.spec.memory_bytes)} of memory")
    if hw.mem_clock_mhz is not None and hw.mem_clock_max_mhz:
        parts.append(f"memory clock now {fmt.count(hw.mem_clock_mhz)} of {fmt.count(hw.mem_clock_max_mhz)} MHz")
    if hw.gpu_count > 1:
        parts.append(f"{hw.gpu_count} GPUs; ceilings for GPU 0")
    return " · ".join(parts)


def facts_line(m: WhyModel) -> str | None:
    f = m.facts
    if f is None:
        return None
    moe = f" ({f.experts_used} of {f.experts} experts per token)" if f.experts and f.experts_used else ""
    parts = [
        f"{fmt.label(m.model)}: {f.architecture}",
        f"{f.params / 1e9:.2f} B parameters per token{moe}",
        f"{f.layers} layers",
        f"hidden size {fmt.count(f.hidden)}",
        f"{w.count(f.kv_heads) if float(f.kv_heads).is_integer() else w.num(f.kv_heads)} KV heads × {f.head_dim}",
        f.quantization or "quantization unknown",
        f"weights {w.gb(f.weights_bytes)}" + (" (estimated)" if f.weights_bytes_estimated else ""),
        f"KV cache {w.gb(f.kv_bytes_per_token)} per token",
    ]
    p = m.placement
    if p is not None and p.from_runner and p.runner is not None:
        parts.append(f"loaded: {placement_words(p)}")
    elif m.loaded is not None:
        in_ram = m.loaded.size_bytes - m.loaded.size_vram_bytes
        share = in_ram / m.loaded.size_bytes if m.loaded.size_bytes > 0 else 0.0
        where = "all in GPU memory" if in_ram <= 0 else f"{w.pct(share)} ({w.gb(in_ram)}) in system memory"
        parts.append(f"loaded: {w.gb(m.loaded.size_bytes)}, {where} (Ollama's /api/ps)")
    return " · ".join(parts)


def placement_words(p: PlacementInUse) -> str:
    """Where the runner put the model, in its own figures: layers per device and each GPU's buffers."""
    r = p.runner
    if r is None:
        return ""
    sizes = []
    for d in r.devices:
        buffers = [
            (what, b) for what, b in (("weights", d.model_bytes), ("KV cache", d.kv_bytes), ("compute", d.compute_bytes)) if b
        ]
        if buffers:
            sizes.append(f"{d.device} " + ", ".join(f"{what} {w.mib(b)}" for what, b in buffers))
    if r.host_model_bytes:
        sizes.append(f"system memory weights {w.mib(r.host_model_bytes)}")
    return f"{describe_layers(r)}" + (f" ({'; '.join(sizes)})" if sizes else "") + ", from the runner's own load lines"


# ---------------------------------------------------------------------------------------------
# The story as data: what ``python -m pages.why --json`` prints, from the same view-model the page draws


EXCLUDED_REASONS: dict[Status, str] = {
    Status.TINY: f"timed over fewer than {MIN_RATE_TOKENS} tokens",
    Status.IMPOSSIBLE: "above the hardware's ceiling for it: a reading that cannot be true",
}


def _held_out_json(story: Story | None, kind: str) -> dict[str, Any] | None:
    h = story.held_out_error(kind) if story is not None else None
    if h is None:
        return None
    return {"readings": h.readings, "median_abs_error": h.median_abs_error, "max_abs_error": h.max_abs_error}


def _rates_json(m: WhyModel, kind: str) -> dict[str, Any]:
    """One kind's readings: measured (the counted median), the prior (first principles, never fitted), the model
    calibrated on the user's readings with its error on readings it was not fitted on, and what was left out."""
    story = m.story
    pre = kind == "prefill"
    points = m.prefill_points if pre else m.decode_points
    excluded = Counter(r.status for r in points if r.status is not Status.COUNTED)
    prior = (story.prior_prefill_tok_s if pre else story.prior_decode_tok_s) if story else None
    return {
        "expected_tok_s": prior,  # the headline's expectation: the prior
        "prior_tok_s": prior,
        "calibrated_tok_s": (story.expected_prefill_tok_s if pre else story.expected_decode_tok_s) if story else None,
        "calibrated_held_out_error": _held_out_json(story, kind),
        "measured_tok_s": m.prefill_median_tok_s if pre else m.decode_median_tok_s,  # the median of the readings counted
        "readings_counted": sum(r.status is Status.COUNTED for r in points),
        "readings_excluded": [
            {"reason": EXCLUDED_REASONS.get(status, str(status)), "status": str(status), "count": n}
            for status, n in sorted(excluded.items())
        ],
    }


def _window_json(win: ModelWindow | None) -> dict[str, Any] | None:
    if win is None:
        return None
    return {"start_unix_s": win.start_unix_s, "end_unix_s": win.end_unix_s, "length_s": win.length_s, "moved": win.moved}


def why_json(m: WhyModel) -> dict[str, Any]:
    """The Why page's story as plain data: placement, the prefill and decode readings against what was expected, and
    the verdicts with their counts, sentences and figures (None where not known, never 0)."""
    p = m.placement
    devices: list[dict[str, Any]] = []
    if p is not None and p.runner is not None:
        devices = [
            {
                "name": d.device,
                "description": d.description,
                "layers": d.layers,
                "layers_estimated": d.layers_estimated,
                "bytes": {"model": d.model_bytes, "kv": d.kv_bytes, "compute": d.compute_bytes},
                "free_bytes_at_load": d.free_bytes_at_load,
                "total_bytes": d.total_bytes,
            }
            for d in p.runner.devices
        ]
        if p.runner.host_model_bytes or p.runner.host_kv_bytes:
            devices.append(
                {"name": "CPU", "description": "system memory", "layers": None, "layers_estimated": False,
                 "bytes": {"model": p.runner.host_model_bytes, "kv": p.runner.host_kv_bytes, "compute": None},
                 "free_bytes_at_load": None, "total_bytes": None}
            )  # fmt: skip
    return {
        "model": m.model,
        "hardware": hardware_line(m.hardware),
        "placement": {
            "gpu_fraction": m.vram_fraction,
            "source": p.source if p is not None else None,
            "layers_offloaded": p.runner.layers_offloaded if p is not None and p.runner is not None else None,
            "layers_total": p.runner.layers_total if p is not None and p.runner is not None else None,
            "devices": devices,
            "api_ps_gpu_fraction": p.ps_fraction if p is not None else None,
            "disagreement": p.disagreement if p is not None else None,
        },
        "window": _window_json(m.window),
        "viewer_note": m.viewer_note,
        "prefill": _rates_json(m, "prefill"),
        "decode": _rates_json(m, "decode"),
        "ratio": {"measured": m.ratio, "prior": m.expected_ratio},
        "verdicts": [
            {
                "code": g.code,
                "severity": str(g.severity),
                "count": g.requests,
                "what": g.what,
                "text": g.latest,
                "numbers": g.numbers,
                "by_request": g.by_request,
            }
            for g in m.diagnoses
        ],
        "doubts": [{"kind": d.kind, "contradicted": d.contradicted, "text": d.text} for d in m.doubts],
        "sentences": m.sentences,
        "notes": m.notes,
        "requests": {"judged": m.requests_total, "in_window": m.window_requests, "diagnosed": m.diagnosed_requests},
    }

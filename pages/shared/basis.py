"""What every page explains a model's rates from, read and computed once: where the model sits (the runner's own
load lines first, ``/api/ps`` otherwise, with the source and any disagreement), the GPU and its bandwidth, the
model's facts, the micro-batch, the decode model with its fixed cost per token calibrated from the user's readings
(docs/physics.md §5), and the inputs the readings contradict (``analysis.doubt``, docs/physics.md §11).

Why, Requests and Live all ask ``ModelBasis``, so the ceiling a sentence names is the one in the chart and the one
a diagnosis is computed from. No Streamlit; the store is read by the caller's connection.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from analysis import wording as w
from analysis.accelerator import Hardware, HardwareKind, resolve_hardware
from analysis.ceilings import CeilingModel, Ceilings, Efficiencies, ollama_num_batch, starting_efficiencies
from analysis.diagnose import Diagnosis, DiagnosisCode, diagnose_request
from analysis.doubt import PLACEMENT, Doubt, doubt_inputs
from analysis.hardware import HardwareSpec, match_gpu
from analysis.model_facts import ModelFacts, ModelFactsError, model_facts_from_show
from analysis.model_names import is_cloud
from analysis.phases import Phases
from analysis.records import (
    UNIFIED_MEMORY_KINDS,
    UNIFIED_MEMORY_NOTE,
    CollectorInfo,
    GpuSample,
    HostBandwidth,
    LoadedModel,
    RequestKind,
    RequestRecord,
    RunnerFlags,
)
from analysis.runner_load_words import SOURCE_ASSUMED, PlacementInUse, describe_layers, placement_in_use
from analysis.runner_wait_tasks import TaskWaits
from analysis.story import RateSample, Reading, Status, Story, build_story, counted_median, plain_readings
from analysis.wait_split import WaitSplit
from pages.shared import fmt
from pages.shared.window import ModelWindow, model_window
from store import queries, sample_queries
from store.tables import ModelInfoRow, RequestSummary

POINTS_LIMIT = 5000  # requests the story is told from (newest first): the Why charts' points
GPU_LOOKBACK_S = 24 * 3600  # how far back to look for a GPU sample when none is fresh


def latest_gpus(conn: sqlite3.Connection, now_unix_s: float) -> list[GpuSample]:
    """The newest sample of each GPU: from the last minute, else the last day (per-minute rollups)."""
    for lookback in (60.0, GPU_LOOKBACK_S):
        latest: dict[int, GpuSample] = {}
        for s in sample_queries.gpu_samples(conn, now_unix_s - lookback, now_unix_s + 5):
            latest[s.index] = s
        if latest:
            return [latest[i] for i in sorted(latest)]
    return []


@dataclass
class BasisReads:
    """What a model's basis reads from the store (one read-only connection)."""

    gpus: list[GpuSample]
    beat: CollectorInfo | None
    info: ModelInfoRow | None
    loaded: LoadedModel | None
    runner: RunnerFlags | None  # the runner serving it and its command line's settings, when one was found
    placement: PlacementInUse  # where the model sits: the runner's load lines, else /api/ps
    measured_bw: HostBandwidth | None
    rows: list[RequestSummary]  # every stored request of the model (rates), newest first: the calibration's history
    # The requests a page shows and judges (Why: its window), newest first; None: all of ``rows``.
    shown: list[RequestSummary] | None = None

    @property
    def judged(self) -> list[RequestSummary]:
        return self.rows if self.shown is None else self.shown


def placement_of(conn: sqlite3.Connection, model: str) -> tuple[LoadedModel | None, RunnerFlags | None, PlacementInUse]:
    """The model as /api/ps lists it, its runner, and where it sits: the runner's own load lines, else /api/ps."""
    loaded = queries.loaded_model(conn, model)
    digest = loaded.digest if loaded is not None else None
    runner = queries.runner_for(conn, model, digest)
    said = queries.runner_placement(conn, model, digest, runner.port if runner is not None else None)
    placement = placement_in_use(
        said[0] if said is not None else None,
        loaded.size_bytes if loaded is not None else None,
        loaded.size_vram_bytes if loaded is not None else None,
    )
    return loaded, runner, placement


def read_basis(conn: sqlite3.Connection, model: str, now_unix_s: float, window_s: float | None = None) -> BasisReads:
    """A model's basis as of ``now_unix_s``. With ``window_s`` only the requests that started in the window ending at
    ``now_unix_s`` are judged, against the GPU of their time: its newest sample up to the end of the newest of them
    (never the machine that views them later), else, with none in the window, the GPU as of ``now_unix_s``."""
    loaded, runner, placement = placement_of(conn, model)
    rows = queries.rate_rows(conn, model, 0.0, limit=POINTS_LIMIT)
    shown = None if window_s is None else [r for r in rows if now_unix_s - window_s <= r.started_at_unix_s <= now_unix_s]
    ran_until = max((r.ended_at_unix_s or r.started_at_unix_s for r in shown), default=None) if shown else None
    return BasisReads(
        gpus=latest_gpus(conn, now_unix_s if ran_until is None else ran_until),
        beat=queries.latest_heartbeat(conn),
        info=queries.model_info(conn, model),
        loaded=loaded,
        runner=runner,
        placement=placement,
        measured_bw=queries.latest_host_bandwidth(conn),
        rows=rows,
        shown=shown,
    )


def _runner_gpu(placement: PlacementInUse) -> Hardware | None:
    """The GPU the runner's own load lines placed the model on, when no GPU sample of the readings' time exists (a
    log imported without a sampler, a collector without a GPU source): its name and memory matched to the table."""
    r = placement.runner if placement.from_runner else None
    device = next((d for d in r.devices if d.description and d.model_bytes), None) if r is not None else None
    spec = match_gpu(device.description or "", device.total_bytes) if device is not None else None
    if device is None or spec is None:
        return None
    note = (
        f"No GPU sample of the readings' time: the GPU is the one the runner's own load lines placed the model on "
        f"({device.device}, {device.description}), with the datasheet's bandwidth."
    )
    return Hardware(HardwareKind.GPU, device.description or spec.name, spec, spec.bandwidth_bytes_s, notes=(note,))


def hardware_for(reads: BasisReads, picked: HardwareSpec | None) -> tuple[Hardware, float, list[str]]:
    """The hardware to explain with, the share of the model in GPU memory, and notes on both."""
    gpus = reads.gpus
    frac = reads.placement.gpu_fraction
    host = reads.measured_bw
    apple_chip = (host.apple_chip, host.apple_gpu_cores) if host is not None and host.apple_chip else None
    need_host = not gpus or frac < 1.0

    def host_bw() -> float | None:
        return None if reads.measured_bw is None else reads.measured_bw.bandwidth_bytes_s

    hw = resolve_hardware(
        gpus[0] if gpus else None,
        gpu_count=len(gpus),
        apple_chip=apple_chip,
        host_bandwidth=host_bw if need_host else lambda: None,
    )
    said = _runner_gpu(reads.placement) if not gpus and picked is None else None
    if said is not None:
        hw = said
    if picked is not None:
        kind = {"apple": HardwareKind.APPLE, "cpu": HardwareKind.CPU}.get(picked.vendor, HardwareKind.GPU)
        hw = Hardware(kind, picked.name, picked, picked.bandwidth_bytes_s, notes=("Picked from Phasewatch's hardware table.",))
    if hw.kind == "cpu":
        frac = 1.0  # the CPU's memory is the "VRAM": nothing is offloaded from it
    elif frac < 1.0:
        hw = replace(hw, host_bandwidth_bytes_s=host_bw())
    notes = list(hw.notes)
    if gpus and reads.beat is not None and reads.beat.gpu_state in UNIFIED_MEMORY_KINDS:
        notes.append(UNIFIED_MEMORY_NOTE[0].upper() + UNIFIED_MEMORY_NOTE[1:] + " (Ollama's size_vram).")
    if reads.placement.disagreement and hw.kind != "cpu":
        notes.append(reads.placement.disagreement)
    return hw, frac, notes


def runner_weights(placement: PlacementInUse) -> tuple[int, str] | None:
    """The weight bytes a decode step reads, from the sizes the runner printed when it loaded the model, and where
    that figure comes from; None when its load lines were not read (the catalogue's estimate stays, said so).

    Every layer on the GPUs: their model buffers (the output head is among them; what stayed in system memory is the
    token-embedding table, of which a step reads one row). No GPU: the runner's system-memory model buffer. Split:
    both."""
    r = placement.runner if placement.from_runner else None
    if r is None:
        return None
    gpu, host = r.gpu_model_bytes, r.host_model_bytes
    all_on_gpu = bool(gpu) and r.layers_total is not None and r.layers_offloaded == r.layers_total
    if all_on_gpu and gpu:
        kept = (
            f"; the {w.mib(host)} it kept in system memory is the token-embedding table, one row read per token" if host else ""
        )
        return gpu, f"the runner's own load lines: {w.mib(gpu)} of model buffers on the GPU{kept}"
    if not gpu and host:
        return host, f"the runner's own load lines: {w.mib(host)} of model buffers in system memory"
    if gpu and host:
        return gpu + host, f"the runner's own load lines: {w.mib(gpu)} on the GPU and {w.mib(host)} in system memory"
    return None


@dataclass
class FactsRead:
    facts: ModelFacts | None
    error: str | None
    read_at_unix_s: float | None
    notes: list[str]


def facts_for(model: str, reads: BasisReads, picked: ModelFacts | None) -> FactsRead:
    """The model's facts: the picked ones (preview), else its stored /api/show; why not, when neither."""
    info = reads.info
    facts: ModelFacts | None = None
    error: str | None = None
    read_at: float | None = None
    if picked is not None:
        facts = picked
    elif info is None:
        error = (
            f"No model facts for {fmt.label(model)} yet: they appear once the collector has asked Ollama about it "
            "(/api/show), "
            "soon after Ollama lists it as installed or loads it."
        )
    else:
        try:
            facts = model_facts_from_show(info.show, None)
            read_at = info.updated_at_unix_s
        except ModelFactsError as e:
            error = f"Ollama's description of {fmt.label(model)} cannot be read for ceilings: {e}."
    notes = []
    # A mixture of experts reads only its active experts' share per token: the runner's whole buffer is not that.
    said = runner_weights(reads.placement) if facts is not None and picked is None and not facts.experts else None
    if facts is not None and said is not None:
        was = f"{w.gb(facts.weights_bytes)}{' estimated' if facts.weights_bytes_estimated else ''}"
        facts = replace(facts, weights_bytes=float(said[0]), weights_bytes_estimated=False)
        notes.append(f"Weights read per token: {w.gb(said[0])}, from {said[1]} (the model's description gave {was}).")
    elif facts is not None and facts.weights_bytes_estimated:
        notes.append(
            f"Weight bytes ({w.gb(facts.weights_bytes)}) are estimated from the parameter count and "
            f"{facts.quantization or 'the'} quantization's bits per weight."
        )
    if reads.loaded is None and facts is not None and picked is None:
        notes.append(f"{fmt.label(model)} is not loaded right now; the decode ceiling assumes it fits entirely in GPU memory.")
    return FactsRead(facts, error, read_at, notes)


def ubatch_for(loaded: LoadedModel | None, runner: RunnerFlags | None) -> tuple[int, str]:
    """The runner's micro-batch (its -ub when its command line was read, else Ollama's for the loaded context),
    and where that figure comes from."""
    if runner is not None and runner.ubatch_tokens:
        return runner.ubatch_tokens, f"the runner's micro-batch (-ub {fmt.count(runner.ubatch_tokens)} on its command line)"
    ubatch = ollama_num_batch(loaded.context_length if loaded is not None else None)
    if loaded is not None and loaded.context_length:
        return ubatch, f"Ollama's batch for the loaded {fmt.count(loaded.context_length)}-token context"
    return ubatch, "llama.cpp's default"


def rate_samples(rows: Sequence[RequestSummary]) -> tuple[list[RateSample], list[RateSample]]:
    """Each request's rates as the story reads them: generations, and embeddings apart (prefill only: the prompt
    read, nothing decoded; rate = prompt tokens ÷ prefill time, analysis.phases). A cloud model's requests ran on
    ollama.com: no local ceiling judges them, and none is calibrated on them."""
    rows = [r for r in rows if not is_cloud(r.model)]
    samples = [
        RateSample(r.id, r.computed_prompt_tokens, r.prefill_tok_s, r.decode_context_tokens, r.output_tokens, r.decode_tok_s)
        for r in rows
        if r.kind is not RequestKind.EMBED
    ]
    embeds = [
        RateSample(r.id, r.computed_prompt_tokens, r.prefill_tok_s, None, None, None) for r in rows if r.kind is RequestKind.EMBED
    ]
    return samples, embeds


def story_for(reads: BasisReads, hw: Hardware, facts: ModelFacts | None, frac: float, ubatch: int) -> Story | None:
    """The ceiling model (calibrated on every stored reading of the model, oldest first) and the judged readings set
    against it; None without a GPU spec or the model's facts."""
    spec = hw.spec
    if spec is None or facts is None:
        return None
    start = CeilingModel(
        spec,
        facts,
        # A serving runner's decode: bytes ÷ (η·BW) plus a fixed cost per token (docs/physics.md §5).
        starting_efficiencies(spec, facts.quantization).serving(facts.layers),
        frac,
        hw.host_bandwidth_bytes_s,
        hw.bandwidth_bytes_s,
        ubatch,
    )
    return build_story(start, rate_samples(reads.judged)[0], history=rate_samples(reads.rows[::-1])[0])


@dataclass
class ModelBasis:
    """One model's basis for every ceiling, expectation and diagnosis a page gives."""

    model: str
    hardware: Hardware
    gpu_fraction: float  # the share of the model on the GPU the ceilings use (1.0 when the readings contradict less)
    placement: PlacementInUse  # where it sits and from what source; its disagreement with /api/ps when > 10%
    facts: FactsRead
    loaded: LoadedModel | None
    ubatch_tokens: int
    ubatch_source: str
    story: Story | None  # None without a GPU spec or model facts
    doubts: list[Doubt] = field(default_factory=list)  # inputs most readings contradict
    notes: list[str] = field(default_factory=list)

    @property
    def efficiencies(self) -> Efficiencies | None:
        return self.story.model.efficiencies if self.story is not None else None

    @property
    def withheld(self) -> frozenset[DiagnosisCode]:
        """Verdicts computed from an input the readings contradict: not given."""
        return frozenset(code for d in self.doubts for code in d.withheld)

    def decode_ceiling_tok_s(self, context_tokens: int) -> float | None:
        """The decode ceiling at a context, as the Why chart draws it; None without a GPU spec or model facts."""
        return self.story.model.at(0, context_tokens).decode_ceiling_tok_s if self.story is not None else None

    def request_ceilings(self, ph: Phases) -> Ceilings | None:
        """One request's ceilings: prefill at the prompt tokens computed (its rate's own), decode at its prompt plus
        half its reply (analysis.diagnose). None without a GPU spec or model facts."""
        if self.story is None:
            return None
        prompt, cached = ph.prompt_tokens or 0, ph.cached_tokens or 0
        computed = max(prompt - cached, 0) if cached <= prompt else prompt
        return self.story.model.at(computed, prompt + (ph.output_tokens or 0) // 2)

    def diagnose(
        self,
        rec: RequestRecord,
        ph: Phases,
        *,
        gpu_samples: Sequence[GpuSample] = (),
        waits: TaskWaits | None = None,
        all_slots_busy: bool | None = None,
        split: WaitSplit | None = None,
    ) -> list[Diagnosis]:
        """Every diagnosis of one request from this basis, those from a contradicted input left out."""
        on_cpu = self.hardware.kind == "cpu"
        found = diagnose_request(
            rec,
            ph,
            gpu_samples=gpu_samples,
            loaded=self.loaded if not on_cpu else None,
            facts=self.facts.facts,
            spec=self.hardware.spec,
            host_bandwidth_bytes_s=self.hardware.host_bandwidth_bytes_s,
            efficiencies=self.efficiencies,
            ceilings=self.request_ceilings(ph),
            bandwidth_bytes_s=self.hardware.bandwidth_bytes_s,
            ubatch_tokens=self.ubatch_tokens,
            gpu_fraction=self.gpu_fraction if not on_cpu else None,
            waits=waits,
            all_slots_busy=all_slots_busy,
            split=split,
        )
        withheld = self.withheld
        return [d for d in found if d.code not in withheld]

    def placement_sentence(self) -> str | None:
        """Where the model sits, with the source; both figures and the one used when /api/ps disagrees. None on a
        CPU (nothing to place) or when nothing said it."""
        p = self.placement
        if self.hardware.kind == "cpu" or p.source == SOURCE_ASSUMED:
            return None
        if p.disagreement:  # both figures, and which one is used
            text = f"Placement: {p.disagreement}"
        elif p.from_runner and p.runner is not None:
            text = f"Placement: {describe_layers(p.runner)}, from the runner's own load lines."
        else:
            text = f"Placement: {w.pct(p.gpu_fraction)} of the model in GPU memory, from Ollama's /api/ps."
        if any(d.contradicted == PLACEMENT for d in self.doubts):
            text += " The readings contradict it: the ceilings take the model all in GPU memory."
        return text


def model_basis(
    model: str, reads: BasisReads, *, picked_hw: HardwareSpec | None = None, picked_facts: ModelFacts | None = None
) -> ModelBasis:
    """The basis of ``model`` from its reads; ``picked_*``: the Why preview's GPU and model (before any request)."""
    hw, frac, notes = hardware_for(reads, picked_hw)
    facts = facts_for(model, reads, picked_facts)
    notes += facts.notes
    ubatch, ubatch_source = ubatch_for(reads.loaded, reads.runner)
    story = story_for(reads, hw, facts.facts, frac, ubatch)
    doubts = _doubts(story, reads.placement, hw)
    if any(d.contradicted == PLACEMENT for d in doubts):  # the readings say it is all on the GPU: so it is taken
        frac = 1.0
        story = story_for(reads, hw, facts.facts, frac, ubatch)
        doubts = [d for d in doubts if d.contradicted == PLACEMENT] + _doubts(story, reads.placement, hw)
    return ModelBasis(model, hw, frac, reads.placement, facts, reads.loaded, ubatch, ubatch_source, story, doubts, notes)


def _doubts(story: Story | None, placement: PlacementInUse, hw: Hardware) -> list[Doubt]:
    if story is None:
        return []
    return doubt_inputs(story, placement_source=placement.source, hardware_label=hw.label)


def load_basis(conn: sqlite3.Connection, model: str, now_unix_s: float) -> ModelBasis:
    """A model's basis read from the store and computed (Requests, Live; Why reads more beside it)."""
    return model_basis(model, read_basis(conn, model, now_unix_s))


BASIS_KEEP_S = 15.0  # a model's basis (its calibration over up to POINTS_LIMIT readings) is computed again after this
_kept: dict[tuple[str, str], tuple[float, ModelBasis]] = {}


def cached_basis(db: Path, conn: sqlite3.Connection, model: str, now_unix_s: float) -> ModelBasis:
    """``load_basis``, kept BASIS_KEEP_S per store and model: Live's cards refresh every second and the Requests
    detail is drawn again on every click, while where a model sits and its calibration change only slowly (a
    ~20,000-request store costs ~0.25 s to compute it)."""
    key, now_s = (str(db), model), time.monotonic()
    kept = _kept.get(key)
    if kept is None or not 0 <= now_s - kept[0] < BASIS_KEEP_S:
        if len(_kept) >= 64:
            _kept.clear()  # many stores or models over the process's life: start again
        kept = _kept[key] = (now_s, load_basis(conn, model, now_unix_s))
    return kept[1]


@dataclass(frozen=True)
class Speeds:
    """A model's speeds as every page reads them (Why, Lab, the report): the medians of the readings that count (timed
    over MIN_RATE_TOKENS or more, under their ceiling) among the requests of one window."""

    prefill_tok_s: float | None
    decode_tok_s: float | None
    prefill_readings: int  # readings that count
    decode_readings: int
    readings_judged: int = 0  # every reading of the window, counted or set apart (too short, above its ceiling)


def judged_readings(basis: ModelBasis, reads: BasisReads) -> tuple[list[Reading], list[Reading]]:
    """The window's readings, each against its ceiling; without a ceiling model only too-short ones are set apart."""
    if basis.story is not None:
        return basis.story.prefill, basis.story.decode
    return plain_readings(rate_samples(reads.judged)[0])


def speeds_of(prefill: Sequence[Reading], decode: Sequence[Reading]) -> Speeds:
    counts = [sum(r.status is Status.COUNTED for r in rs) for rs in (prefill, decode)]
    return Speeds(counted_median(prefill), counted_median(decode), counts[0], counts[1], len(prefill) + len(decode))


def window_speeds(db: Path, model: str, now_unix_s: float, window_s: float) -> tuple[Speeds, ModelWindow] | None:
    """``model``'s speeds over the window ending at ``now_unix_s`` (moved to its last activity when that holds none),
    read as the Why page reads them; None when there is no store."""
    with queries.open_reader(db) as conn:
        if conn is None:
            return None
        win = model_window(conn, model, now_unix_s, window_s)
        reads = read_basis(conn, model, win.end_unix_s, window_s)
    return speeds_of(*judged_readings(model_basis(model, reads), reads)), win

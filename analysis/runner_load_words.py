"""Which placement the ceilings use (the runner's own words, else /api/ps, else assumed) and the sentences that say
where a model sits."""

from __future__ import annotations

from dataclasses import dataclass

from analysis.runner_placement import DevicePlacement, RunnerPlacement

# /api/ps and the runner's own lines disagreeing by more than this share of the model: both are shown.
PS_DISAGREE_FRACTION = 0.10
SOURCE_RUNNER_WORDS = "so say the runner's own load lines"
SOURCE_PS = "so says Ollama's /api/ps"
SOURCE_ASSUMED = "assumed: nothing said where the model sits"


@dataclass(frozen=True)
class PlacementInUse:
    """The share of the model on the GPU that the ceilings use, where it comes from, and what the other source said."""

    gpu_fraction: float
    source: str  # one of the SOURCE_* texts
    runner: RunnerPlacement | None  # the runner's own figures, when its load lines were read
    ps_fraction: float | None  # /api/ps's size_vram ÷ size, when the model is loaded
    disagreement: str | None  # a sentence when both are known and differ by more than PS_DISAGREE_FRACTION

    @property
    def from_runner(self) -> bool:
        return self.source == SOURCE_RUNNER_WORDS


def placement_in_use(runner: RunnerPlacement | None, ps_size_bytes: int | None, ps_vram_bytes: int | None) -> PlacementInUse:
    """The runner's own placement when it said one (it loaded the model; /api/ps is Ollama's estimate, and a runner
    Ollama did not size, like sim's llama-server, answers 0), else /api/ps, else all on the GPU (said so)."""
    ps = None
    if ps_size_bytes and ps_size_bytes > 0 and ps_vram_bytes is not None:
        ps = min(max(ps_vram_bytes / ps_size_bytes, 0.0), 1.0)
    said = runner.gpu_fraction if runner is not None else None
    if said is None:
        if ps is None:
            return PlacementInUse(1.0, SOURCE_ASSUMED, runner, None, None)
        return PlacementInUse(ps, SOURCE_PS, runner, ps, None)
    text = None
    if ps is not None and abs(said - ps) > PS_DISAGREE_FRACTION:
        text = (
            f"Ollama's /api/ps says {ps:.0%} of the model is in GPU memory; the runner's own load lines say "
            f"{describe_layers(runner)}. The runner's figures are used: it is the one that placed the model."
        )
    return PlacementInUse(said, SOURCE_RUNNER_WORDS, runner, ps, text)


def describe_layers(p: RunnerPlacement | None) -> str:
    """ "49/49 layers on CUDA0 (NVIDIA H200)", "30/49 layers on the GPUs: 20 on CUDA0 (…), 10 on CUDA1 (…)"."""
    if p is None:
        return "nothing"
    if p.layers_offloaded == 0:
        return "every layer in system memory (no GPU backend)"

    def name(d: DevicePlacement) -> str:
        return f"{d.device} ({d.description})" if d.description else d.device

    share = f"{p.layers_offloaded}/{p.layers_total} layers" if p.layers_total else f"{p.layers_offloaded} layers"
    gpus = [d for d in p.devices if d.model_bytes]
    if len(gpus) == 1:
        return f"{share} on {name(gpus[0])}"
    parts = [f"{'≈' if d.layers_estimated else ''}{d.layers if d.layers is not None else '?'} on {name(d)}" for d in gpus]
    return f"{share} on the GPUs: " + ", ".join(parts)

"""Evidence before assumption: when most readings of a model exceed a ceiling, the inputs are doubted, not them.

A reading above its ceiling cannot be true (``analysis.story``); one such reading is an error to flag, but when
most of them are above it, the likelier error is in what the ceiling was computed from: where the model sits
(``/api/ps``, or nothing at all), the GPU it was matched to, or the model's size. ``doubt_inputs`` says which
input the readings contradict, and the page gives no advice computed from that input (docs/physics.md §11).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from analysis import wording as w
from analysis.ceilings import MAX_PLAUSIBLE_FRACTION
from analysis.diagnose import DiagnosisCode
from analysis.story import Status, Story

MOST = 0.5  # more than this share of a kind's timed readings above their ceiling: the inputs are doubted
MIN_READINGS = 3  # fewer timed readings than this say nothing about the inputs

PLACEMENT = "placement"
GPU = "gpu"
MODEL_SIZE = "model_size"
# Verdicts computed from each input: none is given while the readings contradict it. Those from measured intervals
# alone (interference, the queue, the runner's own wait: analysis.wait_split) depend on no doubted input.
_FROM_CEILINGS = frozenset(
    {
        DiagnosisCode.PARTIAL_OFFLOAD,
        DiagnosisCode.DECODE_ABOVE_CEILING,
        DiagnosisCode.DECODE_SPECULATIVE,
        DiagnosisCode.DECODE_SLOW,
        DiagnosisCode.PREFILL_ABOVE_CEILING,
    }
)
ADVICE_FROM: dict[str, frozenset[DiagnosisCode]] = {
    PLACEMENT: frozenset({DiagnosisCode.PARTIAL_OFFLOAD}),
    GPU: _FROM_CEILINGS,
    MODEL_SIZE: _FROM_CEILINGS,
}


@dataclass(frozen=True)
class Doubt:
    kind: str  # "decode" or "prefill": the readings that contradict
    contradicted: str  # PLACEMENT, GPU or MODEL_SIZE
    above: int  # readings above their ceiling
    readings: int  # timed readings of that kind (too short ones left out)
    text: str

    @property
    def withheld(self) -> frozenset[DiagnosisCode]:
        """The verdict codes computed from the contradicted input."""
        return ADVICE_FROM[self.contradicted]


def _above(story: Story, kind: str) -> tuple[int, int]:
    timed = [r for r in (story.prefill if kind == "prefill" else story.decode) if r.status is not Status.TINY]
    return sum(r.status is Status.IMPOSSIBLE for r in timed), len(timed)


def doubt_inputs(story: Story, *, placement_source: str, hardware_label: str) -> list[Doubt]:
    """What most readings contradict, per kind (decode first): [] when the readings and the inputs agree."""
    out: list[Doubt] = []
    m = story.model
    facts = m.facts
    size = f"{w.gb(facts.weights_bytes)} of weights" + (
        " (estimated from its parameter count)" if facts.weights_bytes_estimated else ""
    )
    bw = m.bandwidth_bytes_s or m.spec.bandwidth_bytes_s
    for kind in ("decode", "prefill"):
        above, n = _above(story, kind)
        if n < MIN_READINGS or above <= MOST * n:
            continue
        lead = f"{above} of {n} {kind} readings are above the ceiling"
        if kind == "decode" and m.vram_fraction < 1.0:
            full = replace(m, vram_fraction=1.0)
            fit = sum(
                r.rate_tok_s <= MAX_PLAUSIBLE_FRACTION * full.at(0, r.tokens).decode_ceiling_tok_s
                for r in story.decode
                if r.status is Status.IMPOSSIBLE
            )
            if fit > MOST * above:
                text = (
                    f"{lead} that {w.pct(1 - m.vram_fraction)} of the model in system memory allows ({placement_source}); "
                    f"{fit} of them fit the model all in GPU memory. The readings contradict that placement, so it is "
                    "not used: the ceilings assume the model is all on the GPU, and no advice about offloading is given."
                )
                out.append(Doubt(kind, PLACEMENT, above, n, text))
                continue
        contradicted = MODEL_SIZE if facts.weights_bytes_estimated else GPU
        suspect = (
            f"the model's size ({size})"
            if contradicted == MODEL_SIZE
            else f"the GPU it was matched to ({hardware_label}, {w.gb_s(bw)})"
        )
        other = f"the GPU ({hardware_label}, {w.gb_s(bw)})" if contradicted == MODEL_SIZE else f"the model's size ({size})"
        text = (
            f"{lead} that {hardware_label} allows for {size}: so many cannot all be wrong. The readings contradict "
            f"{suspect} (or else {other}), so no advice is computed from it until that is set right."
        )
        out.append(Doubt(kind, contradicted, above, n, text))
    return out

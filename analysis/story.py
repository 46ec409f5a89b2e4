"""One consistent story of measured rates against the ceiling model (docs/physics.md §11).

Every measured rate becomes a :class:`Reading` set against the ceiling at its own prompt length
(prefill) or context (decode). A reading above its ceiling cannot be true; one timed over fewer than
``MIN_RATE_TOKENS`` tokens is too short to time well. Both stay visible, flagged, but neither sets a
median, a calibration or (on the pages) an axis range. The expected rates are computed at the very
prompt lengths and contexts of the counted readings, so the measured and expected ratios compare
like with like. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from analysis.ceilings import (
    MAX_PLAUSIBLE_FRACTION,
    MIN_RATE_TOKENS,
    CalibrationPoint,
    CeilingModel,
    Ceilings,
    calibrate,
)

# A reading this far above its ceiling cannot be true (clock and rounding slack below it).
IMPOSSIBLE_ABOVE_CEILING = MAX_PLAUSIBLE_FRACTION
# Measured and expected ratios further apart than this get a sentence saying why.
RATIO_SPREAD = 1.5
DEFAULT_PROMPT_TOKENS = 512  # for the sentences when no request has been measured yet
DEFAULT_CONTEXT_TOKENS = 1024


class Status(StrEnum):
    COUNTED = "counted"
    TINY = "tiny"  # timed over fewer than MIN_RATE_TOKENS tokens
    IMPOSSIBLE = "impossible"  # above its ceiling


@dataclass(frozen=True)
class RateSample:
    """One request's measured rates, as the store keeps them (None = not measured)."""

    request_id: str
    computed_prompt_tokens: int | None  # prompt tokens evaluated (cache hits excluded)
    prefill_tok_s: float | None
    context_tokens: float | None  # prompt + half the reply: the average decode step's context
    output_tokens: int | None
    decode_tok_s: float | None


@dataclass(frozen=True)
class Reading:
    request_id: str
    tokens: int  # prompt tokens computed (prefill) or context tokens (decode): the x of the chart
    rate_tok_s: float
    timed_tokens: int  # tokens the rate was timed over
    ceiling_tok_s: float
    expected_tok_s: float
    status: Status


@dataclass(frozen=True)
class Story:
    model: CeilingModel  # calibrated
    prefill: list[Reading]
    decode: list[Reading]
    typical_prompt_tokens: int  # median prompt length of the counted prefill readings
    typical_context_tokens: int  # median context of the counted decode readings
    ceilings: Ceilings  # at the typical prompt and context
    prefill_median_tok_s: float | None  # counted readings only
    decode_median_tok_s: float | None
    expected_prefill_tok_s: float  # median of the expected rates at the counted readings' prompt lengths
    expected_decode_tok_s: float  # ... at their contexts

    def counted(self, kind: str) -> list[Reading]:
        return [r for r in (self.prefill if kind == "prefill" else self.decode) if r.status is Status.COUNTED]

    def flagged(self, kind: str, status: Status) -> list[Reading]:
        return [r for r in (self.prefill if kind == "prefill" else self.decode) if r.status is status]

    @property
    def measured_ratio(self) -> float | None:
        if self.prefill_median_tok_s and self.decode_median_tok_s:
            return self.prefill_median_tok_s / self.decode_median_tok_s
        return None

    @property
    def expected_ratio(self) -> float:
        return self.expected_prefill_tok_s / self.expected_decode_tok_s

    @property
    def ratios_differ(self) -> bool:
        m = self.measured_ratio
        return m is not None and not (1 / RATIO_SPREAD <= m / self.expected_ratio <= RATIO_SPREAD)


def _status(rate: float, ceiling: float, timed: int) -> Status:
    if not math.isnan(ceiling) and rate > IMPOSSIBLE_ABOVE_CEILING * ceiling:
        return Status.IMPOSSIBLE
    return Status.TINY if timed < MIN_RATE_TOKENS else Status.COUNTED


def _readings(model: CeilingModel | None, samples: Sequence[RateSample]) -> tuple[list[Reading], list[Reading]]:
    """Each sample's readings; without a ceiling model (unknown GPU or model) only the tiny ones are flagged."""
    prefill, decode = [], []
    nan = math.nan
    for s in samples:
        p = s.computed_prompt_tokens
        if s.prefill_tok_s and p and p > 0:
            ceil, exp = (nan, nan) if model is None else ((c := model.at(p, p)).prefill_ceiling_tok_s, c.prefill_expected_tok_s)
            st = _status(s.prefill_tok_s, ceil, p)
            prefill.append(Reading(s.request_id, p, s.prefill_tok_s, p, ceil, exp, st))
        if s.decode_tok_s and s.context_tokens is not None and s.output_tokens and s.output_tokens >= 2:
            ctx = round(s.context_tokens)
            ceil, exp = (nan, nan) if model is None else ((c := model.at(0, ctx)).decode_ceiling_tok_s, c.decode_expected_tok_s)
            timed = s.output_tokens - 1
            st = _status(s.decode_tok_s, ceil, timed)
            decode.append(Reading(s.request_id, ctx, s.decode_tok_s, timed, ceil, exp, st))
    return prefill, decode


def plain_readings(samples: Sequence[RateSample]) -> tuple[list[Reading], list[Reading]]:
    """(prefill, decode) readings with no ceiling to judge them by: only too-short ones are set apart."""
    return _readings(None, samples)


def counted_median(readings: Sequence[Reading]) -> float | None:
    """The median of the readings that count (neither too short nor impossible)."""
    return _median([r.rate_tok_s for r in readings if r.status is Status.COUNTED])


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def build_story(start: CeilingModel, samples: Sequence[RateSample], *, calibrate_on_samples: bool = True) -> Story:
    """Readings, medians, calibration and expectations from one ceiling model and the measured samples.

    The calibration replaces the starting efficiencies by the median measured ÷ ceiling of the counted
    readings (``analysis.ceilings.calibrate``: five of a kind at least); flagged readings never enter it.
    """
    prefill, decode = _readings(start, samples)
    model = start
    if calibrate_on_samples:
        history = [CalibrationPoint("prefill", r.rate_tok_s, r.ceiling_tok_s) for r in prefill if r.status is Status.COUNTED]
        history += [CalibrationPoint("decode", r.rate_tok_s, r.ceiling_tok_s) for r in decode if r.status is Status.COUNTED]
        eff = calibrate(history, start.efficiencies)
        if eff != start.efficiencies:
            model = start.with_efficiencies(eff)
            prefill, decode = _readings(model, samples)
    pre_n = [r for r in prefill if r.status is Status.COUNTED]
    dec_n = [r for r in decode if r.status is Status.COUNTED]
    typical_p = round(_median([r.tokens for r in pre_n]) or DEFAULT_PROMPT_TOKENS)
    typical_c = round(_median([r.tokens for r in dec_n]) or DEFAULT_CONTEXT_TOKENS)
    at_typical = model.at(typical_p, typical_c)
    return Story(
        model=model,
        prefill=prefill,
        decode=decode,
        typical_prompt_tokens=typical_p,
        typical_context_tokens=typical_c,
        ceilings=at_typical,
        prefill_median_tok_s=_median([r.rate_tok_s for r in pre_n]),
        decode_median_tok_s=_median([r.rate_tok_s for r in dec_n]),
        expected_prefill_tok_s=_median([r.expected_tok_s for r in pre_n]) or at_typical.prefill_expected_tok_s,
        expected_decode_tok_s=_median([r.expected_tok_s for r in dec_n]) or at_typical.decode_expected_tok_s,
    )


@dataclass(frozen=True)
class EmbedStory:
    """Embedding requests set against the same ceiling model: prefill-only work (the prompt read, nothing decoded).

    Kept apart from the generations' readings: they never set the prefill median, the calibration or the ratio.
    """

    readings: list[Reading]  # one per embed request: prompt tokens ÷ prefill time, against the prefill ceiling there
    typical_prompt_tokens: int  # median prompt (batch) length of the counted ones
    median_tok_s: float | None  # counted readings only
    ceilings: Ceilings  # at the typical prompt length

    @property
    def counted(self) -> list[Reading]:
        return [r for r in self.readings if r.status is Status.COUNTED]


def embed_story(model: CeilingModel, samples: Sequence[RateSample]) -> EmbedStory | None:
    """The embed requests' readings against ``model``'s prefill ceiling at their own prompt lengths; None without any."""
    readings = _readings(model, samples)[0]
    if not readings:
        return None
    counted = [r for r in readings if r.status is Status.COUNTED]
    typical = round(_median([r.tokens for r in counted]) or _median([r.tokens for r in readings]) or DEFAULT_PROMPT_TOKENS)
    return EmbedStory(readings, typical, _median([r.rate_tok_s for r in counted]), model.at(typical, typical))

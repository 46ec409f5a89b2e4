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
    MIN_CALIBRATION_SAMPLES,
    MIN_RATE_TOKENS,
    CalibrationPoint,
    CeilingModel,
    Ceilings,
    calibrate,
)

# The calibrated model's error is measured on at most this many of the newest readings of a kind, each predicted from
# at most HELD_OUT_HISTORY readings before it: bounded work however many requests the store holds.
HELD_OUT_LIMIT = 100
HELD_OUT_HISTORY = 200

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
class HeldOutError:
    """The calibrated model's error on readings it was not fitted on: each reading predicted by the model calibrated on
    the readings before it (at least MIN_CALIBRATION_SAMPLES of its kind), never on itself or later ones."""

    kind: str  # "prefill" or "decode"
    readings: int  # readings predicted this way
    median_abs_error: float  # median of |predicted − measured| ÷ measured
    max_abs_error: float


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
    # The prior: first principles and the hardware table at the same prompt lengths and contexts, never fitted.
    prior_prefill_tok_s: float | None = None
    prior_decode_tok_s: float | None = None
    held_out: tuple[HeldOutError, ...] = ()  # the calibrated model's error on readings it was not fitted on
    prior_model: CeilingModel | None = None  # the uncalibrated model, when the calibration replaced it

    def held_out_error(self, kind: str) -> HeldOutError | None:
        return next((h for h in self.held_out if h.kind == kind), None)

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
        """The calibrated model's prefill ÷ decode at the counted readings' lengths."""
        return self.expected_prefill_tok_s / self.expected_decode_tok_s

    @property
    def prior_ratio(self) -> float | None:
        """The prior's prefill ÷ decode at the counted readings' lengths: what the measured ratio is compared with."""
        if self.prior_prefill_tok_s and self.prior_decode_tok_s:
            return self.prior_prefill_tok_s / self.prior_decode_tok_s
        return None

    @property
    def ratios_differ(self) -> bool:
        m, prior = self.measured_ratio, self.prior_ratio
        return m is not None and prior is not None and not (1 / RATIO_SPREAD <= m / prior <= RATIO_SPREAD)


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


def _expected_median(readings: Sequence[Reading]) -> float | None:
    """The median expected rate at the counted readings' own lengths."""
    return _median([r.expected_tok_s for r in readings if r.status is Status.COUNTED])


def _calibration_points(prefill: Sequence[Reading], decode: Sequence[Reading]) -> list[CalibrationPoint]:
    points = [CalibrationPoint("prefill", r.rate_tok_s, r.ceiling_tok_s) for r in prefill if r.status is Status.COUNTED]
    return points + [CalibrationPoint("decode", r.rate_tok_s, r.ceiling_tok_s) for r in decode if r.status is Status.COUNTED]


def _predicted(model: CeilingModel, r: Reading, kind: str) -> float:
    c = model.at(r.tokens, r.tokens) if kind == "prefill" else model.at(0, r.tokens)
    return c.prefill_expected_tok_s if kind == "prefill" else c.decode_expected_tok_s


def held_out_errors(start: CeilingModel, history: Sequence[RateSample]) -> tuple[HeldOutError, ...]:
    """Each counted reading of ``history`` (oldest first) predicted by the model calibrated on the requests before it
    alone; per kind, the median and largest relative error. A kind with no reading that had MIN_CALIBRATION_SAMPLES
    of its kind before it has no figure (the calibration never replaced the prior there)."""
    # The newest readings and the history each is predicted from: the rest of a long store never enters.
    per_sample = [_readings(start, [s]) for s in history[-(HELD_OUT_LIMIT + HELD_OUT_HISTORY) :]]
    points = [_calibration_points(pre, dec) for pre, dec in per_sample]  # each sample's, computed once
    out = []
    for k, kind in enumerate(("prefill", "decode")):
        errors: list[float] = []
        at = [i for i, both in enumerate(per_sample) if both[k] and both[k][0].status is Status.COUNTED]
        for i in at[-HELD_OUT_LIMIT:]:
            before = [p for ps in points[max(0, i - HELD_OUT_HISTORY) : i] for p in ps]
            if sum(p.kind == kind for p in before) < MIN_CALIBRATION_SAMPLES:
                continue
            model = start.with_efficiencies(calibrate(before, start.efficiencies))
            reading = per_sample[i][k][0]
            errors.append(abs(_predicted(model, reading, kind) - reading.rate_tok_s) / reading.rate_tok_s)
        if errors:
            out.append(HeldOutError(kind, len(errors), statistics.median(errors), max(errors)))
    return tuple(out)


def build_story(
    start: CeilingModel,
    samples: Sequence[RateSample],
    *,
    calibrate_on_samples: bool = True,
    history: Sequence[RateSample] | None = None,
) -> Story:
    """Readings, medians, calibration and expectations from one ceiling model and the measured samples.

    ``samples`` are the readings shown and judged (a page's window); ``history`` (oldest first; ``samples`` when not
    given) the readings the calibration is fitted on. The calibration replaces the starting efficiencies by the
    median measured ÷ ceiling of the counted readings (``analysis.ceilings.calibrate``: five of a kind at least);
    flagged readings never enter it. ``start`` stays the prior: its expectations at the counted readings' lengths
    are kept beside the calibrated ones, and the calibrated model's error is measured on readings it was not fitted
    on (``held_out_errors``).
    """
    prior_pre, prior_dec = _readings(start, samples)
    prefill, decode = prior_pre, prior_dec
    model = start
    held_out: tuple[HeldOutError, ...] = ()
    if calibrate_on_samples:
        fit_on = samples if history is None else history
        eff = calibrate(_calibration_points(*_readings(start, fit_on)), start.efficiencies)
        if eff != start.efficiencies:
            model = start.with_efficiencies(eff)
            prefill, decode = _readings(model, samples)
        held_out = held_out_errors(start, fit_on)
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
        expected_prefill_tok_s=_expected_median(prefill) or at_typical.prefill_expected_tok_s,
        expected_decode_tok_s=_expected_median(decode) or at_typical.decode_expected_tok_s,
        prior_prefill_tok_s=_expected_median(prior_pre) or start.at(typical_p, typical_c).prefill_expected_tok_s,
        prior_decode_tok_s=_expected_median(prior_dec) or start.at(typical_p, typical_c).decode_expected_tok_s,
        held_out=held_out,
        prior_model=start if model is not start else None,
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

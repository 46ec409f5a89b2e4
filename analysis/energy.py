"""Energy per phase: joules per prompt token and per output token.

From NVML's cumulative energy counter (``GpuSample.energy_j``) where the GPU has
one: the counter read at the phase's start and end, each interpolated between
the samples around it. Without a counter, the power samples integrated over the
phase (trapezoids, power interpolated at the edges). It is the whole GPU's
energy, idle draw included, shared by every request running at the same time.
Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from analysis.phases import Phases
from analysis.records import GpuSample, RequestRecord


@dataclass(frozen=True)
class WindowEnergy:
    joules: float
    method: str  # "energy_counter" | "power_samples"
    coarse: bool  # the samples around the window are further apart than the window is long


@dataclass(frozen=True)
class PhaseEnergy:
    prefill_j: float | None
    decode_j: float | None
    prompt_tokens_computed: int | None
    output_intervals: int | None  # output tokens − 1: decode's time spans first → last token
    j_per_prompt_token: float | None
    j_per_output_token: float | None
    method: str | None
    coarse: bool  # a phase was shorter than the sampling interval: the figure is an average-power estimate


def _interp(t: float, t0: float, v0: float, t1: float, v1: float) -> float:
    if t1 == t0:
        return v0
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _bracket(samples: Sequence[GpuSample], t: float) -> tuple[GpuSample, GpuSample] | None:
    """The last sample at or before t and the first at or after t."""
    before = [s for s in samples if s.ts_unix_s <= t]
    after = [s for s in samples if s.ts_unix_s >= t]
    if not before or not after:
        return None
    return before[-1], after[0]


def _counter_energy(samples: Sequence[GpuSample], t0: float, t1: float) -> WindowEnergy | None:
    with_counter = [s for s in samples if s.energy_j is not None]
    a, b = _bracket(with_counter, t0), _bracket(with_counter, t1)
    if a is None or b is None:
        return None
    e0 = _interp(t0, a[0].ts_unix_s, a[0].energy_j or 0.0, a[1].ts_unix_s, a[1].energy_j or 0.0)
    e1 = _interp(t1, b[0].ts_unix_s, b[0].energy_j or 0.0, b[1].ts_unix_s, b[1].energy_j or 0.0)
    # A counter that went backwards (driver reload) cannot be used across the reset.
    span = [s for s in with_counter if a[0].ts_unix_s <= s.ts_unix_s <= b[1].ts_unix_s]
    if any((y.energy_j or 0.0) < (x.energy_j or 0.0) for x, y in itertools.pairwise(span)):
        return None
    spacing = max(a[1].ts_unix_s - a[0].ts_unix_s, b[1].ts_unix_s - b[0].ts_unix_s)
    return WindowEnergy(max(e1 - e0, 0.0), "energy_counter", spacing > (t1 - t0))


def _power_energy(samples: Sequence[GpuSample], t0: float, t1: float) -> WindowEnergy | None:
    with_power = [s for s in samples if s.power_w is not None]
    a, b = _bracket(with_power, t0), _bracket(with_power, t1)
    if a is None or b is None:
        return None
    p0 = _interp(t0, a[0].ts_unix_s, a[0].power_w or 0.0, a[1].ts_unix_s, a[1].power_w or 0.0)
    p1 = _interp(t1, b[0].ts_unix_s, b[0].power_w or 0.0, b[1].ts_unix_s, b[1].power_w or 0.0)
    points = [(t0, p0)] + [(s.ts_unix_s, s.power_w or 0.0) for s in with_power if t0 < s.ts_unix_s < t1] + [(t1, p1)]
    joules = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(points))
    spacing = max(a[1].ts_unix_s - a[0].ts_unix_s, b[1].ts_unix_s - b[0].ts_unix_s)
    return WindowEnergy(joules, "power_samples", spacing > (t1 - t0))


def energy_between(samples: Sequence[GpuSample], t0_unix_s: float, t1_unix_s: float) -> WindowEnergy | None:
    """Energy all GPUs in ``samples`` used from t0 to t1 (wall clock), or None without samples around both ends."""
    if t1_unix_s < t0_unix_s:
        raise ValueError("window ends before it starts")
    by_gpu: dict[int, list[GpuSample]] = {}
    for s in sorted(samples, key=lambda s: s.ts_unix_s):
        by_gpu.setdefault(s.index, []).append(s)
    if not by_gpu:
        return None
    parts: list[WindowEnergy] = []
    for gpu_samples in by_gpu.values():
        e = _counter_energy(gpu_samples, t0_unix_s, t1_unix_s) or _power_energy(gpu_samples, t0_unix_s, t1_unix_s)
        if e is None:
            return None  # one GPU unknown: a partial sum would mislead
        parts.append(e)
    method = parts[0].method if all(p.method == parts[0].method for p in parts) else "mixed"
    return WindowEnergy(sum(p.joules for p in parts), method, any(p.coarse for p in parts))


def energy_for_request(record: RequestRecord, phases: Phases, samples: Sequence[GpuSample]) -> PhaseEnergy | None:
    """Joules of prefill and decode and per token, or None when the phases or samples do not cover the request."""
    if phases.prefill_start_ns is None or phases.decode_start_ns is None or phases.decode_end_ns is None:
        return None
    t_pre = record.wall_s(phases.prefill_start_ns)
    t_dec = record.wall_s(phases.decode_start_ns)
    t_end = record.wall_s(phases.decode_end_ns)
    pre = energy_between(samples, t_pre, t_dec) if t_dec > t_pre else None
    dec = energy_between(samples, t_dec, t_end) if t_end > t_dec else None
    if pre is None and dec is None:
        return None
    computed = None
    if phases.prompt_tokens is not None:
        computed = phases.prompt_tokens - (phases.cached_tokens or 0)
    intervals = phases.output_tokens - 1 if phases.output_tokens else None
    methods = {e.method for e in (pre, dec) if e is not None}
    return PhaseEnergy(
        prefill_j=pre.joules if pre else None,
        decode_j=dec.joules if dec else None,
        prompt_tokens_computed=computed,
        output_intervals=intervals,
        j_per_prompt_token=_per_token_j(pre, computed),
        j_per_output_token=_per_token_j(dec, intervals),
        method=methods.pop() if len(methods) == 1 else "mixed",
        coarse=any(e.coarse for e in (pre, dec) if e is not None),
    )


def _per_token_j(energy: WindowEnergy | None, tokens: int | None) -> float | None:
    """Joules per token; None where the energy or a positive token count is not known."""
    return energy.joules / tokens if energy and tokens and tokens > 0 else None

"""How much one request's prompt slowed another request's tokens.

A server that batches several requests runs a newcomer's prompt in the same
steps as everyone else's next token. While that prompt is being read, the
steps are long, so the other streams' gaps between tokens grow. (DistServe
calls this prefill–decode interference; Sarathi-Serve limits it by cutting
prompts into small chunks.)

For every pair of overlapping requests we take the victim's gaps between
tokens that overlap the other's prefill window and compare each with the
victim's usual gap (the median of its gaps that overlap nobody's prefill).
The difference is what the other request cost it per token. Pure; all
timestamps are the collector's monotonic clock, shared by all records.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from analysis import wording as w
from analysis.phases import Phases
from analysis.records import RequestRecord

NS_PER_MS = 1_000_000
# A slowdown counts when it is both noticeable to a reader and beyond the stream's own jitter.
MIN_EXTRA_MS = 2.0
MIN_EXTRA_FRACTION_OF_BASELINE = 0.25
MIN_BASELINE_GAPS = 3  # fewer clean gaps than this: use the median of all gaps


@dataclass(frozen=True)
class Interference:
    victim_id: str
    aggressor_id: str
    affected_gaps: int  # victim's gaps that overlapped the aggressor's prefill
    baseline_gap_ms: float  # victim's median gap away from anyone's prefill
    mean_gap_ms: float  # victim's mean gap during the aggressor's prefill
    max_gap_ms: float
    extra_ms_per_token: float  # mean of (gap − baseline) over the affected gaps
    extra_ms_total: float  # sum of (gap − baseline)
    aggressor_prefill_ms: float
    aggressor_prompt_tokens: int | None  # tokens the aggressor actually computed (cache hits excluded)
    victim_model: str
    aggressor_model: str

    @property
    def significant(self) -> bool:
        return self.extra_ms_per_token >= max(MIN_EXTRA_MS, MIN_EXTRA_FRACTION_OF_BASELINE * self.baseline_gap_ms)


def _prefill_window(phases: Phases) -> tuple[int, int] | None:
    if phases.prefill_start_ns is None or phases.decode_start_ns is None:
        return None
    if phases.decode_start_ns <= phases.prefill_start_ns:
        return None
    return phases.prefill_start_ns, phases.decode_start_ns


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def find_interference(requests: Sequence[tuple[RequestRecord, Phases]]) -> list[Interference]:
    """Every (victim, aggressor) pair where the victim had tokens during the aggressor's prefill.

    A gap that overlaps several prefills is charged to the one it overlaps most. Pairs are
    returned whether or not the slowdown is significant (see :attr:`Interference.significant`),
    largest total cost first.
    """
    windows: list[tuple[int, int, RequestRecord, Phases]] = []
    for rec, ph in requests:
        win = _prefill_window(ph)
        if win is not None:
            windows.append((win[0], win[1], rec, ph))
    out: list[Interference] = []
    for victim, _ in requests:
        ts = victim.token_chunk_ns
        if len(ts) < 3:
            continue
        gaps = [(ts[i - 1], ts[i]) for i in range(1, len(ts))]
        charged: dict[int, list[int]] = {}  # index into windows -> gap lengths (ns)
        clean: list[int] = []
        for g0, g1 in gaps:
            best, best_ov = -1, 0
            for k, (w0, w1, agg, _) in enumerate(windows):
                if agg.id == victim.id:
                    continue
                ov = _overlap(g0, g1, w0, w1)
                if ov > best_ov:
                    best, best_ov = k, ov
            if best >= 0:
                charged.setdefault(best, []).append(g1 - g0)
            else:
                clean.append(g1 - g0)
        if not charged:
            continue
        all_gaps = [g1 - g0 for g0, g1 in gaps]
        baseline_ns = statistics.median(clean if len(clean) >= MIN_BASELINE_GAPS else all_gaps)
        for k, lengths in charged.items():
            w0, w1, agg, agg_ph = windows[k]
            extras = [g - baseline_ns for g in lengths]
            computed = None
            if agg_ph.prompt_tokens is not None:
                computed = agg_ph.prompt_tokens - (agg_ph.cached_tokens or 0)
            out.append(
                Interference(
                    victim_id=victim.id,
                    aggressor_id=agg.id,
                    affected_gaps=len(lengths),
                    baseline_gap_ms=baseline_ns / NS_PER_MS,
                    mean_gap_ms=statistics.fmean(lengths) / NS_PER_MS,
                    max_gap_ms=max(lengths) / NS_PER_MS,
                    extra_ms_per_token=statistics.fmean(extras) / NS_PER_MS,
                    extra_ms_total=sum(extras) / NS_PER_MS,
                    aggressor_prefill_ms=(w1 - w0) / NS_PER_MS,
                    aggressor_prompt_tokens=computed,
                    victim_model=victim.model,
                    aggressor_model=agg.model,
                )
            )
    out.sort(key=lambda i: i.extra_ms_total, reverse=True)
    return out


def describe(i: Interference, victim_label: str = "this request", aggressor_label: str = "another request") -> str:
    """One sentence in the user's numbers."""
    prompt = f"{w.count(i.aggressor_prompt_tokens)}-token prompt" if i.aggressor_prompt_tokens else "prompt"
    took = w.secs(i.aggressor_prefill_ms / 1000)
    if not i.significant:
        return (
            f"While {aggressor_label} read its {prompt} ({took}), {victim_label}'s gaps between tokens "
            f"stayed near their usual {w.duration_ms(i.baseline_gap_ms)}."
        )
    tokens = "token" if i.affected_gaps == 1 else "tokens"
    return (
        f"While {aggressor_label} read its {prompt} ({took}), {victim_label}'s gap between tokens grew "
        f"from its usual {w.duration_ms(i.baseline_gap_ms)} to {w.duration_ms(i.mean_gap_ms)} on average "
        f"(longest {w.duration_ms(i.max_gap_ms)}) for "
        f"{i.affected_gaps} {tokens}: the other request cost it {w.duration_ms(i.extra_ms_per_token)} per token, "
        f"{w.secs(i.extra_ms_total / 1000)} in all."
    )

"""Pure helpers the pages need on top of the records: no Streamlit, no I/O, no clock.

Everything here takes the current time as an argument so that tests and the
benchmark can call it with fixed values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from analysis.records import Outcome, RequestRecord

# Colours and order of the phases, shared by every chart.
PHASE_ORDER = ("queue", "load", "prefill", "decode")


@dataclass(frozen=True)
class Band:
    """One phase of one request on the wall clock, for the bands under the GPU timeline."""

    request_id: str
    model: str
    phase: str  # one of PHASE_ORDER
    start_unix_s: float
    end_unix_s: float
    lane: int = 0  # row in the band chart; overlapping requests get different lanes


@dataclass(frozen=True)
class Interval:
    start_unix_s: float
    end_unix_s: float

    @property
    def duration_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


def stall_threshold_ms(gaps_ms: Sequence[float]) -> float | None:
    """A gap counts as a stall when it is well above the usual rhythm of this request."""
    if len(gaps_ms) < 3:
        return None
    typical = median(gaps_ms)
    return max(4.0 * typical, typical + 50.0)


def finished(record: RequestRecord) -> bool:
    return record.outcome is not Outcome.IN_FLIGHT

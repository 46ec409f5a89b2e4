"""What every GPU source shares: its state, and the one interface the collector samples through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from analysis.records import GpuKind, GpuSample

NO_GPU_MEANING = "GPU charts stay empty; Phasewatch still records requests"


@dataclass(frozen=True)
class GpuState:
    """What the GPU side can do, and why not when it cannot (``kind`` becomes CollectorInfo.gpu_state)."""

    kind: GpuKind
    message: str | None = None


class GpuSampler(Protocol):
    """One GPU source, chosen at start (``collectors.gpu.choose``). ``sample`` blocks: call it off the loop."""

    name: str  # e.g. "AMD (amdgpu sysfs)"

    @property
    def state(self) -> GpuState: ...

    def sample(self, now: float | None = None) -> list[GpuSample]: ...

    def close(self) -> None: ...

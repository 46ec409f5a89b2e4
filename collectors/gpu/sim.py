"""The simulator's virtual GPU (demo mode): ``GET {sim}/sim/gpu`` read into samples marked simulated."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from analysis.records import GpuKind, GpuSample
from collectors.gpu.state import GpuState

__all__ = ["SimGpuSource", "gpu_samples_from_sim"]

_SIM_TEXT_FIELDS = ("name", "uuid")
_SIM_INT_FIELDS = (
    "index",
    "mem_used_bytes",
    "mem_total_bytes",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "mem_bus_width_bits",
    "pstate",
    "throttle_reasons",
    "ollama_mem_bytes",
)
_SIM_FLOAT_FIELDS = (
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "power_limit_w",
    "energy_j",
    "temperature_c",
    "pcie_tx_bytes_s",
    "pcie_rx_bytes_s",
)


def _sim_gpu(item: object, position: int, ts_unix_s: float) -> GpuSample:
    if not isinstance(item, dict):
        raise ValueError("/sim/gpu returned a GPU that is not a JSON object")
    values: dict[str, Any] = {"index": position, "name": "simulated GPU", "uuid": f"SIM-{position}"}
    for key, value in item.items():
        if value is None or key not in (*_SIM_TEXT_FIELDS, *_SIM_INT_FIELDS, *_SIM_FLOAT_FIELDS):
            continue  # unknown keys (e.g. total_energy_mj) and absent readings are skipped
        ok = (
            isinstance(value, str)
            if key in _SIM_TEXT_FIELDS
            else isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
        if not ok:
            raise ValueError(f"/sim/gpu returned {key}={value!r}, which is not a valid reading")
        values[key] = int(value) if key in _SIM_INT_FIELDS else float(value) if key in _SIM_FLOAT_FIELDS else value
    return GpuSample(ts_unix_s=ts_unix_s, simulated=True, **values)


def gpu_samples_from_sim(payload: Any, ts_unix_s: float) -> list[GpuSample]:
    """Turn a ``GET /sim/gpu`` body into samples marked simulated.

    Accepts ``{"gpus": [...]}``, a list of GPU objects, or one GPU object; keys are
    GpuSample's field names. Raises ValueError, naming the field, on anything else.
    """
    if isinstance(payload, dict) and isinstance(payload.get("gpus"), list):
        items = payload["gpus"]
    elif isinstance(payload, list):
        items = payload
    elif isinstance(payload, dict) and "gpus" not in payload:
        items = [payload]
    else:
        raise ValueError("/sim/gpu did not return a JSON object or list of GPUs")
    return [_sim_gpu(item, i, ts_unix_s) for i, item in enumerate(items)]


class SimGpuSource:
    """Reads the simulator's virtual GPU from ``GET {base_url}/sim/gpu`` (demo mode)."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession, *, clock: Callable[[], float] = time.time) -> None:
        self._url = base_url.rstrip("/") + "/sim/gpu"
        self._session = session
        self._clock = clock
        self.state = GpuState(GpuKind.SIMULATED, "the simulator's virtual GPU (demo mode)")

    async def sample(self) -> list[GpuSample]:
        """Samples, or [] when the sim cannot be read (the state message says why)."""
        try:
            async with self._session.get(self._url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                payload = await resp.json(content_type=None)
            samples = gpu_samples_from_sim(payload, self._clock())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.state = GpuState(GpuKind.SIMULATED, f"cannot read {self._url}: {exc or type(exc).__name__}")
            return []
        self.state = GpuState(GpuKind.SIMULATED, "the simulator's virtual GPU (demo mode)")
        return samples

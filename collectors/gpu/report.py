"""GPU sampling: the source chosen at start (NVML, amdsmi, AMD sysfs, macmon, IORegistry), or the sim's virtual GPU.

The real sources live in ``gpu_nvml``, ``gpu_amdsmi``, ``gpu_amd_sysfs`` and ``gpu_apple``, chosen by
``gpu_choose``; this module keeps the simulator's source and the command line.

Run ``python -m collectors.gpu`` (or ``--json``) to print what the chosen source reads on this
machine, or why no source works.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import aiohttp

from analysis.records import GpuKind, GpuSample
from collectors.gpu.choose import GpuChoice, choose_gpu_sampler
from collectors.gpu.nvml import NvmlGpuSource
from collectors.gpu.state import NO_GPU_MEANING, GpuState
from collectors.host.sampler import OllamaProcesses

__all__ = ["NO_GPU_MEANING", "GpuState", "NvmlGpuSource", "SimGpuSource", "gpu_samples_from_sim"]


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


def report(choice: GpuChoice, *, pause_s: float = 0.2) -> dict[str, Any]:
    """One sample from the chosen source (read twice: some counters need a moment), with why others were passed over."""
    sampler = choice.sampler
    passed_over = [{"source": name, "why": why} for name, why in choice.passed_over]
    if sampler is None:
        return {"source": None, "state": asdict(choice.state), "samples": [], "passed_over": passed_over}
    try:
        sampler.sample()
        time.sleep(pause_s)
        samples = sampler.sample()
        out: dict[str, Any] = {
            "source": sampler.name,
            "state": asdict(sampler.state),
            "samples": [asdict(s) for s in samples],
            "passed_over": passed_over,
        }
        unsupported = getattr(sampler, "unsupported", None)
        if unsupported:
            out["unsupported"] = {str(i): sorted(names) for i, names in unsupported.items()}
        unreadable = getattr(sampler, "unreadable", None)
        if unreadable:
            out["unreadable"] = dict(sorted(unreadable.items()))
    finally:
        sampler.close()
    return out


def _human(out: dict[str, Any]) -> str:
    lines = []
    if out["source"] is None:
        lines.append("No GPU source found. Tried:")
    else:
        lines.append(f"GPU source: {out['source']}")
        for s in out["samples"]:
            shown = {k: v for k, v in s.items() if v is not None and k not in ("ts_unix_s", "simulated")}
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        if out["passed_over"]:
            lines.append("Passed over:")
    lines += [f"  {p['source']}: {p['why']}" for p in out["passed_over"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print one reading of every GPU from whichever source works here, or why none does."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m collectors.gpu", description=main.__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    out = report(choose_gpu_sampler(processes=OllamaProcesses()))
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(_human(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

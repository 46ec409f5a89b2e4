"""The GPU command line: what the source chosen at start (NVML, amdsmi, AMD sysfs, macmon, IORegistry) reads.

The real sources live in ``nvml``, ``amd_smi``, ``amd_sysfs`` and ``apple``, chosen by ``choose``; the
simulator's virtual GPU (demo mode) is read by ``sim``.

Run ``python -m collectors.gpu`` (or ``--json``) to print what the chosen source reads on this
machine, or why no source works.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Any

from analysis.command_line import ExitCode
from collectors.gpu.choose import GpuChoice, choose_gpu_sampler
from collectors.gpu.nvml import NvmlGpuSource
from collectors.gpu.state import NO_GPU_MEANING, GpuState
from collectors.host.sampler import OllamaProcesses

__all__ = ["NO_GPU_MEANING", "GpuState", "NvmlGpuSource"]


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
    return ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())

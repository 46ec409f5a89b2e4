"""Hardware facts: memory bandwidth, dense FP16 compute, memory size (physics.md §5).

Values are vendor datasheet figures; "derived" marks numbers computed from
core counts and clocks because the vendor publishes none (Apple, some GeForce).
For GeForce cards ``fp16_flops`` is the FP16-accumulate tensor peak, which is
what llama.cpp's CUDA kernels use for prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True)
class HardwareSpec:
    key: str  # short id, e.g. "rtx-4090"
    name: str  # as NVML or the OS reports it, e.g. "NVIDIA GeForce RTX 4090"
    vendor: str  # "nvidia" | "amd" | "apple" | "cpu"
    memory_bytes: float
    bandwidth_bytes_s: float
    fp16_flops: float  # dense, no sparsity
    # Starting efficiency factors (physics.md §3): fraction of the ceiling reached in practice.
    eta_bw_quant: float  # decode, 4-6 bit weights
    eta_bw_f16: float  # decode, F16/Q8 weights
    eta_compute: float  # prefill
    derived: bool = False  # True when a figure is derived, not published


def _nv(key: str, name: str, mem_gb: float, bw_gbs: float, tflops: float, derived: bool = False) -> HardwareSpec:
    return HardwareSpec(key, name, "nvidia", mem_gb * GB, bw_gbs * GB, tflops * TFLOPS, 0.70, 0.82, 0.45, derived)


def _apple(key: str, name: str, mem_gb: float, bw_gbs: float, tflops: float, big: bool) -> HardwareSpec:
    # Apple Max/Ultra reach less of their bandwidth on 4-bit weights than base/Pro chips.
    eta_q = 0.5 if big else 0.75
    return HardwareSpec(key, name, "apple", mem_gb * GB, bw_gbs * GB, tflops * TFLOPS, eta_q, 0.75, 0.70, True)


SPECS: tuple[HardwareSpec, ...] = (
    _nv("rtx-3060", "NVIDIA GeForce RTX 3060", 12, 360, 51, derived=True),
    _nv("rtx-3070", "NVIDIA GeForce RTX 3070", 8, 448, 81, derived=True),
    _nv("rtx-3080", "NVIDIA GeForce RTX 3080", 10, 760, 119),
    _nv("rtx-3090", "NVIDIA GeForce RTX 3090", 24, 936, 142),
    _nv("rtx-4060-ti-16gb", "NVIDIA GeForce RTX 4060 Ti", 16, 288, 88, derived=True),
    _nv("rtx-4070", "NVIDIA GeForce RTX 4070", 12, 504, 117, derived=True),
    _nv("rtx-4080", "NVIDIA GeForce RTX 4080", 16, 717, 195, derived=True),
    _nv("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, 330),
    _nv("rtx-5090", "NVIDIA GeForce RTX 5090", 32, 1792, 419, derived=True),
    _nv("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 2039, 312),
    _nv("h100-sxm", "NVIDIA H100 80GB HBM3", 80, 3350, 989),
    _nv("h200", "NVIDIA H200", 141, 4800, 989),
    _apple("m1", "Apple M1", 16, 68.25, 2.6, big=False),
    _apple("m1-max", "Apple M1 Max", 64, 400, 10.4, big=True),
    _apple("m2-ultra", "Apple M2 Ultra", 192, 800, 27.2, big=True),
    _apple("m3-max", "Apple M3 Max", 128, 400, 16, big=True),
    # A plain desktop: dual-channel DDR5, 8 cores with AVX2 FMA (about 1 TFLOP/s FP32).
    HardwareSpec("cpu", "Desktop CPU (dual-channel DDR5)", "cpu", 64 * GB, 80 * GB, 1.0 * TFLOPS, 0.65, 0.75, 0.5, True),
)

BY_KEY: dict[str, HardwareSpec] = {s.key: s for s in SPECS}


def spec_by_key(key: str) -> HardwareSpec:
    """Look up a spec by its short key; KeyError names the known keys."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown hardware {key!r}; known: {', '.join(sorted(BY_KEY))}") from None

"""Hardware facts: memory bandwidth, dense FP16 compute, memory size (docs/physics.md §8).

Values are vendor datasheet figures; ``derived=True`` marks rows where at least
one figure is computed (tensor cores × FLOP/clock × boost clock, or "AI TOPS"
÷ 4 for Ada / ÷ 8 for Blackwell, or Apple's cores × 128 ALUs × 2 × clock)
because the vendor publishes none.  For GeForce cards ``fp16_flops`` is the
FP16-accumulate tensor peak, which is what llama.cpp's CUDA kernels use for
prefill; workstation and datacenter cards run FP16 and FP32 accumulate at the
same rate.  Apple and AMD figures are the shader FP16 peak (no tensor units on
Apple; RDNA3's figure counts dual issue).

Memory sizes are GiB (``mem_gib`` × 2**30): vendors print "24 GB" for 24 GiB of
VRAM or unified memory, and NVML reports 24,576 MiB for an RTX 3090. Bandwidth and
FLOPS are decimal (GB/s = 10**9 bytes/s), as vendors and the roofline use them.

Names are what NVML (NVIDIA), rocm-smi / the driver (AMD) and
``sysctl machdep.cpu.brand_string`` (Apple) report; :func:`match_gpu` maps such
a name onto a row (sim/'s "Simulated NVIDIA ..." names too, for demo mode).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

GB = 1e9  # bandwidth is decimal: GB/s
GIB = 2**30  # memory sizes are binary: a "24 GB" card holds 24 GiB (NVML: 24,576 MiB)
TFLOPS = 1e12


@dataclass(frozen=True)
class HardwareSpec:
    key: str  # short id, e.g. "rtx-4090"
    name: str  # as NVML or the OS reports it, e.g. "NVIDIA GeForce RTX 4090"
    vendor: str  # "nvidia" | "amd" | "apple" | "cpu"
    memory_bytes: float
    bandwidth_bytes_s: float
    fp16_flops: float  # dense, no sparsity
    # Starting efficiency factors (docs/physics.md §5): fraction of the ceiling reached in practice.
    eta_bw_quant: float  # decode, 4-6 bit weights
    eta_bw_f16: float  # decode, F16/Q8 weights
    eta_compute: float  # prefill
    derived: bool = False  # True when a figure is derived, not published
    laptop: bool = False  # a laptop part: a different chip from the desktop card of the same number
    gpu_cores: int | None = None  # Apple: GPU core count where variants differ
    aliases: tuple[str, ...] = ()  # other names the same part reports
    note: str = ""


def _nv(
    key: str,
    name: str,
    mem_gib: float,
    bw_gbs: float,
    tflops: float,
    derived: bool = False,
    *,
    laptop: bool = False,
    aliases: tuple[str, ...] = (),
    note: str = "",
) -> HardwareSpec:
    return HardwareSpec(
        key,
        name,
        "nvidia",
        mem_gib * GIB,
        bw_gbs * GB,
        tflops * TFLOPS,
        0.70,
        0.82,
        0.45,
        derived,
        laptop=laptop,
        aliases=aliases,
        note=note,
    )


def _apple(
    key: str, name: str, mem_gib: float, bw_gbs: float, tflops: float, big: bool, cores: int | None = None
) -> HardwareSpec:
    # Apple Max/Ultra reach less of their bandwidth on 4-bit weights than base/Pro chips.
    eta_q = 0.5 if big else 0.75
    return HardwareSpec(key, name, "apple", mem_gib * GIB, bw_gbs * GB, tflops * TFLOPS, eta_q, 0.75, 0.70, True, gpu_cores=cores)


def _amd(key: str, name: str, mem_gib: float, bw_gbs: float, tflops: float, derived: bool = False) -> HardwareSpec:
    # No AMD efficiencies are published (docs/physics.md §5); these are our starting guess (ROCm/Vulkan llama.cpp
    # reaches a little less of the ceiling than CUDA). calibrate() replaces them with the user's own.
    return HardwareSpec(
        key,
        name,
        "amd",
        mem_gib * GIB,
        bw_gbs * GB,
        tflops * TFLOPS,
        0.65,
        0.75,
        0.35,
        derived,
        note="efficiency factors are a starting guess",
    )


SPECS: tuple[HardwareSpec, ...] = (
    # --- GeForce 20 (Turing): 128 FP16 FLOP/clock per tensor core at boost clock.
    _nv("rtx-2060", "NVIDIA GeForce RTX 2060", 6, 336, 51.6, derived=True),
    _nv("rtx-2060-super", "NVIDIA GeForce RTX 2060 SUPER", 8, 448, 57.4, derived=True),
    _nv("rtx-2070", "NVIDIA GeForce RTX 2070", 8, 448, 59.7, derived=True),
    _nv("rtx-2070-super", "NVIDIA GeForce RTX 2070 SUPER", 8, 448, 72.5, derived=True),
    _nv("rtx-2080", "NVIDIA GeForce RTX 2080", 8, 448, 80.5, derived=True),
    _nv("rtx-2080-super", "NVIDIA GeForce RTX 2080 SUPER", 8, 496, 89.2, derived=True),
    _nv("rtx-2080-ti", "NVIDIA GeForce RTX 2080 Ti", 11, 616, 107.6),
    _nv("titan-rtx", "NVIDIA TITAN RTX", 24, 672, 130.5),
    # --- GeForce 30 (Ampere GA10x): 256 FP16-acc FLOP/clock per tensor core.
    _nv("rtx-3050", "NVIDIA GeForce RTX 3050", 8, 224, 36.4, derived=True),
    _nv("rtx-3060", "NVIDIA GeForce RTX 3060", 12, 360, 51, derived=True),
    _nv("rtx-3060-ti", "NVIDIA GeForce RTX 3060 Ti", 8, 448, 64.8, derived=True),
    _nv("rtx-3070", "NVIDIA GeForce RTX 3070", 8, 448, 81, derived=True),
    _nv("rtx-3070-ti", "NVIDIA GeForce RTX 3070 Ti", 8, 608, 87.0, derived=True),
    _nv("rtx-3080", "NVIDIA GeForce RTX 3080", 10, 760, 119),
    _nv("rtx-3080-12gb", "NVIDIA GeForce RTX 3080", 12, 912, 122.6, derived=True),
    _nv("rtx-3080-ti", "NVIDIA GeForce RTX 3080 Ti", 12, 912, 136.4, derived=True),
    _nv("rtx-3090", "NVIDIA GeForce RTX 3090", 24, 936, 142),
    _nv("rtx-3090-ti", "NVIDIA GeForce RTX 3090 Ti", 24, 1008, 160.0, derived=True),
    # --- GeForce 40 (Ada).
    _nv("rtx-4060", "NVIDIA GeForce RTX 4060", 8, 272, 60.5, derived=True),
    _nv("rtx-4060-ti", "NVIDIA GeForce RTX 4060 Ti", 8, 288, 88, derived=True),
    _nv("rtx-4060-ti-16gb", "NVIDIA GeForce RTX 4060 Ti", 16, 288, 88, derived=True),
    _nv("rtx-4070", "NVIDIA GeForce RTX 4070", 12, 504, 117, derived=True),
    _nv("rtx-4070-super", "NVIDIA GeForce RTX 4070 SUPER", 12, 504, 141.9, derived=True),
    _nv("rtx-4070-ti", "NVIDIA GeForce RTX 4070 Ti", 12, 504, 160.4, derived=True),
    _nv("rtx-4070-ti-super", "NVIDIA GeForce RTX 4070 Ti SUPER", 16, 672, 176.4, derived=True),
    _nv("rtx-4080", "NVIDIA GeForce RTX 4080", 16, 717, 195, derived=True),
    _nv("rtx-4080-super", "NVIDIA GeForce RTX 4080 SUPER", 16, 736, 208.9, derived=True),
    _nv("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, 330),
    _nv("rtx-4090-d", "NVIDIA GeForce RTX 4090 D", 24, 1008, 294.9, derived=True),
    # --- GeForce 50 (Blackwell): AI TOPS (FP4, sparse) ÷ 8.
    _nv("rtx-5060", "NVIDIA GeForce RTX 5060", 8, 448, 76.7, derived=True),
    _nv("rtx-5060-ti", "NVIDIA GeForce RTX 5060 Ti", 16, 448, 94.8, derived=True),
    _nv("rtx-5070", "NVIDIA GeForce RTX 5070", 12, 672, 123, derived=True),
    _nv("rtx-5070-ti", "NVIDIA GeForce RTX 5070 Ti", 16, 896, 175.8, derived=True),
    _nv("rtx-5080", "NVIDIA GeForce RTX 5080", 16, 960, 225, derived=True),
    _nv("rtx-5090", "NVIDIA GeForce RTX 5090", 32, 1792, 419, derived=True),
    # --- GeForce laptop parts (different chips; compute depends on the laptop's power limit).
    _nv("rtx-4060-laptop", "NVIDIA GeForce RTX 4060 Laptop GPU", 8, 256, 58.2, derived=True, laptop=True),
    _nv("rtx-4070-laptop", "NVIDIA GeForce RTX 4070 Laptop GPU", 8, 256, 80.2, derived=True, laptop=True),
    _nv("rtx-4080-laptop", "NVIDIA GeForce RTX 4080 Laptop GPU", 12, 432, 135.4, derived=True, laptop=True),
    _nv("rtx-4090-laptop", "NVIDIA GeForce RTX 4090 Laptop GPU", 16, 576, 171.5, derived=True, laptop=True),
    _nv("rtx-5090-laptop", "NVIDIA GeForce RTX 5090 Laptop GPU", 24, 896, 228, derived=True, laptop=True),
    # --- Workstation (full-rate FP32 accumulate; datasheet sparse figures halved).
    _nv("quadro-rtx-6000", "Quadro RTX 6000", 24, 672, 130.5),
    _nv("quadro-rtx-8000", "Quadro RTX 8000", 48, 672, 130.5),
    _nv("rtx-a2000", "NVIDIA RTX A2000", 6, 288, 31.9, derived=True, aliases=("NVIDIA RTX A2000 12GB",)),
    _nv("rtx-a4000", "NVIDIA RTX A4000", 16, 448, 76.7),
    _nv("rtx-a4500", "NVIDIA RTX A4500", 20, 640, 94.6),
    _nv("rtx-a5000", "NVIDIA RTX A5000", 24, 768, 111.1),
    _nv("rtx-a6000", "NVIDIA RTX A6000", 48, 768, 154.8),
    _nv("rtx-4000-ada", "NVIDIA RTX 4000 Ada Generation", 20, 360, 81.9, derived=True),
    _nv("rtx-5000-ada", "NVIDIA RTX 5000 Ada Generation", 32, 576, 261, derived=True),
    _nv("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 48, 960, 364.2),
    _nv(
        "rtx-pro-6000-blackwell",
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        96,
        1792,
        500,
        derived=True,
        aliases=("NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
    ),
    # --- Datacenter.
    _nv(
        "tesla-p40",
        "Tesla P40",
        24,
        347,
        47,
        note="Pascal: FP16 runs at 1/64 rate; llama.cpp uses INT8 dp4a (47 TOPS) for quantized prefill, FP32 (11.8) for F16",
    ),
    _nv("tesla-p100-pcie-16gb", "Tesla P100-PCIE-16GB", 16, 732, 18.7, note="no tensor cores: FP16 shader peak"),
    _nv("v100-sxm2-16gb", "Tesla V100-SXM2-16GB", 16, 900, 125),
    _nv("v100-sxm2-32gb", "Tesla V100-SXM2-32GB", 32, 900, 125),
    _nv("v100-pcie-16gb", "Tesla V100-PCIE-16GB", 16, 900, 112),
    _nv("v100-pcie-32gb", "Tesla V100-PCIE-32GB", 32, 900, 112),
    _nv("v100s-pcie-32gb", "Tesla V100S-PCIE-32GB", 32, 1134, 130),
    _nv("t4", "Tesla T4", 16, 320, 65),
    _nv("a10", "NVIDIA A10", 24, 600, 125),
    _nv("a40", "NVIDIA A40", 48, 696, 149.7),
    _nv("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 1555, 312),
    _nv("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 2039, 312),
    _nv("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", 40, 1555, 312),
    _nv("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", 80, 1935, 312),
    _nv("l4", "NVIDIA L4", 24, 300, 121),
    _nv("l40", "NVIDIA L40", 48, 864, 181),
    _nv("l40s", "NVIDIA L40S", 48, 864, 362),
    _nv("h100-sxm", "NVIDIA H100 80GB HBM3", 80, 3350, 989, aliases=("NVIDIA H100 SXM5 80GB",)),
    _nv("h100-pcie", "NVIDIA H100 PCIe", 80, 2000, 756),
    _nv("h100-nvl", "NVIDIA H100 NVL", 94, 3900, 835),
    _nv("gh200", "NVIDIA GH200 480GB", 96, 4000, 989, note="96 GB HBM3 variant; the 144 GB HBM3e one has 4900 GB/s"),
    _nv("h200", "NVIDIA H200", 141, 4800, 989),
    _nv("h200-nvl", "NVIDIA H200 NVL", 141, 4800, 835),
    _nv("b200", "NVIDIA B200", 180, 8000, 2250, derived=True),
    # --- AMD Radeon 7000 (RDNA3) and its workstation twin: AMD's peak FP16 (dual issue).
    _amd("rx-7600", "AMD Radeon RX 7600", 8, 288, 43.5, derived=True),
    _amd("rx-7600-xt", "AMD Radeon RX 7600 XT", 16, 288, 45.1, derived=True),
    _amd("rx-7700-xt", "AMD Radeon RX 7700 XT", 12, 432, 70.3, derived=True),
    _amd("rx-7800-xt", "AMD Radeon RX 7800 XT", 16, 624, 74.6),
    _amd("rx-7900-gre", "AMD Radeon RX 7900 GRE", 16, 576, 92.0),
    _amd("rx-7900-xt", "AMD Radeon RX 7900 XT", 20, 800, 103.0),
    _amd("rx-7900-xtx", "AMD Radeon RX 7900 XTX", 24, 960, 122.8),
    _amd("radeon-pro-w7900", "AMD Radeon PRO W7900", 48, 864, 122.6),
    # --- Apple Silicon: bandwidth published, FLOPS derived. The first row of a chip is the
    # default when the GPU core count is unknown; core variants are listed where bandwidth differs.
    _apple("m1", "Apple M1", 16, 68.25, 2.6, big=False, cores=8),
    _apple("m1-7c", "Apple M1", 16, 68.25, 2.29, big=False, cores=7),
    _apple("m1-pro", "Apple M1 Pro", 32, 200, 5.2, big=False, cores=16),
    _apple("m1-pro-14c", "Apple M1 Pro", 32, 200, 4.6, big=False, cores=14),
    _apple("m1-max", "Apple M1 Max", 64, 400, 10.4, big=True, cores=32),
    _apple("m1-max-24c", "Apple M1 Max", 64, 400, 7.8, big=True, cores=24),
    _apple("m1-ultra", "Apple M1 Ultra", 128, 800, 21, big=True, cores=64),
    _apple("m1-ultra-48c", "Apple M1 Ultra", 128, 800, 15.7, big=True, cores=48),
    _apple("m2", "Apple M2", 24, 100, 3.6, big=False, cores=10),
    _apple("m2-pro", "Apple M2 Pro", 32, 200, 6.8, big=False, cores=19),
    _apple("m2-max", "Apple M2 Max", 96, 400, 13.6, big=True, cores=38),
    _apple("m2-ultra", "Apple M2 Ultra", 192, 800, 27.2, big=True, cores=76),
    _apple("m2-ultra-60c", "Apple M2 Ultra", 192, 800, 21.5, big=True, cores=60),
    _apple("m3", "Apple M3", 24, 100, 4, big=False, cores=10),
    _apple("m3-pro", "Apple M3 Pro", 36, 150, 7, big=False, cores=18),
    _apple("m3-max", "Apple M3 Max", 128, 400, 16, big=True, cores=40),
    _apple("m3-max-30c", "Apple M3 Max", 96, 300, 12, big=True, cores=30),
    _apple("m3-ultra", "Apple M3 Ultra", 512, 819, 33, big=True, cores=80),
    _apple("m3-ultra-60c", "Apple M3 Ultra", 256, 819, 24.8, big=True, cores=60),
    _apple("m4", "Apple M4", 32, 120, 4.3, big=False, cores=10),
    _apple("m4-pro", "Apple M4 Pro", 64, 273, 9, big=False, cores=20),
    _apple("m4-max", "Apple M4 Max", 128, 546, 18, big=True, cores=40),
    _apple("m4-max-32c", "Apple M4 Max", 36, 410, 14.4, big=True, cores=32),
    # A plain desktop: dual-channel DDR5, 8 cores with AVX2 FMA (about 1 TFLOP/s FP32).
    HardwareSpec("cpu", "Desktop CPU (dual-channel DDR5)", "cpu", 64 * GIB, 80 * GB, 1.0 * TFLOPS, 0.65, 0.75, 0.5, True),
)

BY_KEY: dict[str, HardwareSpec] = {s.key: s for s in SPECS}


def spec_by_key(key: str) -> HardwareSpec:
    """Look up a spec by its short key; KeyError names the known keys."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"unknown hardware {key!r}; known: {', '.join(sorted(BY_KEY))}") from None


# ---------------------------------------------------------------------------------------------
# Name matching

# Words that vendors and drivers add or drop without changing the part.
_NOISE = frozenset(
    {
        "nvidia",
        "geforce",
        "amd",
        "radeon",
        "apple",
        "tesla",
        "quadro",
        "graphics",
        "gpu",
        "generation",
        "edition",
        "workstation",
        "r",
        "tm",
        "with",
        "design",
        "card",
        "the",
        "simulated",
    }
)
# Form factor and memory-type words: they pick between rows of one part (H100 SXM vs PCIe).
_QUALIFIER = re.compile(r"^(sxm\d?|pcie|hbm\d?e?|oem|lhr)$")
_MEM_TOKEN = re.compile(r"^(\d+)gb$")
_LAPTOP = re.compile(r"\b(laptop|mobile|max[\s-]?q)\b")
_CORES = re.compile(r"(\d+)[\s-]*core(?:s)?[\s-]*gpu|(\d+)[\s-]*core\b|\b(\d+)c\b")


@dataclass(frozen=True)
class _Parsed:
    compact: str  # core words squeezed together, e.g. "rtx4070tisuper"
    qualifiers: frozenset[str]
    memory_gib: float | None  # a size in the name ("A100 80GB"): vendors' "GB" are GiB
    laptop: bool
    gpu_cores: int | None


def _parse(name: str) -> _Parsed:
    text = name.lower().replace("™", " ").replace("®", " ").replace("_", " ")
    # Max-Q is a laptop marker on GeForce but a 300 W desktop variant of the RTX PRO 6000 workstation card.
    laptop = bool(_LAPTOP.search(text)) and not ("workstation" in text and not re.search(r"\b(laptop|mobile)\b", text))
    # "Max-Q" is a laptop marker, not Apple's "Max": drop it before tokenising.
    text = re.sub(r"max[\s-]?q", " ", text)
    cores: int | None = None
    m = _CORES.search(text)
    if m:
        cores = int(next(g for g in m.groups() if g))
        text = text[: m.start()] + " " + text[m.end() :]
    text = re.sub(r"(\d+)\s+gb\b", r"\1gb", text)  # "12 GB" -> "12gb"
    tokens = [t for t in re.split(r"[^a-z0-9]+", text) if t]
    core: list[str] = []
    quals: set[str] = set()
    memory_gib: float | None = None
    for tok in tokens:
        mm = _MEM_TOKEN.match(tok)
        if mm:
            memory_gib = float(mm.group(1))
        elif _QUALIFIER.match(tok):
            quals.add(re.sub(r"\d", "", tok) if tok.startswith("sxm") else tok)
        elif tok in _NOISE or tok in ("laptop", "mobile"):
            continue
        else:
            core.append(tok)
    return _Parsed("".join(core), frozenset(quals), memory_gib, laptop, cores)


def _row_names(spec: HardwareSpec) -> tuple[str, ...]:
    return (spec.name, *spec.aliases)


_INDEX: dict[tuple[str, bool], list[tuple[HardwareSpec, _Parsed]]] = {}
for _spec in SPECS:
    if _spec.vendor == "cpu":
        continue
    for _n in _row_names(_spec):
        _p = _parse(_n)
        _INDEX.setdefault((_p.compact, _spec.laptop), []).append((_spec, _p))


def match_gpu(name: str, memory_bytes: float | None = None, gpu_cores: int | None = None) -> HardwareSpec | None:
    """The spec row for a name as NVML / the OS reports it, or None when no row fits.

    Robust to case, spacing, punctuation and vendor words ("NVIDIA", "GeForce", "Tesla").
    A laptop name ("... Laptop GPU", "Max-Q", "Mobile") only matches laptop rows.
    Where one name covers several rows (RTX 3080 10 GB vs 12 GB, A100 SXM vs PCIe,
    M3 Max 30 vs 40 GPU cores), ``memory_bytes`` (e.g. NVML's total memory), a memory
    size or form factor in the name, and ``gpu_cores`` (Apple) pick the row; without
    them the first row listed for that name wins.
    """
    parsed = _parse(name)
    if not parsed.compact:
        return None
    candidates = _INDEX.get((parsed.compact, parsed.laptop))
    if not candidates:
        return None
    mem_gib = memory_bytes / GIB if memory_bytes else parsed.memory_gib
    cores = gpu_cores if gpu_cores is not None else parsed.gpu_cores

    def score(item: tuple[HardwareSpec, _Parsed]) -> float:
        spec, row = item
        s = 0.0
        for q in parsed.qualifiers:
            s += 10.0 if q in row.qualifiers else -10.0
        if cores is not None and spec.gpu_cores is not None:
            s += 10.0 if spec.gpu_cores == cores else -abs(spec.gpu_cores - cores) / cores
        if mem_gib:
            s -= abs(math.log(spec.memory_bytes / GIB / mem_gib))
        return s

    best = max(candidates, key=score)  # max keeps the first of equals: table order is the default
    return best[0]


def close_matches(name: str, n: int = 5) -> list[str]:
    """Names of table rows that look like ``name``, best first, for error messages."""
    parsed = _parse(name)
    by_compact: dict[str, str] = {}
    for (compact, _laptop), rows in _INDEX.items():
        by_compact.setdefault(compact, rows[0][0].name)
    target = parsed.compact or name.lower()
    hits = difflib.get_close_matches(target, list(by_compact), n=n, cutoff=0.5)
    names = [by_compact[h] for h in hits]
    # Also offer keys that contain the digits the user typed (e.g. "4090" -> every 4090 row).
    digits = re.findall(r"\d{3,}", target)
    for spec in SPECS:
        if len(names) >= n:
            break
        if digits and any(d in spec.key.replace("-", "") for d in digits) and spec.name not in names:
            names.append(spec.name)
    return names[:n]


def resolve_spec(name_or_key: str, memory_bytes: float | None = None, gpu_cores: int | None = None) -> HardwareSpec | None:
    """A key ("rtx-4090") or a reported name ("NVIDIA GeForce RTX 4090") to its row."""
    return BY_KEY.get(name_or_key.strip().lower()) or match_gpu(name_or_key, memory_bytes, gpu_cores)


# ---------------------------------------------------------------------------------------------
# Bandwidth from NVML, cross-checked against the table

BANDWIDTH_DISAGREEMENT_FRAC = 0.05


def nvml_bandwidth_bytes_s(max_mem_clock_mhz: float, bus_width_bits: float) -> float:
    """Theoretical bandwidth from NVML's max memory clock: 2 × clock × width ÷ 8 (DDR; nvbench does the same)."""
    return 2.0 * max_mem_clock_mhz * 1e6 * bus_width_bits / 8.0


@dataclass(frozen=True)
class BandwidthChoice:
    bandwidth_bytes_s: float
    source: str  # "table" | "nvml"
    table_bytes_s: float | None
    nvml_bytes_s: float | None
    disagreement_frac: float | None  # |nvml - table| / table
    message: str | None  # set when the two disagree by more than 5%


def choose_bandwidth(spec: HardwareSpec | None, nvml_bytes_s: float | None) -> BandwidthChoice:
    """Prefer the table when it and NVML disagree by more than 5%, and say so; NVML alone when no row."""
    table = spec.bandwidth_bytes_s if spec else None
    if table is None and nvml_bytes_s is None:
        raise ValueError("no bandwidth: the GPU is not in the table and NVML gave no memory clock / bus width")
    if table is None:
        assert nvml_bytes_s is not None
        return BandwidthChoice(nvml_bytes_s, "nvml", None, nvml_bytes_s, None, None)
    if nvml_bytes_s is None:
        return BandwidthChoice(table, "table", table, None, None, None)
    diff = abs(nvml_bytes_s - table) / table
    if diff > BANDWIDTH_DISAGREEMENT_FRAC:
        assert spec is not None
        msg = (
            f"NVML's memory clock and bus width give {nvml_bytes_s / GB:.0f} GB/s but the datasheet says "
            f"{table / GB:.0f} GB/s for the {spec.name} ({diff:.0%} apart); using the datasheet figure"
        )
        return BandwidthChoice(table, "table", table, nvml_bytes_s, diff, msg)
    return BandwidthChoice(nvml_bytes_s, "nvml", table, nvml_bytes_s, diff, None)


# ---------------------------------------------------------------------------------------------
# Apple: recognise the chip from `sysctl -n machdep.cpu.brand_string`

_APPLE_CHIP = re.compile(r"\bapple\s+(m[1-9])(?:\s+(pro|max|ultra))?\b", re.IGNORECASE)


def apple_chip_name(brand_string: str) -> str | None:
    """Normalise a macOS CPU brand string ("Apple M2 Ultra") to the table's name, or None if not Apple Silicon."""
    m = _APPLE_CHIP.search(brand_string)
    if not m:
        return None
    chip = m.group(1).upper()
    tier = f" {m.group(2).capitalize()}" if m.group(2) else ""
    return f"Apple {chip}{tier}"


def apple_gpu_cores_from_system_profiler(report: object) -> int | None:
    """GPU core count from ``system_profiler SPDisplaysDataType -json`` (``sppci_cores``), or None."""
    if not isinstance(report, dict):
        return None
    entries = report.get("SPDisplaysDataType")
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        model = str(entry.get("sppci_model", ""))
        cores = entry.get("sppci_cores")
        if model.lower().startswith("apple") and cores is not None:
            try:
                n = int(str(cores).strip())
            except ValueError:
                continue
            if 1 <= n <= 1024:
                return n
    return None

"""Numbers as people read them, for the explainer's sentences. Units convert only here."""

from __future__ import annotations


def tok_s(rate: float) -> str:
    """1234.5 -> "1,234 tok/s"; 56.78 -> "56.8 tok/s"; 3.456 -> "3.46 tok/s"."""
    return f"{num(rate)} tok/s"


def num(x: float) -> str:
    """Three significant figures or so, thousands separated: 12,345 · 123 · 12.3 · 1.23 · 0.123."""
    ax = abs(x)
    if ax >= 100:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def count(n: int | float) -> str:
    return f"{round(n):,}"


def secs(s: float) -> str:
    """0.0123 -> "12 ms"; 1.234 -> "1.23 s"; 75 -> "75.0 s"."""
    if abs(s) < 1:
        return f"{s * 1000:.0f} ms" if abs(s) >= 0.01 else f"{s * 1000:.1f} ms"
    return f"{s:.2f} s" if abs(s) < 10 else f"{s:.1f} s"


def duration_ms(x_ms: float) -> str:
    """A duration given in milliseconds, as milliseconds."""
    return f"{x_ms:.0f} ms" if abs(x_ms) >= 10 else f"{x_ms:.1f} ms"


def mib(bytes_: float) -> str:
    """Binary mebibytes, as llama.cpp's runner prints its buffers: 6620950036 -> "6,314 MiB"."""
    return f"{bytes_ / 2**20:,.0f} MiB"


def gb(bytes_: float) -> str:
    """Decimal gigabytes, as ``ollama ps`` and vendors print them: 4.92e9 -> "4.92 GB", 512e6 -> "512 MB"."""
    g = bytes_ / 1e9
    if abs(g) >= 100:
        return f"{g:.0f} GB"
    if abs(g) >= 10:
        return f"{g:.1f} GB"
    if abs(g) >= 1:
        return f"{g:.2f} GB"
    if abs(bytes_) >= 1e6:
        return f"{bytes_ / 1e6:.0f} MB"
    return f"{bytes_ / 1e3:.0f} kB"


def gb_s(bytes_s: float) -> str:
    return f"{bytes_s / 1e9:,.0f} GB/s"


def tflops(flops: float) -> str:
    return f"{flops / 1e12:,.1f} TFLOP/s" if flops < 100e12 else f"{flops / 1e12:,.0f} TFLOP/s"


def pct(frac: float) -> str:
    return f"{frac * 100:.0f}%"


def times(ratio: float) -> str:
    """How many times: 33.6 -> "34×", 2.35 -> "2.4×"."""
    return f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.1f}×"

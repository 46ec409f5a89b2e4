"""pages.shared.fmt: one units convention on every page (GB = 10^9, integers, ms below 1 s, "—" for unknown)."""

from __future__ import annotations

from pages.shared import fmt


def test_bytes_in_gb_as_ollama_ps_prints_them() -> None:
    assert fmt.gb(9.8e9) == "9.80 GB" and fmt.gb(42 * 1024**3) == "45.1 GB" and fmt.gb(512e6) == "512 MB"
    assert fmt.gb(None) == "—"


def test_integers_and_unknowns() -> None:
    assert fmt.count(8.0) == "8" and fmt.count(8808) == "8,808" and fmt.count(None) == "—"
    assert fmt.rate(None) == "—" and fmt.seconds(None) == "—"


def test_durations() -> None:
    assert fmt.seconds(0.034) == "34 ms" and fmt.seconds(0.0004) == "0.4 ms"
    assert fmt.seconds(3.2) == "3.20 s" and fmt.seconds(42.0) == "42.0 s"
    assert fmt.seconds(300.0) == "5 min" and fmt.seconds(305.0) == "5 min 05 s"
    assert fmt.seconds(3600.0) == "1 h" and fmt.seconds(3720.0) == "1 h 02 min"

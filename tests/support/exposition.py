"""Prometheus text exposition read back for the tests' checks (the collector only writes it)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_exposition(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Read text exposition back into {(sample name, sorted labels): value} with prometheus_client's parser."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out

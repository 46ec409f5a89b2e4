"""The slot count's last source, OLLAMA_NUM_PARALLEL from Ollama's start line: only a plain count in reason counts
(the log is text anyone who reaches Ollama can add lines to)."""

from __future__ import annotations

import pytest

from pages.shared.slot_count import MAX_SLOTS, num_parallel_setting
from store.tables import OllamaSettingRow


def row(value: str, ts: float = 1.0, name: str = "OLLAMA_NUM_PARALLEL") -> OllamaSettingRow:
    return OllamaSettingRow(ts, name, value, "Ollama's start line (server config)")


@pytest.mark.parametrize("value", ["0", "", "-1", "2.5", "１", str(MAX_SLOTS + 1), "9" * 400])
def test_no_count_from_an_odd_value(value: str) -> None:
    assert num_parallel_setting([row(value)]) is None


def test_the_newest_start_line_wins() -> None:
    assert num_parallel_setting([row("4", ts=2.0), row("1", ts=1.0), row("3", name="OLLAMA_MAX_QUEUE", ts=3.0)]) == 4
    assert num_parallel_setting([]) is None

"""--ollama-log / PHASEWATCH_OLLAMA_LOG: optional, may not exist yet, never a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.config import SettingsError, load_settings


def test_ollama_log_setting(tmp_path: Path) -> None:
    assert load_settings([], {}).ollama_log is None
    log = tmp_path / "server.log"  # Ollama creates it later: fine
    assert load_settings(["--ollama-log", str(log)], {}).ollama_log == log
    assert load_settings([], {"PHASEWATCH_OLLAMA_LOG": str(log)}).ollama_log == log
    other = tmp_path / "other.log"
    assert load_settings(["--ollama-log", str(other)], {"PHASEWATCH_OLLAMA_LOG": str(log)}).ollama_log == other
    with pytest.raises(SettingsError, match="is a folder"):
        load_settings(["--ollama-log", str(tmp_path)], {})

"""--ollama-log / PHASEWATCH_OLLAMA_LOG: optional, may not exist yet, never a folder; --ollama-journal beside it, not with it."""

from __future__ import annotations

import re
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


def test_ollama_journal_setting(tmp_path: Path) -> None:
    """--ollama-journal / PHASEWATCH_OLLAMA_JOURNAL: the systemd unit whose journal holds Ollama's log."""
    s = load_settings([], {})
    assert s.ollama_journal is None and s.journal_dir is None
    assert load_settings(["--ollama-journal", "ollama"], {}).ollama_journal == "ollama"
    assert load_settings([], {"PHASEWATCH_OLLAMA_JOURNAL": "ollama.service"}).ollama_journal == "ollama.service"
    assert load_settings(["--ollama-journal", "a"], {"PHASEWATCH_OLLAMA_JOURNAL": "b"}).ollama_journal == "a"
    s = load_settings(["--ollama-journal", "ollama"], {"PHASEWATCH_JOURNAL_DIR": str(tmp_path)})
    assert s.journal_dir == tmp_path
    assert load_settings([], {"PHASEWATCH_JOURNAL_DIR": str(tmp_path)}).journal_dir is None, "only with a unit"
    with pytest.raises(SettingsError, match=r"PHASEWATCH_JOURNAL_DIR .* is not a folder"):
        load_settings(["--ollama-journal", "ollama"], {"PHASEWATCH_JOURNAL_DIR": str(tmp_path / "none")})
    with pytest.raises(SettingsError, match=re.escape("--ollama-journal 'ollama; rm' is not a systemd unit name")):
        load_settings(["--ollama-journal", "ollama; rm"], {})
    with pytest.raises(SettingsError, match="--ollama-journal is empty"):
        load_settings(["--ollama-journal", " "], {})


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["--ollama-log", "/tmp/server.log", "--ollama-journal", "ollama"], {}, "--ollama-log and --ollama-journal"),
        (["--ollama-journal", "ollama"], {"PHASEWATCH_OLLAMA_LOG": "/tmp/x.log"}, "PHASEWATCH_OLLAMA_LOG and --ollama-journal"),
        (["--ollama-log", "/tmp/x.log"], {"PHASEWATCH_OLLAMA_JOURNAL": "ollama"}, "--ollama-log and PHASEWATCH_OLLAMA_JOURNAL"),
    ],
)
def test_log_and_journal_are_not_both_given(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"{names} are both given; Ollama's log is read from one place")):
        load_settings(argv, env)

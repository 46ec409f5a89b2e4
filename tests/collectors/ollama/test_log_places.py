"""Ollama's log read by default where each OS keeps it (issue 45): the places, the choice, sim's rotation."""

from __future__ import annotations

from pathlib import Path

from collectors.config import load_settings
from collectors.ollama.log_places import default_log, log_candidates
from sim import ollama_log


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("time=… level=INFO msg=x\n")
    return path


def test_each_os_place_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"LOCALAPPDATA": str(tmp_path / "AppData" / "Local")}
    brew = tmp_path / "opt" / "homebrew" / "bin" / "brew"
    _touch(brew)
    assert log_candidates(env, home, which=lambda _n: str(brew)) == [
        home / ".ollama" / "logs" / "server.log",  # macOS app
        tmp_path / "opt" / "homebrew" / "var" / "log" / "ollama.log",  # Homebrew, from where brew is
        tmp_path / "AppData" / "Local" / "Ollama" / "server.log",  # Windows app
    ]
    brew_env = {"HOMEBREW_PREFIX": "/usr/local"}
    assert log_candidates(brew_env, home, which=lambda _n: None)[1] == Path("/usr/local/var/log/ollama.log")
    assert default_log(env, home, which=lambda _n: None) is None  # none exists: none read (Linux: the journal)
    windows = _touch(tmp_path / "AppData" / "Local" / "Ollama" / "server.log")
    assert default_log(env, home, which=lambda _n: None) == windows
    mac = _touch(home / ".ollama" / "logs" / "server.log")
    assert default_log(env, home, which=lambda _n: None) == mac


def test_the_collector_reads_it_without_being_told(tmp_path: Path) -> None:
    home = tmp_path / "home"
    log = _touch(home / ".ollama" / "logs" / "server.log")
    base = ["--data", str(tmp_path / "data")]
    env = {"HOME": str(home)}
    assert load_settings([*base, "--ollama", "http://127.0.0.1:11434"], env).ollama_log == log
    assert load_settings([*base, "--ollama", "http://localhost:11434"], env).ollama_log == log
    other = _touch(tmp_path / "elsewhere.log")
    assert load_settings([*base, "--ollama-log", str(other)], env).ollama_log == other  # told: that one
    assert load_settings(base, {**env, "PHASEWATCH_OLLAMA_LOG": ""}).ollama_log is None  # told: none
    assert load_settings([*base, "--ollama", "http://10.1.2.3:11434"], env).ollama_log is None  # its log is there
    assert load_settings([*base, "--demo"], env).ollama_log is None  # the demo's simulator: not that Ollama's log
    journal = load_settings([*base, "--ollama-journal", "ollama"], env)
    assert journal.ollama_log is None and journal.ollama_journal == "ollama"


def test_sim_rotates_its_log_as_the_apps_do(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    for start in range(7):
        ollama_log.rotate(log)
        log.write_text(f"start {start}\n")
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["server-1.log", "server-2.log", "server-3.log", "server-4.log", "server.log"]
    assert log.read_text() == "start 6\n" and (tmp_path / "server-1.log").read_text() == "start 5\n"
    assert (tmp_path / "server-4.log").read_text() == "start 2\n"

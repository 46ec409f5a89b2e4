"""What the sidebar says when Ollama's log cannot be read, and the command that fixes it."""

from __future__ import annotations

from pathlib import Path

from collectors.ollama.log_access import (
    LOG_ACCESS_FACTS_EVERY_S,
    MEANWHILE,
    LogAccessFacts,
    has_ollama_unit,
    log_problem,
    own_group,
)


def problem(
    *,
    configured: bool = False,
    source_problem: str | None = None,
    log_file: Path | None = None,
    container: bool = False,
    unit_installed: bool = False,
    journal_readable: bool = True,
) -> str | None:
    return log_problem(
        configured=configured,
        source_problem=source_problem,
        log_file=log_file,
        container=container,
        unit_installed=unit_installed,
        journal_readable=journal_readable,
    )


def test_a_journal_this_user_cannot_read_gives_the_group_command() -> None:
    text = problem(unit_installed=True, journal_readable=False)
    assert text is not None and "`sudo usermod -aG systemd-journal $USER`" in text and "--ollama-journal ollama" in text
    assert text.endswith(MEANWHILE)
    readable = problem(unit_installed=True)
    assert readable is not None and "usermod" not in readable and "`--ollama-journal ollama`" in readable


def test_a_container_gives_docker_logs() -> None:
    text = problem(container=True, unit_installed=True)
    assert text is not None and "`docker logs -f CONTAINER > ~/ollama.log 2>&1 &`" in text and "--ollama-log" in text


def test_a_configured_source_says_its_own_problem_or_nothing() -> None:
    assert problem(configured=True, unit_installed=True) is None  # read: nothing to say
    journal = "journalctl -u ollama exited with status 1: ...; your user may not be allowed ..."
    assert problem(configured=True, source_problem=journal) == f"{journal}; {MEANWHILE}"
    denied = problem(
        configured=True, source_problem="cannot read /var/log/ollama.log: Permission denied", log_file=Path("/var/log/ollama.log")
    )
    assert denied is not None and "o+r" not in denied  # never every user: it holds every client's address
    group = own_group()
    assert f"`sudo chgrp {group} /var/log/ollama.log && sudo chmod g+r /var/log/ollama.log`" in denied


def test_nothing_to_say_without_a_unit_or_container() -> None:
    assert problem() is None


def test_the_unit_is_found_where_systemd_keeps_units(tmp_path: Path) -> None:
    assert not has_ollama_unit([tmp_path])
    (tmp_path / "ollama.service").write_text("[Service]\nExecStart=/usr/local/bin/ollama serve\n")
    assert has_ollama_unit([tmp_path / "none", tmp_path])


def test_the_facts_behind_the_advice_are_looked_up_again_after_their_interval(tmp_path: Path) -> None:
    now = [0.0]
    facts = LogAccessFacts(clock=lambda: now[0], unit_dirs=[tmp_path])
    assert not facts.unit_installed()
    (tmp_path / "ollama.service").write_text("[Unit]\n")  # a person installs Ollama's unit meanwhile
    now[0] = LOG_ACCESS_FACTS_EVERY_S - 1
    assert not facts.unit_installed()  # not looked at again yet: once a heartbeat cost a stat per place every second
    now[0] = LOG_ACCESS_FACTS_EVERY_S
    assert facts.unit_installed()

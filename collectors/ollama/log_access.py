"""Why Ollama's log is not read, and the command that fixes it, for the sidebar.

Ollama's log gives each generation's exact timings; without it, recording goes on from the runners' /slots.
Where it lives depends on the install: the systemd unit ``ollama`` writes to the journal (readable by root and
the ``systemd-journal`` and ``adm`` groups), a container to ``docker logs``, anything else to a file the user
names with ``--ollama-log``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from collectors.os_users import effective_uid, group_id, group_name

OLLAMA_UNIT = "ollama"
UNIT_DIRS = (Path("/etc/systemd/system"), Path("/lib/systemd/system"), Path("/usr/lib/systemd/system"))
JOURNAL_GROUPS = ("systemd-journal", "adm", "wheel")  # journald lets these read the system journal
MEANWHILE = "recording goes on from the runners' /slots meanwhile"
# The heartbeat (once a second) says why the log is not read; what that rests on changes when a person installs
# Ollama's unit or changes groups, not from one second to the next: looked up at most this often.
LOG_ACCESS_FACTS_EVERY_S = 30.0


def has_ollama_unit(unit_dirs: Iterable[Path] = UNIT_DIRS) -> bool:
    """Whether Ollama is installed as a systemd unit here (its install script writes ollama.service)."""
    return any((d / f"{OLLAMA_UNIT}.service").is_file() for d in unit_dirs)


class LogAccessFacts:
    """``has_ollama_unit()`` and ``can_read_journal()``, each looked up again at most every ``every_s``."""

    def __init__(
        self,
        every_s: float = LOG_ACCESS_FACTS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        unit_dirs: Iterable[Path] = UNIT_DIRS,
    ) -> None:
        self._every_s = every_s
        self._clock = clock
        self._unit_dirs = tuple(unit_dirs)
        self._at_s: float | None = None
        self._unit = self._journal = False

    def _refresh(self) -> None:
        now_s = self._clock()
        if self._at_s is None or now_s - self._at_s >= self._every_s:
            self._unit, self._journal, self._at_s = has_ollama_unit(self._unit_dirs), can_read_journal(), now_s

    def unit_installed(self) -> bool:
        self._refresh()
        return self._unit

    def journal_readable(self) -> bool:
        self._refresh()
        return self._journal


def can_read_journal() -> bool:
    """Whether this user may read the system journal: root, or a member of one of ``JOURNAL_GROUPS``."""
    uid = effective_uid()
    if uid is None:
        return False  # no POSIX users (Windows): no journal either
    if uid == 0:
        return True
    mine = set(os.getgroups()) | {os.getegid()}
    return any(group_id(name) in mine for name in JOURNAL_GROUPS)


def own_group() -> str:
    """The name of this process's group (the one to let read Ollama's log), or its number when it has no name."""
    getegid = getattr(os, "getegid", None)
    if getegid is None:
        return "Users"  # Windows: no POSIX groups; its local users' group
    gid = getegid()
    return group_name(gid) or str(gid)


def log_problem(
    *,
    configured: bool,
    source_problem: str | None,
    log_file: Path | None,
    container: bool,
    unit_installed: bool,
    journal_readable: bool,
    reader_group: str | None = None,
) -> str | None:
    """Why Ollama's log is not read, with what to do; None when it is read, or nothing better can be said.

    ``configured``: --ollama-log (``log_file``) or --ollama-journal was given (``source_problem``: why it cannot
    be read now; the journal's own texts already say what to do). A log file this user may not read: let its group
    read it (``reader_group``, this process's own by default), never every user: it holds every client's address
    and what the runners print of their requests.
    """
    if configured:
        if source_problem and log_file is not None and "ermission denied" in source_problem:
            group = reader_group or own_group()
            return (
                f"{source_problem}: let this user's group read it, not every user (it holds every client's address): "
                f"`sudo chgrp {group} {log_file} && sudo chmod g+r {log_file}`; {MEANWHILE}"
            )
        return f"{source_problem}; {MEANWHILE}" if source_problem else None
    if container:
        return (
            "Ollama runs in a container: its log is `docker logs CONTAINER`. To have it read, copy it to a file "
            "(`docker logs -f CONTAINER > ~/ollama.log 2>&1 &`) and start the collector with "
            f"`--ollama-log ~/ollama.log`; {MEANWHILE}"
        )
    if unit_installed and not journal_readable:
        return (
            "Ollama's log is in the system journal (unit ollama), which this user cannot read: "
            "`sudo usermod -aG systemd-journal $USER`, log in again, then start the collector with "
            f"`--ollama-journal ollama`; {MEANWHILE}"
        )
    if unit_installed:
        return (
            f"Ollama's log (the journal of unit ollama) is not read: start the collector with "
            f"`--ollama-journal ollama`; {MEANWHILE}"
        )
    return None

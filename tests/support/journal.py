"""Real systemd journal files for the journal tests, written by ``systemd-journal-remote`` from journal export format.

journald cannot run here (no systemd as PID 1), but its file format can: ``systemd-journal-remote`` writes
entries given in export format (``man systemd-journal-remote``) into a ``.journal`` file, and each run
appends to the file it is given, which a ``journalctl -D DIR --follow`` sees as journald's writes.
Where ``systemd-journal-remote`` or ``journalctl`` is missing these tests skip, and fail under ``CI`` or
``PHASEWATCH_REQUIRE_JOURNAL=1`` (scripts/test.sh installs Debian's package and sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

_JOURNAL_REMOTE = ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote")


def require_journal_tools() -> str:
    """The path of systemd-journal-remote (journalctl must be on PATH too); skip, or fail under CI."""
    remote = next((p for p in _JOURNAL_REMOTE if os.access(p, os.X_OK)), None) or shutil.which("systemd-journal-remote")
    missing = [
        name for name, path in (("systemd-journal-remote", remote), ("journalctl", shutil.which("journalctl"))) if not path
    ]
    if missing:
        message = f"{' and '.join(missing)} not installed (apt-get install systemd-journal-remote)"
        if os.environ.get("CI") or os.environ.get("PHASEWATCH_REQUIRE_JOURNAL") == "1":
            pytest.fail(message)  # CI must run these tests, never skip them
        pytest.skip(message)
    assert remote is not None
    return remote


Field = str | bytes


def now_us() -> int:
    return time.time_ns() // 1000


class JournalFiles:
    """One ``.journal`` file in ``folder``; ``append`` writes entries to it (one boot, monotonic time rising)."""

    def __init__(self, folder: Path, name: str = "ollama") -> None:
        self.remote = require_journal_tools()
        self.folder = folder
        self.path = folder / f"{name}.journal"
        self.boot_id = uuid.uuid4().hex
        self._monotonic_us = 1_000_000

    def append(self, entries: Sequence[Mapping[str, Field | int]]) -> None:
        """Each entry: fields (``MESSAGE``, ``_SYSTEMD_UNIT``, ...) and ``__REALTIME_TIMESTAMP`` (µs since the epoch,
        now if absent). A bytes value is written in export format's binary form (any bytes, e.g. not UTF-8)."""
        out = bytearray()
        for entry in entries:
            self._monotonic_us += 1000
            fields: dict[str, Field | int] = {
                "__REALTIME_TIMESTAMP": now_us(),
                "__MONOTONIC_TIMESTAMP": self._monotonic_us,
                "_BOOT_ID": self.boot_id,
                **entry,
            }
            for key, value in fields.items():
                if isinstance(value, bytes):
                    out += key.encode() + b"\n" + len(value).to_bytes(8, "little") + value + b"\n"
                else:
                    text = str(value)
                    assert "\n" not in text, "a text field is one line; give bytes for more"
                    out += f"{key}={text}\n".encode()
            out += b"\n"
        r = subprocess.run(
            [self.remote, f"--output={self.path}", "-"], input=bytes(out), capture_output=True, timeout=60, check=False
        )
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        assert f"writing {len(entries)} entries".encode() in r.stderr, r.stderr.decode(errors="replace")


def unit_entry(message: Field, unit: str = "ollama.service", ts_us: int | None = None) -> dict[str, Field | int]:
    entry: dict[str, Field | int] = {"_SYSTEMD_UNIT": unit, "MESSAGE": message}
    if ts_us is not None:
        entry["__REALTIME_TIMESTAMP"] = ts_us
    return entry

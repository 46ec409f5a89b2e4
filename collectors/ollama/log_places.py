"""Where Ollama writes its log on each OS, when it runs as the desktop app or a package manager's service.

* macOS app (and ``ollama serve`` started by hand on macOS): ``~/.ollama/logs/server.log``, renamed to
  ``server-1.log`` (the older ones shifted, 5 kept) at each server start;
* Homebrew's service (``brew services start ollama``): ``$(brew --prefix)/var/log/ollama.log``;
* Windows app: ``%LOCALAPPDATA%\\Ollama\\server.log``, rotated the same way.

Linux's service writes to the journal instead (``--ollama-journal ollama``); nothing here is looked for there
unless the files exist. The first of these files that exists is the default of ``--ollama-log``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path


def homebrew_prefix(env: Mapping[str, str], which: Callable[[str], str | None] = shutil.which) -> Path | None:
    """Homebrew's prefix: ``$HOMEBREW_PREFIX`` (its shell setup exports it), else the folder above ``brew``'s bin
    (``/opt/homebrew/bin/brew`` → ``/opt/homebrew``), without running it; None without Homebrew."""
    if env.get("HOMEBREW_PREFIX"):
        return Path(env["HOMEBREW_PREFIX"])
    brew = which("brew")
    return Path(brew).resolve().parent.parent if brew else None


def log_candidates(env: Mapping[str, str], home: Path, which: Callable[[str], str | None] = shutil.which) -> list[Path]:
    """Where Ollama's log may be, in the order looked at."""
    out = [home / ".ollama" / "logs" / "server.log"]
    prefix = homebrew_prefix(env, which)
    if prefix is not None:
        out.append(prefix / "var" / "log" / "ollama.log")
    if env.get("LOCALAPPDATA"):
        out.append(Path(env["LOCALAPPDATA"]) / "Ollama" / "server.log")
    return out


def default_log(env: Mapping[str, str], home: Path, which: Callable[[str], str | None] = shutil.which) -> Path | None:
    """The first of ``log_candidates`` that is a file; None when none is."""
    return next((path for path in log_candidates(env, home, which) if path.is_file()), None)

"""A Python shaped like macOS's and Windows' on this Linux machine: POSIX-only parts taken away (issue 45).

    env = stripped_env()          # PYTHONPATH starts with a folder holding the sitecustomize below
    subprocess.run([sys.executable, "-m", "collectors", ...], env=env)

In that interpreter:

* ``pwd``, ``grp``, ``fcntl``, ``resource`` and ``uvloop`` cannot be imported (ModuleNotFoundError, as on
  Windows, where none of them exists) except by psutil (see below);
* ``os.O_NOFOLLOW``, ``os.O_DIRECTORY``, ``os.pwrite``, ``os.geteuid`` are missing (Windows has none of them);
* ``loop.add_signal_handler`` raises NotImplementedError (Windows' event loops do);
* ``open()`` of ``/proc/net/*`` raises PermissionError (macOS and Windows have no /proc) for the product's own code.
  psutil is let through, for both: it is built per OS (on macOS and Windows it asks the kernel through libproc or
  the IP helper API, on Linux it imports ``resource`` and reads /proc/net itself), so what psutil can tell here
  stands for what the OS tells it there.

What cannot be taken away here (msvcrt, SIGBREAK, Windows paths) is beyond this harness.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

BLOCKED_MODULES = ("pwd", "grp", "fcntl", "resource", "uvloop")
REMOVED_OS_NAMES = ("O_NOFOLLOW", "O_DIRECTORY", "pwrite", "geteuid")
STRIPPED_MARK = "PHASEWATCH_STRIPPED_PYTHON"  # set in the stripped interpreter's environment: a child can check it

SITECUSTOMIZE = f'''
"""Injected by tests/support/stripped_python.py: take POSIX-only parts out of this interpreter."""
import asyncio
import asyncio.unix_events
import builtins
import importlib.abc
import io
import os
import re
import sys

_BLOCKED = {BLOCKED_MODULES!r}


def _from_psutil():
    """psutil is the OS's own view (it is built per OS; on Linux it needs resource and pwd itself)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("psutil"):
            return True
        frame = frame.f_back
    return False


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED and not _from_psutil():
            raise ModuleNotFoundError(f"No module named {{name!r}} (stripped Python)", name=name)
        return None


sys.meta_path.insert(0, _Blocker())
for _name in list(sys.modules):
    if _name.split(".")[0] in _BLOCKED:
        del sys.modules[_name]
_real_import = builtins.__import__


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    # Once psutil has imported one, it sits in sys.modules, which the finder above never sees again.
    importer = (globals or {{}}).get("__name__", "") or ""
    if level == 0 and name.split(".")[0] in _BLOCKED and not importer.startswith("psutil"):
        raise ModuleNotFoundError(f"No module named {{name!r}} (stripped Python)", name=name)
    return _real_import(name, globals, locals, fromlist, level)


builtins.__import__ = _guarded_import
for _name in {REMOVED_OS_NAMES!r}:
    if hasattr(os, _name):
        delattr(os, _name)


def _no_signal_handler(self, sig, callback, *args):
    raise NotImplementedError


asyncio.unix_events._UnixSelectorEventLoop.add_signal_handler = _no_signal_handler

_real_open = builtins.open


def _guarded_open(file, *args, **kwargs):
    if isinstance(file, (str, bytes, os.PathLike)):
        text = os.fsdecode(os.fspath(file))
        if text.startswith("/proc/net/") or (text.startswith("/proc/") and "/net/" in text[6:]):
            if not _from_psutil():
                raise PermissionError(13, "Permission denied (stripped Python: no /proc/net)", text)
    return _real_open(file, *args, **kwargs)


builtins.open = _guarded_open
io.open = _guarded_open
os.environ["{STRIPPED_MARK}"] = "1"
'''


def site_dir(root: Path) -> Path:
    """A folder holding the sitecustomize that strips the interpreter (written once per ``root``)."""
    folder = root / "stripped-site"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def stripped_env(root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python (``sys.executable``) is stripped; the repository stays importable."""
    env = dict(os.environ if base is None else base)
    repo = str(Path(__file__).resolve().parents[2])
    parts = [str(site_dir(root)), repo, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


PYTHON = sys.executable


def listen_address(log_path: Path) -> str | None:
    """The proxy's address from a collector's log ("recording on HOST:PORT"). A test reads it there, not from the
    lock: the stripped collector locks with ``os.lockf``, which this test's own Python (``flock``) does not see, as
    no two OSes' collectors ever share a data folder."""
    match = re.search(r"recording on (\S+:\d+) for", log_path.read_text(errors="replace"))
    return match.group(1) if match else None
